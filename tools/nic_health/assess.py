"""Judging: two snapshots of a port or interface -> a reading with its window changes and problems.

Rules and actions come from knowledge/data/nic_health.toml; every finding names its counter, its change
and the window, so a reader can check it.
"""

from __future__ import annotations

from ..engine.data import load_data
from ..engine.spec import worst
from ..shared.actions import HealthFinding, verdict_of, worst_action
from .models import Judged, NetdevReading, PortReading


def rules() -> dict:
    return load_data("nic_health")


def changes(before: dict[str, int], after: dict[str, int]) -> tuple[dict[str, int], list[str]]:
    """({counter: increase} for counters that grew, [counters that went back]). A counter that goes back was
    cleared (perfquery -R, ethtool reset), or the driver reloaded, or a 64-bit counter wrapped: reported as
    such, never read as a huge or negative error count."""
    grew, went_back = {}, []
    for name, end in after.items():
        start = before.get(name)
        if start is None or end == start:
            continue
        if end < start:
            went_back.append(f"{name} {start} -> {end}")
        else:
            grew[name] = end - start
    return grew, went_back


def _finish(reading: Judged) -> Judged:
    reading.action = worst_action(p.action for p in reading.problems)
    reading.verdict = verdict_of(reading.action)
    return reading


def _window_text(window_s: float) -> str:
    return f"in the {window_s:g} s window"


def judge_port(before: dict, after: dict, window_s: float) -> PortReading:
    table = rules()
    counters = {k: v for k, v in after["counters"].items() if k in table["rdma_counter"]}
    grew, went_back = changes(before.get("counters", {}), after["counters"])
    reading = PortReading(**{k: after[k] for k in ("device", "port", "state", "phys_state", "rate", "rate_gbits",
                                                    "link_layer", "gids", "pci", "fw_ver")},
                          counters=counters, window=grew, resets=went_back)
    subject = reading.subject
    for name, rule in table["rdma_counter"].items():
        value = counters.get(name)
        if value is not None and value >= 2 ** rule["bits"] - 1:
            reading.saturated.append(name)
            reading.problems.append(HealthFinding(
                subject=subject, action="monitor", code=f"ib_{name}_saturated", source="sysfs",
                text=f"{name} is stuck at its maximum {value} ({rule['bits']}-bit counter): the true count is at "
                     f"least that and new errors no longer show; clear it (perfquery -R) and read again"))
        if grew.get(name):
            reading.problems.append(HealthFinding(
                subject=subject, action=rule["on_rise"], code=f"ib_{name}", source="sysfs",
                text=f"{name} rose by {grew[name]} {_window_text(window_s)} (total {value}): {rule['meaning']}"))
    _judge_port_state(reading, after, table["rdma_port"])
    return _finish(reading)


def _judge_port_state(reading: PortReading, raw: dict, table: dict) -> None:
    carried = any(raw["counters"].get(k) for k in ("port_xmit_data", "port_rcv_data", "link_downed"))
    if reading.state and reading.state.upper() != "ACTIVE":
        action = table["down_after_use_action"] if carried else "none"
        why = ("it carried traffic since its counters were last cleared: a rail the node was using is gone"
               if carried else "it carried no traffic since its counters were last cleared (an unused port)")
        reading.problems.append(HealthFinding(
            subject=reading.subject, action=action, code="ib_port_not_active", source="sysfs",
            text=f"state {reading.state}, physical state {reading.phys_state or '?'}; {why}"))
    if (reading.link_layer or "").lower() == "ethernet" and reading.state == "ACTIVE" and reading.gids == 0:
        reading.problems.append(HealthFinding(
            subject=reading.subject, action=table["roce_without_gid_action"], code="roce_no_gid", source="sysfs",
            text="RoCE port with an empty GID table: no IP address on its netdev, so NCCL and perftest cannot use it"))


