"""Judging one GPU's reading: pure, so it is tested with readings built by hand (tests/test_gpu_health_*).

Every finding carries an action (tools/shared/actions.py). Counters that are totals since the driver loaded
are judged by their change over the sampling window (sampling.py); PCIe links against what both ends of
each link support, under load (pcie.py).
"""

from ..engine.spec import worst
from ..shared import xid
from ..shared.actions import ACTIONS, HealthFinding, verdict_of, worst_action
from .holders import judge as judge_holder

BAD_THROTTLE = {"hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown"}


def memory_findings(g) -> list[HealthFinding]:
    s, out = g.subject, []
    if g.ecc_uncorrected_volatile:
        out.append(HealthFinding(text=f"{g.ecc_uncorrected_volatile} uncorrectable ECC error(s) since the last reset: "
                                 "results on this GPU may be wrong; reset it, drain the node if they return",
                                 action="reset_gpu", subject=s, code="ecc_dbe", source="nvml"))
    if g.remap_failure:
        out.append(HealthFinding(text="row remapping failed (the GPU could not map out a bad row): drain the node "
                                 "and replace the GPU", action="replace", subject=s, code="remap_failure", source="nvml"))
    if g.remap_pending:
        out.append(HealthFinding(text="a row remap is pending: reset the GPU (or reboot) to apply it before new jobs",
                                 action="reset_gpu", subject=s, code="remap_pending", source="nvml"))
    if g.retired_pages_pending:
        out.append(HealthFinding(text="page retirement is pending: reset the GPU to apply it", action="reset_gpu",
                                 subject=s, code="retire_pending", source="nvml"))
    if g.ecc_uncorrected_aggregate and not g.ecc_uncorrected_volatile:
        out.append(HealthFinding(text=f"{g.ecc_uncorrected_aggregate} uncorrectable ECC error(s) in this GPU's history",
                                 action="monitor", subject=s, code="ecc_history", source="nvml"))
    return out


def mode_findings(g) -> list[HealthFinding]:
    s, out = g.subject, []
    if g.ecc_enabled is False:
        out.append(HealthFinding(text="ECC is off: memory errors go undetected (datacenter GPUs run with ECC on: "
                                 "nvidia-smi -e 1, then reboot)", action="monitor", subject=s, code="ecc_off", source="nvml"))
    if g.ecc_pending is not None and g.ecc_enabled is not None and g.ecc_pending != g.ecc_enabled:
        out.append(HealthFinding(text=f"ECC mode changes to {'on' if g.ecc_pending else 'off'} at the next reboot",
                                 action="reboot_node", subject=s, code="ecc_pending", source="nvml"))
    if g.mig_pending is not None and g.mig_enabled is not None and g.mig_pending != g.mig_enabled:
        out.append(HealthFinding(text=f"MIG mode changes to {'on' if g.mig_pending else 'off'} at the next GPU reset",
                                 action="reset_gpu", subject=s, code="mig_pending", source="nvml"))
    if g.persistence_mode is False:
        out.append(HealthFinding(text="persistence mode is off: each process start re-initialises the GPU (slow first "
                                 "call, DCGM warns); nvidia-smi -pm 1 or the nvidia-persistenced service",
                                 action="none", subject=s, code="persistence_off", source="nvml"))
    if g.fabric_state and g.fabric_state != "completed":
        out.append(HealthFinding(text=f"NVSwitch fabric state is '{g.fabric_state}': Fabric Manager has not finished "
                                 "registering this GPU, CUDA jobs cannot start (check nvidia-fabricmanager)",
                                 action="drain_node", subject=s, code="fabric_state", source="nvml"))
    if g.fabric_status and g.fabric_status != "success":
        out.append(HealthFinding(text=f"NVSwitch fabric registration failed: {g.fabric_status}", action="drain_node",
                                 subject=s, code="fabric_status", source="nvml"))
    return out


def thermal_findings(g) -> list[HealthFinding]:
    s, out = g.subject, []
    if g.temperature_c is not None and g.slowdown_temperature_c and g.temperature_c >= g.slowdown_temperature_c - 5:
        out.append(HealthFinding(text=f"{g.temperature_c} °C, within 5 °C of its slowdown point "
                                 f"({g.slowdown_temperature_c} °C)", action="monitor", subject=s, code="hot", source="nvml"))
    if g.power_limit_w and g.default_power_limit_w and g.power_limit_w < 0.9 * g.default_power_limit_w:
        out.append(HealthFinding(text=f"power limit set to {g.power_limit_w:.0f} W, below the default "
                                 f"{g.default_power_limit_w:.0f} W: lower clocks under load", action="none",
                                 subject=s, code="power_limit", source="nvml"))
    if not g.clock_event_s:   # no window: fall back on the reasons active at the moment of reading
        bad = [r for r in g.throttle_reasons if r in BAD_THROTTLE]
        if bad:
            out.append(HealthFinding(text=f"clocks held down now by {', '.join(bad)}: check cooling and power delivery",
                                     action="monitor", subject=s, code="throttle_now", source="nvml"))
    return out


def xid_findings(g) -> list[HealthFinding]:
    out = []
    for seen in g.xids:
        event = xid.XidEvent(bus=xid.short_bus(g.pci_bus_id), code=seen.code, text=seen.text, previous=seen.previous)
        action, meaning = xid.judge(event, repeated=seen.count > 1)
        times = f" ({seen.count} times)" if seen.count > 1 else ""
        out.append(HealthFinding(text=f"Xid {seen.code}{times}: {seen.text} — {meaning}", action=action,
                                 subject=g.subject, code=f"xid {seen.code}", source="kernel log"))
    return out


def link_findings(g) -> list[HealthFinding]:
    """Links judged from one reading, when no window judged them (sample_s=0 or a re-judged saved result)."""
    out = []
    if not g.nvlink_links and g.nvlink_total and g.nvlink_active is not None and 0 < g.nvlink_active < g.nvlink_total:
        out.append(HealthFinding(text=f"only {g.nvlink_active} of {g.nvlink_total} NVLink links are up: GPU-GPU "
                                 "bandwidth is cut; reset the GPU, drain the node if they stay down",
                                 action="reset_gpu", subject=g.subject, code="nvlink_down", source="nvml"))
    if not g.pcie_chain and g.pcie_width and g.pcie_width_max and g.pcie_width < g.pcie_width_max:
        out.append(HealthFinding(text=f"PCIe link runs x{g.pcie_width} of x{g.pcie_width_max} (the port above was not "
                                 "read: check it with sysfs or run again with sample_s > 0)", action="monitor",
                                 subject=g.subject, code="pcie_width", source="nvml"))
    return out


def assess(g, window: list[HealthFinding] = ()) -> None:
    """Fill g.verdict, g.action and g.problems from its fields and the sampling window's findings."""
    held = [f for f in (judge_holder(g.subject, h) for h in g.holders) if f.action != "none"]
    found = (memory_findings(g) + mode_findings(g) + thermal_findings(g) + xid_findings(g) + link_findings(g)
             + list(window) + held)
    found.sort(key=lambda f: -ACTIONS.index(f.action))
    g.problems = found
    g.action = worst_action(f.action for f in found)
    app_fault = any(f.code.startswith("xid") and f.action == "none" for f in found)
    g.verdict = worst([verdict_of(f.action) for f in found] + (["warn"] if app_fault else []), default="ok")
