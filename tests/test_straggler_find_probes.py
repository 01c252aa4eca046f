"""straggler_find's node counters for CPU contention, on real processes and a real cgroup of this machine: who else
runs on a rank's CPUs (pid, name, owner; the job's own processes counted apart) and the CPU quota above it (issue 35:
the answer named the contention but not what the rank competed with). Other users' process names are data: escaped."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.shared.cgroup_cpu import CpuLimit, cpu_limit, cpu_stat_chain, quota
from tools.shared.process_origin import limit_words
from tools.straggler_find.probes import RunnableWatch

V1_CPU = Path("/sys/fs/cgroup/cpu")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root: another user's process, a cgroup of our own")


def _stop(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@needs_root
def test_the_processes_on_a_ranks_cpus_are_named_with_their_owner_and_the_jobs_own_apart():
    cpu = min(os.sched_getaffinity(0))
    # The "rank": pinned to one CPU, with a busy child of its own (a dataloader worker: the job's, counted apart).
    rank = subprocess.Popen([sys.executable, "-c", f"import os,subprocess,sys,time\nos.sched_setaffinity(0,{{{cpu}}})\n"
                             "subprocess.Popen([sys.executable,'-c','while True: pass'])\ntime.sleep(600)"],
                            start_new_session=True)
    # Another user's busy loop on the same CPU, whose name holds an escape sequence and a newline.
    hog = subprocess.Popen([sys.executable, "-c", f"import os,pwd\nos.sched_setaffinity(0,{{{cpu}}})\n"
                            "open('/proc/self/comm','w').write('b\\x1b[2J\\nrm -rf')\n"
                            "who=pwd.getpwnam('nobody'); os.setgid(who.pw_gid); os.setuid(who.pw_uid)\nwhile True: pass"],
                           start_new_session=True)
    try:
        time.sleep(1.5)
        watch = RunnableWatch([rank.pid], interval_s=1.0)
        for _ in range(12):
            watch.scan()
            time.sleep(0.1)
        named = watch.competitors(rank.pid)
        ours = [line for line in named if line.startswith(f"pid {hog.pid} (")]
        assert ours and "user nobody" in ours[0] and "runnable in" in ours[0], named
        assert "\x1b" not in ours[0] and "\n" not in ours[0] and "rm -rf" in ours[0], ours
        # whose it is and since when, from its cgroup and start time (shared/process_origin.py; model rounds 6-10)
        assert "; cgroup " in ours[0] and ours[0].endswith(" s ago"), ours
        assert not any(line.startswith(f"pid {rank.pid} ") for line in named), named
        assert watch.job_runnable(rank.pid) >= 0.5 and watch.others_runnable(rank.pid) >= 0.5
    finally:
        _stop(hog)
        _stop(rank)


def test_a_cgroup_quota_is_read_from_either_cgroup_version(tmp_path):
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert quota(tmp_path) is None
    (tmp_path / "cpu.max").write_text("50000 100000\n")
    assert quota(tmp_path) == (0.5, "cpu.max 50000 100000")
    (tmp_path / "cpu.max").unlink()
    (tmp_path / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu.cfs_period_us").write_text("100000\n")
    assert quota(tmp_path) is None
    (tmp_path / "cpu.cfs_quota_us").write_text("25000\n")
    assert quota(tmp_path) == (0.25, "cpu.cfs_quota_us 25000 / cpu.cfs_period_us 100000")


def test_a_quota_says_whose_cgroup_it_is_set_on_and_when_it_was_written():
    on_job = CpuLimit(0.05, "/slurm/uid_0/job_12", "cpu.max 5000 100000", 185.0)
    assert limit_words(on_job) == "/slurm/uid_0/job_12 (SLURM job 12): cpu.max 5000 100000, written 3 min ago"
    unknown = CpuLimit(0.2, "/mln/mln3\x1b[2J", "cpu.max 20000 100000", None)
    assert limit_words(unknown) == "/mln/mln3\\x1b[2J: cpu.max 20000 100000"


# Moves itself into the cgroup named by argv[1], then keeps a core busy for 1.5 s inside a CpuWatch and prints the
# share of CFS periods it saw its cgroups throttled in.
CPU_WATCH_UNDER_QUOTA = """
import os, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
from tools.shared.occupancy import CpuWatch
with CpuWatch() as watch:
    end = time.monotonic() + 1.5
    while time.monotonic() < end:
        pass
print(watch.own_limit_bound)
"""


@needs_root
@pytest.mark.skipif(not (V1_CPU / "cpu.cfs_quota_us").exists(), reason="no cgroup v1 cpu controller here")
def test_the_tightest_quota_above_a_rank_is_found_on_a_real_cgroup():
    outer = V1_CPU / f"mleng-test-{os.getpid()}"
    inner = outer / "job"
    sleeper = None
    try:
        inner.mkdir(parents=True)
        (outer / "cpu.cfs_period_us").write_text("100000")
        (outer / "cpu.cfs_quota_us").write_text("30000")         # the node's cap, one level above the rank's cgroup
        sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        (inner / "tasks").write_text(str(sleeper.pid))
        limit = cpu_limit(sleeper.pid)
        assert limit[:3] == (0.3, f"/{outer.name}", "cpu.cfs_quota_us 30000 / cpu.cfs_period_us 100000"), limit
        # when it was written: the quota file's mtime, which cgroupfs sets on each write (asked in model rounds 9-10)
        assert limit.written_s_ago is not None and limit.written_s_ago < 30, limit
        os.utime(outer / "cpu.cfs_quota_us", (time.time() - 7260, time.time() - 7260))
        assert limit_words(cpu_limit(sleeper.pid)) == (f"/{outer.name}: cpu.cfs_quota_us 30000 / cpu.cfs_period_us "
                                                       "100000, written 2 h 1 min ago")
        assert cpu_stat_chain(sleeper.pid) == [(f"/{outer.name}/job", inner / "cpu.stat"),
                                               (f"/{outer.name}", outer / "cpu.stat"), ("/", V1_CPU / "cpu.stat")]
        # fleet_sweep's probe reads the same chain from inside: busy under the cap above it, it sees itself throttled
        busy = subprocess.run([sys.executable, "-c", CPU_WATCH_UNDER_QUOTA, str(inner / "tasks")],
                              capture_output=True, text=True, timeout=60)
        assert busy.returncode == 0 and float(busy.stdout) >= 0.5, busy.stdout + busy.stderr
        (outer / "cpu.cfs_quota_us").write_text("-1")
        assert cpu_limit(sleeper.pid) is None
    finally:
        if sleeper:
            sleeper.kill()
            sleeper.wait()
        for folder in (inner, outer):
            for _ in range(50):                                   # a killed task leaves its cgroup a moment later
                try:
                    folder.rmdir() if folder.exists() else None
                    break
                except OSError:
                    time.sleep(0.1)
