"""One gpu_health run's readings over time: the kernel log's Xids per GPU, and the sampling window in which
NVLink counters, clock-event times and PCIe links are read at the start, during and at the end."""

import shutil
import subprocess
import time

from ..shared import xid
from ..shared.safe_read import read_tail
from .pcie import PcieHop, capped_by_parent, chain, judge as judge_pcie, nvml_bdf
from .read import attempt, clock_event_ns, nvlink_counters, pcie_replays
from .sampling import event_seconds, judge_clock_events, judge_nvlink, unwired_links
from .models import XidSeen
from ..shared.actions import HealthFinding
from .load import SmallLoad

PCIE_READINGS = 4     # readings of each PCIe chain spread over the window (flapping shows as a change)
# DCGM's pcie test fails a GPU above 80 replays while it runs (max_pcie_replays default, NVIDIA/DCGM
# nvvs/plugin_src/pcie/Pcie.cpp, commit 72fa3fe); a shorter window than DCGM's test makes this stricter.
MAX_REPLAYS = 80
KERNEL_LOG_BYTES = 20_000_000  # the end of a kernel log holds the recent Xids; older ones are history
BUSY_PCT = 30       # utilisation at which a GPU has left its idle power state (PCIe generation is judged)


def read_kernel_log() -> tuple[str, str]:
    """(text, where it came from or why it could not be read)."""
    for cmd in (["dmesg", "--ctime"], ["journalctl", "-k", "--no-pager", "-n", "20000"]):
        if not shutil.which(cmd[0]):
            continue
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        except subprocess.TimeoutExpired:
            continue
        if out.returncode == 0 and out.stdout:
            return out.stdout, f"read with `{' '.join(cmd)}`"
    for path in ("/var/log/kern.log", "/var/log/messages"):
        try:
            return read_tail(path, KERNEL_LOG_BYTES).decode("utf-8", "replace"), f"read from {path}"
        except OSError:
            continue
    return "", ("kernel log not readable (dmesg needs root or kernel.dmesg_restrict=0): Xid events not checked; "
                "run `sudo dmesg | grep -i xid` yourself")


def kernel_log(gpus, text: str) -> list:
    """Attach each GPU's Xids (counted per code, last text kept); return the NVSwitch SXid findings."""
    events = xid.parse_events(text)
    for g in gpus:
        mine = [e for e in events if e.switch is None and e.bus == xid.short_bus(g.pci_bus_id)]
        seen: dict[int, XidSeen] = {}
        for e in mine:
            s = seen.setdefault(e.code, XidSeen(code=e.code, count=0))
            s.count, s.text, s.previous = s.count + 1, e.text, e.previous if e.previous is not None else s.previous
        g.xids = list(seen.values())
    switch = {}
    for e in (e for e in events if e.switch is not None):
        key = (e.switch, e.code)
        switch[key] = (switch.get(key, (0, e))[0] + 1, e)
    out = []
    for (sw, code), (count, e) in switch.items():
        action, meaning = xid.judge(e, repeated=count > 1)
        out.append(HealthFinding(text=f"NVSwitch {sw} SXid {code}{f' ({count} times)' if count > 1 else ''}: {e.text} — "
                                 f"{meaning}", action=action, subject=f"NVSwitch {sw} ({e.bus})", code=f"sxid {code}",
                                 source="kernel log"))
    return out


def _pcie_reading(gpus) -> list[list[PcieHop]]:
    return [chain(nvml_bdf(g.pci_bus_id)) if g.pci_bus_id else [] for g in gpus]


def sample_window(nv, handles, gpus, seconds: float, with_load: bool) -> tuple[dict[int, list], str, float]:
    """Readings at the start, during and at the end of the window; returns ({gpu index: findings}, load note,
    window length). Processes are read before the load starts, so gpu_health's own load is not listed."""
    start_links = [nvlink_counters(nv, h) for h in handles]
    start_events = [clock_event_ns(nv, h) for h in handles]
    start_replays = [pcie_replays(nv, h) for h in handles]
    chains: list[list[list[PcieHop]]] = [[] for _ in gpus]
    t0 = time.monotonic()
    loader = SmallLoad([g.index for g in gpus]) if with_load and seconds > 0 else None
    note = "no load (load=false)" if not with_load else "no window (sample_s=0)" if seconds <= 0 else ""
    with (loader or _NoLoad()):
        if loader:
            note = loader.note or f"2048^3 bf16 matmuls on {len(gpus)} GPU(s) during the window"
            time.sleep(0.3)                             # the GPUs leave their idle power state within ~0.1 s
        for i in range(PCIE_READINGS if seconds > 0 else 1):
            for k, hops in enumerate(_pcie_reading(gpus)):
                chains[k].append(hops)
            if seconds > 0:
                time.sleep(seconds / PCIE_READINGS)
        window = time.monotonic() - t0
        busy = [_busy(nv, h) for h in handles]
        end_links = [nvlink_counters(nv, h) for h in handles]
        end_events = [clock_event_ns(nv, h) for h in handles]
    loaded = bool(loader and loader.running)
    if loader and loader.failed:
        note = f"the load could not start on {'; '.join(loader.failed)}: PCIe generation not judged"
    out: dict[int, list] = {}
    unwired = unwired_links([(g.name, links) for g, links in zip(gpus, end_links)])
    for k, (g, h) in enumerate(zip(gpus, handles)):
        g.nvlink_links = end_links[k]
        g.nvlink_total = len(end_links[k]) or None
        g.nvlink_active = sum(1 for c in end_links[k] if c.active) if end_links[k] else None
        g.clock_event_s = event_seconds(start_events[k], end_events[k]) if seconds > 0 else {}
        end_replay = pcie_replays(nv, h)
        g.pcie_replays = end_replay
        if start_replays[k] is not None and end_replay is not None:
            g.pcie_replays_window = end_replay - start_replays[k]
        g.pcie_chain = chains[k][-1] if chains[k] else []
        g.pcie_note = capped_by_parent(chains[k]) or ""
        out[g.index] = (judge_pcie(g.subject, chains[k], loaded and busy[k])
                        + judge_nvlink(g.subject, start_links[k], end_links[k], window, unwired)
                        + judge_clock_events(g.subject, g.clock_event_s, window)
                        + _replay_findings(g))
    return out, note, round(window, 2)


def _busy(nv, h) -> bool:
    """Whether the GPU was working at the end of the window (our load, or someone's job)."""
    util = attempt(getattr(nv, "nvmlDeviceGetUtilizationRates", None), h)
    return bool(util is not None and util.gpu >= BUSY_PCT)


def _replay_findings(g) -> list:
    if not g.pcie_replays_window:
        return []
    return [HealthFinding(text=f"{g.pcie_replays_window} PCIe replays during the window ({g.pcie_replays} in all): "
                          "the link retransmits, a signal-integrity problem (riser, seating, slot)",
                          action="drain_node" if g.pcie_replays_window > MAX_REPLAYS else "monitor", subject=g.subject,
                          code="pcie_replay", source="nvml")]


class _NoLoad:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
