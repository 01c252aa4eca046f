"""Who else uses a shared resource while we measure it: busy is not broken (issue 24).

A benchmark on a GPU another process is using, or on a CPU others keep loaded, measures the sharing,
not the device: an H200 shared with a matmul loop read 338 instead of 814 TFLOPS. Every check that
measures a shared resource records here who else was on it, and a busy figure is reported as busy
with its holders, kept out of medians and outliers, and never a drain reason.

- GPU: NVML's compute processes on each device that are not ours (this process, its children, and
  the processes `ours` accepts) and that computed (per-process SM samples, where the driver keeps them:
  an idle holder of memory is not a co-tenant), and the device's utilisation before we start. Without
  NVML: no GPU.
- CPU: others' CPU time over the measuring window = the host's busy time (psutil.cpu_times) minus
  ours; busy when it leaves less than FREE_CORES_NEEDED of a core for a single-thread probe.
  Memory pressure: /proc/pressure/memory "some avg10" (Linux PSI) above MEMORY_PRESSURE_PCT.
Process names, users and command lines of other processes are read for display and are untrusted:
they only ever make a figure "busy" (not judged), never a culprit.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

GPU_UTIL_BUSY_PCT = 10       # a GPU nobody should be using that shows more than this is in use
UTIL_SETTLE_S = 1.5          # NVML's utilisation covers the last 1/6 to 1 s: past that, it is someone else's
PROCESS_UTIL_WINDOW_S = 5.0  # per-process SM samples looked at (NVML keeps a short buffer of them)
FREE_CORES_NEEDED = 0.75     # a single-thread probe needs most of one core to itself
MEMORY_PRESSURE_PCT = 10.0   # PSI "some avg10": share of the last 10 s some task stalled on memory
TOP_HOLDERS = 3              # the busiest other processes named when the CPU was busy
HOLDER_MIN_CORES = 0.2       # ... each using at least this much of a core over the window


@dataclass
class Holder:
    pid: int
    name: str = "?"
    user: str | None = None
    gpu: int | None = None
    used_mib: float | None = None

    def sentence(self) -> str:
        where = f" on GPU {self.gpu}" if self.gpu is not None else ""
        mem = f", {self.used_mib:.0f} MiB" if self.used_mib else ""
        return f"pid {self.pid} ({self.name}, user {self.user or '?'}{mem}){where}"


@dataclass
class Occupancy:
    busy: bool = False
    why: str = ""                                       # a sentence with units when busy
    holders: list[Holder] = field(default_factory=list)
    others_cpu_cores: float | None = None
    cpus: int | None = None
    memory_pressure_pct: float | None = None

    def merge(self, other: Occupancy) -> Occupancy:
        """Busy if either was (before and after a run, say); holders of both, once each."""
        seen = {(h.pid, h.gpu) for h in self.holders}
        holders = self.holders + [h for h in other.holders if (h.pid, h.gpu) not in seen]
        why = "; ".join(w for w in (self.why, other.why) if w)
        return Occupancy(busy=self.busy or other.busy, why=why, holders=holders,
                         others_cpu_cores=other.others_cpu_cores if other.others_cpu_cores is not None else self.others_cpu_cores,
                         cpus=other.cpus or self.cpus,
                         memory_pressure_pct=other.memory_pressure_pct if other.memory_pressure_pct is not None else self.memory_pressure_pct)

    def as_dict(self) -> dict:
        return asdict(self)


def _own_pids(ours: Callable[[object], bool] | None) -> set[int]:
    """This process, its descendants, and every process `ours(proc)` accepts (with their descendants)."""
    import psutil

    me = psutil.Process()
    pids = {me.pid, *(c.pid for c in me.children(recursive=True))}
    if ours:
        for proc in psutil.process_iter():
            try:
                if ours(proc):
                    pids |= {proc.pid, *(c.pid for c in proc.children(recursive=True))}
            except (psutil.Error, OSError):
                continue
    return pids


def _describe(pid: int, gpu: int | None, used_bytes: int | None) -> Holder:
    import psutil

    h = Holder(pid=pid, gpu=gpu, used_mib=round(used_bytes / 2**20, 1) if used_bytes else None)
    try:
        p = psutil.Process(pid)
        h.name, h.user = p.name(), p.username()
    except (psutil.Error, OSError):
        h.name = "not visible here"
    return h


def others_sm_util(nv, handle, others: set[int], window_s: float = PROCESS_UTIL_WINDOW_S) -> dict[int, int] | None:
    """The highest SM utilisation (%) NVML sampled for each of `others` over the last window_s seconds.

    A process that holds GPU memory but computes nothing (a notebook, a pytest process that ran a CUDA
    test, a finished job's cache) does not slow our benchmark: the H200 run of 2026-12-01 saw an idle
    holder of 106 GiB at 2% device utilisation called "busy". Per-process samples tell the two apart.
    {} when NVML has no sample in the window (nobody computed); None where the driver keeps none."""
    since_us = int((time.time() - window_s) * 1e6)
    try:
        samples = nv.nvmlDeviceGetProcessUtilization(handle, since_us)
    except Exception as e:  # NVMLError: NOT_FOUND = no sample since then; NOT_SUPPORTED = none kept
        return {} if "not found" in str(e).lower() else None
    peak: dict[int, int] = {}
    for sample in samples:
        if sample.pid in others:
            peak[sample.pid] = max(peak.get(sample.pid, 0), int(sample.smUtil))
    return peak


def gpu_occupancy(devices: list[int] | None = None, ours: Callable[[object], bool] | None = None,
                  count_utilisation: bool = True) -> Occupancy:
    """Other processes on the GPUs (NVML) and their utilisation; not busy when NVML is absent.
    count_utilisation=False: only other processes count (right after our own work on the GPU)."""
    try:
        import pynvml as nv

        nv.nvmlInit()
    except Exception:  # no NVML binding or no driver: nothing to share
        return Occupancy()
    try:
        mine = _own_pids(ours)
        count = nv.nvmlDeviceGetCount()
        holders, reasons = [], []
        for index in devices if devices is not None else range(count):
            if not 0 <= index < count:
                continue
            handle = nv.nvmlDeviceGetHandleByIndex(index)
            procs = list(nv.nvmlDeviceGetComputeRunningProcesses(handle))
            others = [_describe(p.pid, index, getattr(p, "usedGpuMemory", None)) for p in procs if p.pid not in mine]
            active = others_sm_util(nv, handle, {h.pid for h in others}) if others else None
            if active is not None:   # the driver says who computes: idle holders of memory are not co-tenants
                others = [h for h in others if active.get(h.pid, 0) > GPU_UTIL_BUSY_PCT]
            holders += others
            util = nv.nvmlDeviceGetUtilizationRates(handle).gpu
            # Utilisation with no process visible is another container's; with one of ours on the GPU it
            # may be our own previous benchmark (NVML averages over up to a second), so it needs others.
            ours_on_it = any(p.pid in mine for p in procs)
            if count_utilisation and not others and not ours_on_it and util > GPU_UTIL_BUSY_PCT:
                time.sleep(UTIL_SETTLE_S)   # a benchmark of ours that just ended still shows: read again
                util = nv.nvmlDeviceGetUtilizationRates(handle).gpu
            if others or (count_utilisation and util > GPU_UTIL_BUSY_PCT and not ours_on_it):
                reasons.append(f"GPU {index} {util}% utilised" + (f" by {len(others)} other process(es)" if others else ""))
        return Occupancy(busy=bool(reasons), why="; ".join(reasons), holders=holders)
    finally:
        nv.nvmlShutdown()


def _memory_pressure_pct() -> float | None:
    try:
        with open("/proc/pressure/memory") as f:
            for line in f:
                if line.startswith("some "):
                    return float(dict(kv.split("=") for kv in line.split()[1:])["avg10"])
    except (OSError, KeyError, ValueError):
        return None
    return None


def _cpu_stat_path() -> str | None:
    """cpu.stat of this process's cgroup (v1 cpu controller, else v2)."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        return None
    for _, controllers, path in lines:
        if "cpu" in controllers.split(","):
            return f"/sys/fs/cgroup/cpu{path.rstrip('/')}/cpu.stat"
    v2 = [path for hid, _, path in lines if hid == "0"]
    return f"/sys/fs/cgroup{v2[0].rstrip('/')}/cpu.stat" if v2 else None


def _throttle_counts(path: str | None) -> tuple[int, int] | None:
    """(CFS periods, periods throttled) of our cgroup so far; None without a CPU limit to read."""
    try:
        with open(path or "") as f:
            stat = dict(line.split() for line in f if line.strip())
        return int(stat["nr_periods"]), int(stat["nr_throttled"])
    except (OSError, KeyError, ValueError):
        return None


def cpu_busy_reasons(others_cores: float, cpus: int, memory_pressure_pct: float | None) -> list[str]:
    """Why a single-thread CPU figure measured beside this load is busy (empty: it is not)."""
    reasons = []
    if cpus - others_cores < FREE_CORES_NEEDED:
        reasons.append(f"other processes used {others_cores:.2f} of {cpus} CPU cores while it measured")
    if memory_pressure_pct is not None and memory_pressure_pct > MEMORY_PRESSURE_PCT:
        reasons.append(f"memory pressure: tasks stalled on memory {memory_pressure_pct:.0f}% of the last 10 s")
    return reasons


class CpuWatch:
    """Others' CPU use over a with-block: `with CpuWatch(ours) as w: measure()`, then `w.occupancy`."""

    def __init__(self, ours: Callable[[object], bool] | None = None):
        self.ours = ours
        self.occupancy = Occupancy()
        self.own_limit_bound: float | None = None   # share of CFS periods our cgroup's CPU limit bound

    def _snapshot(self) -> tuple[float, dict[int, tuple[float, str, str | None]]]:
        """(CPU seconds of ours, {pid: (CPU seconds, name, user)} of every other process)."""
        import psutil

        mine, ours_s, others = _own_pids(self.ours), 0.0, {}
        for proc in psutil.process_iter(["name", "username", "cpu_times"]):
            t = proc.info.get("cpu_times")
            if t is None:
                continue
            if proc.pid in mine:
                ours_s += t.user + t.system
            else:
                others[proc.pid] = (t.user + t.system, proc.info.get("name") or "?", proc.info.get("username"))
        return ours_s, others

    @staticmethod
    def _host_busy_s() -> float:
        import psutil

        t = psutil.cpu_times()
        return sum(t) - t.idle - getattr(t, "iowait", 0.0)

    def __enter__(self) -> CpuWatch:
        self.stat_path = _cpu_stat_path()
        self.throttle0 = _throttle_counts(self.stat_path)
        self.t0, self.host0 = time.monotonic(), self._host_busy_s()
        self.ours0, self.others0 = self._snapshot()
        return self

    def __exit__(self, *exc) -> None:
        wall = max(time.monotonic() - self.t0, 1e-3)
        ours1, others1 = self._snapshot()
        host, ours = self._host_busy_s() - self.host0, ours1 - self.ours0
        used = sorted(((cpu - self.others0[pid][0], pid, name, user) for pid, (cpu, name, user) in others1.items()
                       if pid in self.others0), reverse=True)
        holders = [Holder(pid=pid, name=name, user=user) for cpu_s, pid, name, user in used[:TOP_HOLDERS]
                   if cpu_s / wall >= HOLDER_MIN_CORES]
        cpus = os.cpu_count() or 1
        others = max(0.0, (host - ours) / wall)
        pressure = _memory_pressure_pct()
        throttle1 = _throttle_counts(self.stat_path)
        if self.throttle0 and throttle1 and throttle1[0] > self.throttle0[0]:
            self.own_limit_bound = (throttle1[1] - self.throttle0[1]) / (throttle1[0] - self.throttle0[0])
        # Our own cgroup's CPU limit binding is evidence the caller reports (own_limit_bound); it does not
        # clear a busy host: with others on the cores, the limit and the sharing cannot be told apart.
        reasons = cpu_busy_reasons(others, cpus, pressure)
        self.occupancy = Occupancy(busy=bool(reasons), why="; ".join(reasons), holders=holders if reasons else [],
                                   others_cpu_cores=round(others, 2),
                                   cpus=cpus, memory_pressure_pct=pressure)
