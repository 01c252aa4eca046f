"""Who else uses a resource while a check measures it (tools/shared/occupancy.py)."""

import os
import subprocess
import sys
import time

from tools.shared.occupancy import (FREE_CORES_NEEDED, CpuWatch, Occupancy, cpu_busy_reasons, gpu_occupancy,
                                    limit_bound_share)


def test_cpu_busy_when_others_leave_less_than_most_of_a_core():
    assert cpu_busy_reasons(1.0, 2, 0.0) == []                      # one core free: a single thread runs alone
    assert cpu_busy_reasons(2 - FREE_CORES_NEEDED + 0.1, 2, None) == ["other processes used 1.35 of 2 CPU cores while it measured"]
    assert cpu_busy_reasons(100.0, 128, None) == []                 # a big node with a few busy cores is not busy
    assert cpu_busy_reasons(0.0, 8, 25.0) == ["memory pressure: tasks stalled on memory 25% of the last 10 s"]


def test_without_nvml_no_gpu_is_busy():
    import importlib.util

    if importlib.util.find_spec("pynvml") is None:
        assert gpu_occupancy() == Occupancy()


def test_a_hog_of_ours_is_not_a_holder_and_our_own_work_is_not_others():
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        with CpuWatch(ours=lambda proc: proc.pid == hog.pid) as watch:
            sum(range(3_000_000))
    finally:
        hog.kill()
        hog.wait()
    occ = watch.occupancy
    assert all(h.pid not in (hog.pid, os.getpid()) for h in occ.holders)
    assert occ.cpus == os.cpu_count() and occ.others_cpu_cores is not None and occ.others_cpu_cores >= 0
    assert occ.busy == bool(cpu_busy_reasons(occ.others_cpu_cores, occ.cpus, occ.memory_pressure_pct))


def test_merge_keeps_busy_and_holders_of_both():
    a = Occupancy(busy=True, why="GPU 0 99% utilised", holders=[])
    b = Occupancy(busy=False, holders=[])
    merged = a.merge(b)
    assert merged.busy and merged.why == "GPU 0 99% utilised"


class FakeNvml:
    """NVML's answers for one GPU (the logic on top is ours; tests/gpu/test_fleet_sweep_busy_gpu.py runs
    it against the real driver with a real co-tenant)."""

    def __init__(self, pids, utils):
        self.pids, self.utils = pids, list(utils)

    def nvmlInit(self): pass
    def nvmlShutdown(self): pass
    def nvmlDeviceGetCount(self): return 1
    def nvmlDeviceGetHandleByIndex(self, i): return i

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [type("P", (), {"pid": pid, "usedGpuMemory": 512 << 20})() for pid in self.pids]

    def nvmlDeviceGetUtilizationRates(self, h):
        return type("U", (), {"gpu": self.utils.pop(0) if len(self.utils) > 1 else self.utils[0]})()


def test_gpu_holders_are_other_processes_and_a_fading_utilisation_of_ours_is_not_busy(monkeypatch):
    import tools.shared.occupancy as occ

    monkeypatch.setattr(occ, "UTIL_SETTLE_S", 0.01)
    try:
        monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([os.getpid(), 1], [99]))   # ours + an invisible pid
        busy = occ.gpu_occupancy()
        assert busy.busy and [h.pid for h in busy.holders] == [1] and busy.holders[0].used_mib == 512.0
        monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([], [95, 3]))   # our finished run fading out
        assert not occ.gpu_occupancy().busy
        monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([], [95, 97]))  # still busy: another container
        assert occ.gpu_occupancy().why == "GPU 0 97% utilised"
        monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([os.getpid()], [99]))   # only ours on it
        assert not occ.gpu_occupancy().busy
        monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([1], [0]))   # pid 1: no descendant of ours
        assert not occ.gpu_occupancy(ours=lambda p: p.pid == 1).busy      # ... unless `ours` claims it
        assert [h.pid for h in occ.gpu_occupancy().holders] == [1]
    finally:
        monkeypatch.undo()


class FakeNvmlWithSamples(FakeNvml):
    """A driver that keeps per-process SM samples (the H200 does)."""

    def __init__(self, pids, utils, sm_by_pid):
        super().__init__(pids, utils)
        self.sm_by_pid = sm_by_pid

    def nvmlDeviceGetProcessUtilization(self, h, since_us):
        if not self.sm_by_pid:
            raise RuntimeError("Not Found")          # NVML's NOT_FOUND: no sample since then
        return [type("S", (), {"pid": pid, "smUtil": sm})() for pid, sm in self.sm_by_pid.items()]


def test_an_idle_holder_of_gpu_memory_is_not_a_cotenant(monkeypatch):
    """The H200 run of 2026-12-01: a pytest process holding 106 GiB at 2% was called busy."""
    import tools.shared.occupancy as occ

    monkeypatch.setitem(sys.modules, "pynvml", FakeNvmlWithSamples([1], [2], {1: 2}))
    assert not occ.gpu_occupancy().busy
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvmlWithSamples([1], [2], {}))       # no sample: idle
    assert not occ.gpu_occupancy().busy
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvmlWithSamples([1], [99], {1: 97}))  # a real co-tenant
    busy = occ.gpu_occupancy(count_utilisation=False)
    assert busy.busy and [h.pid for h in busy.holders] == [1]


def test_a_process_of_ours_that_ends_inside_the_window_is_not_others_load():
    """Namespace cluster: the quota-capped node's probe outlived the other nodes' sweep processes; their
    whole lifetime's CPU (torch imports) was subtracted from ours, and the capped node read "busy"."""
    import psutil

    ours = subprocess.Popen([sys.executable, "-c", "import time\nt = time.process_time()\n"
                             "while time.process_time() - t < 1.5: pass\nprint('burnt', flush=True)\ntime.sleep(0.6)"],
                            stdout=subprocess.PIPE, text=True)
    import threading

    assert ours.stdout.readline() == "burnt\n"   # 1.5 CPU-seconds used before the window; it ends inside it
    reaper = threading.Thread(target=ours.communicate)   # reaped as it ends, as slurmstepd reaps a node's processes
    reaper.start()
    try:
        host0, t0 = psutil.cpu_times(), time.monotonic()
        with CpuWatch(ours=lambda proc: proc.pid == ours.pid) as watch:
            time.sleep(1.5)
        host1, wall = psutil.cpu_times(), time.monotonic() - t0
    finally:
        ours.kill()
        reaper.join()
    busy = lambda t: sum(t) - t.idle - getattr(t, "iowait", 0.0)  # noqa: E731
    host_cores = (busy(host1) - busy(host0)) / wall
    # Before the fix others read host + 1.5 CPU-s / 1.5 s: a core more than the whole host did.
    assert watch.occupancy.others_cpu_cores <= host_cores + 0.1, (watch.occupancy, host_cores)


def test_the_largest_throttled_share_of_our_cgroup_or_one_above_it():
    before = {"/a/cpu.stat": (100, 0), "/a/b/cpu.stat": (100, 10)}
    after = {"/a/cpu.stat": (200, 80), "/a/b/cpu.stat": (200, 20), "/new/cpu.stat": (5, 5)}
    assert limit_bound_share(before, after) == 0.8          # the quota on the parent bound, not the child's
    assert limit_bound_share(before, before) is None        # no period ran: nothing to say