def judge_peers(ports: list[PortReading]) -> None:
    """An active port slower than the fastest active port of the same link layer on this node."""
    action = rules()["rdma_port"]["slower_than_peers_action"]
    for layer in {p.link_layer for p in ports}:
        active = [p for p in ports if p.link_layer == layer and p.state == "ACTIVE" and p.rate_gbits]
        best = max((p.rate_gbits for p in active), default=None)
        for p in active:
            if best and p.rate_gbits < best:
                p.problems.append(HealthFinding(
                    subject=p.subject, action=action, code="ib_rate_degraded", source="sysfs",
                    text=f"runs at {p.rate} while the fastest {layer} port here runs at {best:g} Gb/s: the link "
                         f"trained at a lower width or speed, and every ring through it runs at its rate"))
                _finish(p)


def judge_netdev(before: dict, after: dict, window_s: float) -> NetdevReading:
    table = rules()["netdev"]
    counters = {**after["stats"], **after.get("ethtool", {})}
    grew, went_back = changes({**before["stats"], **before.get("ethtool", {}),
                               "carrier_changes": before.get("carrier_changes") or 0},
                              {**counters, "carrier_changes": after.get("carrier_changes") or 0})
    reading = NetdevReading(**{k: after.get(k) for k in ("name", "kind", "pci", "source", "operstate", "carrier",
                                                         "carrier_changes", "speed_mbps", "mtu", "driver",
                                                         "firmware")},
                            admin_up=bool(after["flags"] & 1), counters=counters, window=grew, resets=went_back)
    flaps = grew.pop("carrier_changes", 0)
    if flaps:
        reading.problems.append(HealthFinding(
            subject=reading.name, action=table["carrier_change_on_rise"], code="link_flap", source=after["source"],
            text=f"{flaps} carrier changes {_window_text(window_s)} (each flap is a loss and a return of the link; "
                 f"{after.get('carrier_changes')} since the interface came up): the link is flapping now"))
    elif (reading.carrier_changes or 0) > table["carrier_changes_total_max"]:
        reading.problems.append(HealthFinding(
            subject=reading.name, action=table["carrier_changes_total_action"], code="link_flaps_total",
            source=after["source"],
            text=f"{reading.carrier_changes} carrier changes since the interface came up (more than "
                 f"{table['carrier_changes_total_max']}), none in the {window_s:g} s window: it flapped before"))
    for name, rise in sorted(grew.items()):
        reading.problems.append(HealthFinding(
            subject=reading.name, action=table["errors_on_rise"], code=f"netdev_{name}", source=after["source"],
            text=f"{name} rose by {rise} {_window_text(window_s)} (total {counters.get(name)})"))
    if reading.admin_up and reading.carrier is False and not flaps:
        reading.problems.append(HealthFinding(
            subject=reading.name, action=table["no_carrier_action"], code="no_carrier", source=after["source"],
            text="administratively up but no carrier (cable, transceiver or the switch port)"))
    return _finish(reading)


def judge_shaper(reading: NetdevReading, text: str) -> NetdevReading:
    """A traffic shaper at the root of the interface (shaping.py says what it limits)."""
    reading.problems.append(HealthFinding(subject=reading.name, action=rules()["netdev"]["shaper_action"],
                                          code="traffic_shaper", source="tc", text=text))
    _finish(reading)
    reading.verdict = worst([reading.verdict, "warn"])   # a setting to change: no action on the node, not "ok"
    return reading


def judge_totals(reading: PortReading) -> PortReading:
    """One pasted reading has no window: error counters above ibqueryerrors' threshold of zero are named, to be
    read again after a job (a total that grew months ago and one growing now look the same here)."""
    for name, rule in rules()["rdma_counter"].items():
        value = reading.counters.get(name)
        if value and name not in reading.saturated:
            reading.problems.append(HealthFinding(
                subject=reading.subject, action="monitor", code=f"ib_{name}_total", source="pasted text",
                text=f"{name} = {value} since the counters were last cleared ({rule['meaning']}); paste a second "
                     f"reading after a job, or run nic_health on the node, to see whether it grows"))
    return _finish(reading)
