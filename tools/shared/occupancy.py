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
  ours (read per process, CpuWatch); busy when it leaves less than FREE_CORES_NEEDED of a core for a
  single-thread probe, unless our own cgroup's quota bound (then the limit, not others, set the pace).
  Memory pressure: /proc/pressure/memory "some avg10" (Linux PSI) above MEMORY_PRESSURE_PCT.
Process names, users and command lines of other processes are read for display and are untrusted:
they only ever make a figure "busy" (not judged), never a culprit.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .cgroup_cpu import cpu_stat_chain
from .process_origin import origin

GPU_UTIL_BUSY_PCT = 10       # a GPU nobody should be using that shows more than this is in use
UTIL_SETTLE_S = 1.5          # NVML's utilisation covers the last 1/6 to 1 s: past that, it is someone else's
PROCESS_UTIL_WINDOW_S = 5.0  # per-process SM samples looked at (NVML keeps a short buffer of them)
FREE_CORES_NEEDED = 0.75     # a single-thread probe needs most of one core to itself
MEMORY_PRESSURE_PCT = 10.0   # PSI "some avg10": share of the last 10 s some task stalled on memory
TOP_HOLDERS = 3              # the busiest other processes named when the CPU was busy
HOLDER_MIN_CORES = 0.2       # ... each using at least this much of a core over the window
SAMPLE_S = 0.5               # every process's CPU time is read this often (about 4 ms for 125 processes)
OWN_LIMIT_BINDS = 0.5        # our cgroup throttled in this share of periods: its own quota set the pace


@dataclass
class Holder:
    pid: int
    name: str = "?"
    user: str | None = None
    gpu: int | None = None
    used_mib: float | None = None
    origin: str | None = None       # whose it is and since when (shared/process_origin.py): "SLURM job 12, started ..."

    def sentence(self) -> str:
        where = f" on GPU {self.gpu}" if self.gpu is not None else ""
        mem = f", {self.used_mib:.0f} MiB" if self.used_mib else ""
        whose = f", {self.origin}" if self.origin else ""
        return f"pid {self.pid} ({self.name}, user {self.user or '?'}{mem}{whose}){where}"


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

    h = Holder(pid=pid, gpu=gpu, used_mib=round(used_bytes / 2**20, 1) if used_bytes else None, origin=origin(pid))
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


def _throttle_counts(path: Path) -> tuple[int, int] | None:
    """(CFS periods, periods throttled) of one cgroup so far; None without a CPU limit to read."""
    try:
        with open(path) as f:
            stat = dict(line.split() for line in f if line.strip())
        return int(stat["nr_periods"]), int(stat["nr_throttled"])
    except (OSError, KeyError, ValueError):
        return None


def _throttle_snapshot(paths: list[Path]) -> dict[Path, tuple[int, int]]:
    return {path: counts for path in paths if (counts := _throttle_counts(path))}


def limit_bound_share(before: dict[Path, tuple[int, int]], after: dict[Path, tuple[int, int]]) -> float | None:
    """The largest share of CFS periods in which a cgroup of ours (or one above it) was throttled between
    two snapshots; None where no such cgroup ran a limited period."""
    shares = [(a[1] - b[1]) / (a[0] - b[0]) for path, a in after.items()
              if (b := before.get(path)) and a[0] > b[0]]
    return max(shares) if shares else None


def cpu_busy_reasons(others_cores: float, cpus: int, memory_pressure_pct: float | None) -> list[str]:
    """Why a single-thread CPU figure measured beside this load is busy (empty: it is not)."""
    reasons = []
    if cpus - others_cores < FREE_CORES_NEEDED:
        reasons.append(f"other processes used {others_cores:.2f} of {cpus} CPU cores while it measured")
    if memory_pressure_pct is not None and memory_pressure_pct > MEMORY_PRESSURE_PCT:
        reasons.append(f"memory pressure: tasks stalled on memory {memory_pressure_pct:.0f}% of the last 10 s")
    return reasons


