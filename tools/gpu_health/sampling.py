"""Counters that only mean something as a change: NVLink CRC / replay / recovery per link and clock-event
durations, read at the start and the end of a sampling window.

NVML's NVLink error counters and clock-event times are totals since the driver loaded; a total says a link
once had trouble, the change over the window says it has trouble now. CRC threshold: DCGM flags more than
100 CRC errors per second on a link (DCGM_FR_NVLINK_CRC_ERROR_THRESHOLD, NVIDIA/DCGM dcgmlib/dcgm_errors.h).
"""

import re

from ..engine.spec import Field, Record
from ..shared.accelerators import match_accelerator
from ..shared.actions import HealthFinding

CRC_PER_S_LIMIT = 100.0          # DCGM's per-link CRC rate limit (see module doc)
CLOCK_EVENT_MIN_S = 0.1          # shorter is rounding noise (DCGM#242: a "0.0 s" violation failed a suite)
HW_EVENTS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")


class NvLinkCounters(Record):
    link: int = Field(description="NVLink index on this GPU.")
    active: bool = Field(True, description="Whether the link is up.")
    replay: int | None = Field(None, description="Replay errors (retransmissions) counted on this link.")
    recovery: int | None = Field(None, description="Link recovery events counted on this link.")
    crc_flit: int | None = Field(None, description="Flit CRC errors counted on this link.")
    crc_data: int | None = Field(None, description="Data CRC errors counted on this link.")
    crc: int | None = Field(None, description="CRC errors where one count is printed for the link (pasted `nvidia-smi nvlink -e`).")
    speed_gbytes_s: float | None = Field(None, description="Link speed, GB/s (pasted `nvidia-smi nvlink -s`; None when not read).")


COUNTERS = ("replay", "recovery", "crc_flit", "crc_data", "crc")


def nvlink_deltas(before: list[NvLinkCounters], after: list[NvLinkCounters]) -> dict[int, dict[str, int]]:
    """{link: {counter: increase}} for counters that grew during the window."""
    was = {c.link: c for c in before}
    out: dict[int, dict[str, int]] = {}
    for now in after:
        old = was.get(now.link)
        if old is None:
            continue
        grew = {k: getattr(now, k) - getattr(old, k) for k in COUNTERS
                if getattr(now, k) is not None and getattr(old, k) is not None and getattr(now, k) > getattr(old, k)}
        if grew:
            out[now.link] = grew
    return out


def links_all_wired(gpu_name: str) -> bool | None:
    """Whether every NVLink of this product is wired, from knowledge/data/accelerators.toml's `interconnect`:
    True for boards on NVSwitch ("NVLink 4 (18 links)": an inactive link is down), False for bridged products
    ("NVLink 4 bridge (pairs)": H100 NVL, A100/H100 PCIe use a subset, the rest show inactive on every GPU),
    None when the product is not in the table."""
    spec = match_accelerator(gpu_name)
    interconnect = (spec or {}).get("interconnect", "")
    return False if "bridge" in interconnect else True if re.search(r"\(\d+ links", interconnect) else None


def unwired_links(names_and_links: list[tuple[str, list[NvLinkCounters]]]) -> set[int]:
    """Links inactive on every GPU of a node of bridged products: the wiring, not a fault. Empty for products
    whose links are all wired (a link inactive on every GPU of an NVSwitch board is a switch down) or unknown."""
    if len(names_and_links) < 2 or any(links_all_wired(name) is not False for name, _ in names_and_links):
        return set()
    inactive = [{c.link for c in links if not c.active} for _, links in names_and_links]
    return set.intersection(*inactive)


def judge_nvlink(subject: str, before: list[NvLinkCounters], after: list[NvLinkCounters],
                 window_s: float, unwired: set[int] = frozenset()) -> list[HealthFinding]:
    """`unwired`: links this node's product leaves unused (unwired_links), not reported as down."""
    found = []
    after = [c for c in after if c.link not in unwired]
    down = [c.link for c in after if not c.active]
    if down and len(down) < len(after):
        found.append(HealthFinding(text=f"NVLink link(s) {down} down, {len(after) - len(down)} of {len(after)} up: "
                                   "GPU-GPU bandwidth is cut; reset the GPU, drain the node if they stay down",
                                   action="reset_gpu", subject=subject, code="nvlink_down", source="nvml"))
    for link, grew in sorted(nvlink_deltas(before, after).items()):
        crc = grew.get("crc_flit", 0) + grew.get("crc_data", 0)
        rate = crc / window_s if window_s > 0 else 0.0
        text = ", ".join(f"{k} +{v}" for k, v in grew.items()) + f" in {window_s:.1f} s"
        if rate > CRC_PER_S_LIMIT:
            found.append(HealthFinding(text=f"NVLink {link}: {text} ({rate:.0f} CRC errors/s, above DCGM's 100/s): a "
                                       "bad link", action="drain_node", subject=subject, code="nvlink_crc", source="nvml"))
        elif "recovery" in grew:
            found.append(HealthFinding(text=f"NVLink {link}: {text}: the link retrained during the window",
                                       action="monitor", subject=subject, code="nvlink_recovery", source="nvml"))
        else:
            found.append(HealthFinding(text=f"NVLink {link}: {text}: errors corrected by replay; watch the rate",
                                       action="monitor", subject=subject, code="nvlink_replay", source="nvml"))
    return found


def event_seconds(before_ns: dict[str, int], after_ns: dict[str, int]) -> dict[str, float]:
    """Seconds each clock-event reason was active during the window, from NVML's cumulative ns counters."""
    return {k: round((after_ns[k] - before_ns[k]) / 1e9, 3) for k in after_ns
            if k in before_ns and after_ns[k] >= before_ns[k]}


def judge_clock_events(subject: str, seconds: dict[str, float], window_s: float) -> list[HealthFinding]:
    found = []
    for reason, s in sorted(seconds.items(), key=lambda kv: -kv[1]):
        if s < CLOCK_EVENT_MIN_S:
            continue
        share = f"{s:.1f} s of {window_s:.1f} s ({s / window_s:.0%})" if window_s > 0 else f"{s:.1f} s"
        if reason in HW_EVENTS:
            power = "power brake: the board's power supply asked for less" if "brake" in reason else \
                "hardware slowdown (thermal or power delivery)"
            found.append(HealthFinding(text=f"clocks cut by {power} for {share}: a node problem, not the job",
                                       action="drain_node", subject=subject, code=reason, source="nvml"))
        elif reason == "sw_thermal_slowdown":
            found.append(HealthFinding(text=f"clocks lowered for temperature for {share}: check cooling and airflow",
                                       action="monitor", subject=subject, code=reason, source="nvml"))
        elif reason == "sw_power_cap":
            found.append(HealthFinding(text=f"held at the power limit for {share}: normal under full load",
                                       action="none", subject=subject, code=reason, source="nvml"))
    return found