class CpuWatch:
    """Others' CPU use over a with-block: `with CpuWatch(ours) as w: measure()`, then `w.occupancy`.

    Others' CPU = the host's busy time minus ours, where ours is read per process every SAMPLE_S: a process
    of ours that ends inside the window keeps the CPU it used up to its last read. (Reading ours only at both
    ends counted an ended process's whole lifetime as others' load: on the namespace cluster the slowest,
    quota-capped node's probe outlived the other nodes' sweep processes, and their torch imports made it
    "busy".) When this node's own cgroup quota bound in OWN_LIMIT_BINDS of the scheduler periods or more,
    the cgroup got all the CPU its limit allows: the limit set the pace, not others, and the figure is
    judged (the check reports the limit as the node's problem)."""

    def __init__(self, ours: Callable[[object], bool] | None = None):
        self.ours = ours
        self.occupancy = Occupancy()
        self.own_limit_bound: float | None = None   # share of CFS periods our cgroup's CPU limit bound
        self._first: dict[int, float] = {}            # pid -> CPU seconds when first read in the window
        self._last: dict[int, tuple[float, str, str | None]] = {}   # pid -> (CPU seconds, name, user) last read
        self._mine: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()

    def _sample(self, at_start: bool = False) -> None:
        import psutil

        for proc in psutil.process_iter(["name", "username", "cpu_times", "ppid"]):
            t = proc.info.get("cpu_times")
            if t is None:
                continue
            cpu, pid = t.user + t.system, proc.pid
            with self._lock:
                if pid not in self._first:
                    # born inside the window: all its CPU time is the window's
                    self._first[pid] = cpu if at_start else 0.0
                    if not at_start and self._is_ours(proc):
                        self._mine.add(pid)
                self._last[pid] = (cpu, proc.info.get("name") or "?", proc.info.get("username"))

    def _is_ours(self, proc) -> bool:
        import psutil

        try:
            return proc.info.get("ppid") in self._mine or bool(self.ours and self.ours(proc))
        except (psutil.Error, OSError):
            return False

    def _sampler(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    @staticmethod
    def _host_busy_s() -> float:
        import psutil

        t = psutil.cpu_times()
        return sum(t) - t.idle - getattr(t, "iowait", 0.0)

    def __enter__(self) -> CpuWatch:
        self.stat_paths = [stat for _, stat in cpu_stat_chain(os.getpid())]
        self.throttle0 = _throttle_snapshot(self.stat_paths)
        self.t0, self.host0 = time.monotonic(), self._host_busy_s()
        self._mine = _own_pids(self.ours)
        self._sample(at_start=True)
        self._thread = threading.Thread(target=self._sampler, name="mleng-cpuwatch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._mine |= _own_pids(self.ours)
        self._sample()
        wall = max(time.monotonic() - self.t0, 1e-3)
        host = self._host_busy_s() - self.host0
        used = {pid: last[0] - self._first[pid] for pid, last in self._last.items()}
        ours = sum(cpu_s for pid, cpu_s in used.items() if pid in self._mine)
        busiest = sorted(((cpu_s, pid) for pid, cpu_s in used.items() if pid not in self._mine), reverse=True)
        holders = [Holder(pid=pid, name=self._last[pid][1], user=self._last[pid][2], origin=origin(pid))
                   for cpu_s, pid in busiest[:TOP_HOLDERS] if cpu_s / wall >= HOLDER_MIN_CORES]
        cpus = os.cpu_count() or 1
        others = round(max(0.0, (host - ours) / wall), 2)   # judged as shown: 1.254 cores read 1.25 and judged so
        pressure = _memory_pressure_pct()
        self.own_limit_bound = limit_bound_share(self.throttle0, _throttle_snapshot(self.stat_paths))
        limited = self.own_limit_bound is not None and self.own_limit_bound >= OWN_LIMIT_BINDS
        reasons = cpu_busy_reasons(0.0 if limited else others, cpus, pressure)
        self.occupancy = Occupancy(busy=bool(reasons), why="; ".join(reasons), holders=holders if reasons else [],
                                   others_cpu_cores=others,
                                   cpus=cpus, memory_pressure_pct=pressure)
