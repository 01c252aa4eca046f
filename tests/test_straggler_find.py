"""straggler_find on this node, for real: a gloo torchrun job (bench/straggler_workload.py, nothing of mleng in
it) with one rank sleeping in its loader must be named for data loading; the same job healthy names nobody;
the job ends with the result it has unwatched; bad targets are clear answers. The judging rule is also checked
on hand-made rank rows (CPU-throttled, healthy noise, a shared GPU). The multi-node cases (cgroup CPU limit,
tc tbf link, 5 healthy runs) are in test_straggler_find_cluster.py.
"""

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tools import straggler_find as sf
from tools.engine.processes import kill_tree, torchrun_command
from tools.engine.spec import ToolFailure
from tools.shared import pyspy
from tools.straggler_find.classify import stack_class
from tools.straggler_find.judge import Rules, judge
from tools.straggler_find.models import GpuSample, NodeReport, NodeSample, RankSample
from tools.straggler_find.node import parse_raw

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "bench" / "straggler_workload.py"


def _run(**kw):
    rows = []
    result = sf.run(sf.StragglerFindParams(**kw), lambda f, m: rows.append(m))
    return result, rows


@pytest.fixture(scope="module")
def ptrace_ok():
    try:
        exe = pyspy.py_spy_path()
    except ToolFailure as e:
        pytest.skip(str(e))
    proc = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
    time.sleep(0.5)
    try:
        threads, err = pyspy.dump_one(proc.pid, False, 20, exe)
    finally:
        proc.kill()
        proc.wait()
    if threads is None:
        pytest.skip(f"py-spy cannot attach here: {err.strip()[:200]}")


def _start(tmp_path, *args, steps=100000, name="job"):
    """torchrun --standalone with 3 ranks of the workload; returns (torchrun process, its log path)."""
    cmd = torchrun_command("straggler_workload", 3, ["--steps", str(steps), *args])
    log = tmp_path / f"{name}.log"
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=str(WORKLOAD.parent)))
    deadline = time.monotonic() + 120
    while "step 5 " not in log.read_text() and time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-2000:]
        time.sleep(0.5)
    return proc, log


def _result_line(log: Path) -> str:
    return re.search(r"^result (\S+)$", log.read_text(), re.M).group(1)


def test_slow_loader_rank_is_named_for_data_loading_and_the_job_is_untouched(ptrace_ok, tmp_path):
    slow = ("--slow-loader-rank", "2", "--loader-sleep-s", "0.1")
    alone, alone_log = _start(tmp_path, *slow, steps=200, name="alone")      # never watched: the reference result
    proc, log = _start(tmp_path, *slow, steps=200, name="watched")
    try:
        result, rows = _run(launcher_pid=proc.pid, window_s=6)
        assert proc.poll() is None, "the job must keep running while it is sampled"
        assert proc.wait(timeout=200) == 0 and alone.wait(timeout=60) == 0
    finally:
        kill_tree(proc.pid)
        kill_tree(alone.pid)
    assert result.verdict == "warn" and [s.rank for s in result.stragglers] == [2], result.findings
    s = result.stragglers[0]
    assert s.reason == "data_loading" and "load_batch" in " ".join(s.evidence)
    assert s.others_wait_fraction > 0.3 and s.work_ratio > 1.5
    assert any("rank 2:" in m for m in rows), rows          # the per-node row streamed as progress
    assert len(result.ranks) == 3 and all(r.samples >= 60 for r in result.ranks)
    assert _result_line(log) == _result_line(alone_log)      # sampling changed nothing in the job's arithmetic
    assert not [p for p in psutil.process_iter(["cmdline"]) if "py-spy" in " ".join(p.info["cmdline"] or [])]


def test_healthy_job_names_nobody(ptrace_ok, tmp_path):
    proc, _ = _start(tmp_path)
    try:
        ranks = [c.pid for c in psutil.Process(proc.pid).children()]
        result, _ = _run(pids=ranks, window_s=10)
    finally:
        kill_tree(proc.pid)
    assert result.stragglers == [], result.findings
    assert result.verdict in ("ok", "info") and result.spread_pct is not None
    assert any(f.startswith("No straggler") or "communication-bound" in f for f in result.findings), result.findings


def test_bad_targets_are_clear_answers(ptrace_ok):
    gone = subprocess.Popen(["true"])
    gone.wait()
    with pytest.raises(ToolFailure, match=f"pid {gone.pid} does not exist"):
        _run(pids=[gone.pid], window_s=5)
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        with pytest.raises(ToolFailure, match="not a Python process"):
            _run(pids=[sleeper.pid], window_s=5)
    finally:
        sleeper.kill()
        sleeper.wait()
    with pytest.raises(ValueError, match="exactly one of slurm_job_id"):
        sf.StragglerFindParams(pids=[1], launcher_pid=1)
    with pytest.raises(ValueError, match="window_s"):
        sf.StragglerFindParams(pids=[1], window_s=600)
    with pytest.raises(ValueError, match="slurm_job_id"):
        sf.StragglerFindParams(slurm_job_id="12; rm -rf /")


# ---------------------------------------------------------------------------------------------------
# The rule, on rank rows made by hand

def _rank(rank, collective, compute=None, data=0.0, host=None, **kw):
    compute = 1 - collective - data if compute is None else compute
    return RankSample(rank=rank, host=host or f"n{rank}", pid=100 + rank, samples=400,
                      fractions={"collective": collective, "data": data, "h2d": 0.0, "compute": compute, "idle": 0.0}, **kw)


def _reports(ranks, gpus=()):
    hosts = dict.fromkeys(r.host for r in ranks)
    return [NodeReport(host=h, ranks=[r for r in ranks if r.host == h], node=NodeSample(host=h),
                       gpus=[g for g in gpus if g.host == h]) for h in hosts]


def test_rule_names_a_cpu_throttled_rank_and_not_healthy_noise():
    rules = Rules.load()
    healthy = [_rank(0, 0.42), _rank(1, 0.47), _rank(2, 0.39), _rank(3, 0.45)]
    assert judge(_reports(healthy), rules).stragglers == []
    slow = healthy[:3] + [_rank(3, 0.03, cpu_fraction=0.2, cgroup="/mln/n3", cgroup_throttled_fraction=0.9)]
    slow[:3] = [_rank(i, 0.6) for i in range(3)]
    v = judge(_reports(slow), rules)
    assert [(s.rank, s.reason) for s in v.stragglers] == [(3, "cpu")]
    assert "throttled in 90%" in v.stragglers[0].evidence[1]


def test_rule_names_only_a_rank_slow_in_every_third_of_the_window():
    def parts(*collective):
        return {"part_fractions": [{"collective": c} for c in collective], "part_samples": [130] * len(collective)}

    others = [_rank(i, 0.6, **parts(0.6, 0.6, 0.6)) for i in range(3)]
    steady = _rank(3, 0.1, **parts(0.1, 0.1, 0.1))
    blip = _rank(3, 0.1, **parts(0.6, 0.6, 0.1))           # its lead in one third only
    assert [s.rank for s in judge(_reports(others + [steady]), Rules.load()).stragglers] == [3]
    v = judge(_reports(others + [blip]), Rules.load())
    assert v.stragglers == [] and "not in every third" in v.findings[0]


def test_rule_says_inconclusive_when_healthy_ranks_scatter():
    ranks = [_rank(0, 0.1), _rank(1, 0.6), _rank(2, 0.35), _rank(3, 0.8), _rank(4, 0.2)]
    v = judge(_reports(ranks), Rules.load())
    assert v.inconclusive and v.stragglers == []


def test_a_shared_gpu_names_its_holder():
    r = _rank(0, 0.0, gpu_index=0, gpu_serial="1650924060001")
    gpu = GpuSample(host="n0", index=0, serial="1650924060001", job_pids=[100], utilization_median_pct=100,
                    other_holders=["pid 777 (python burn.py), 20.0 GiB"])
    v = judge(_reports([r], [gpu]), Rules.load())
    assert [(s.rank, s.reason, s.gpu_serial) for s in v.stragglers] == [(0, "gpu", "1650924060001")]
    assert "pid 777" in v.stragglers[0].evidence[0]


def test_stack_classes_and_py_spy_raw_parsing():
    raw = ("thread (42): MainThread;<module> (/j/train.py:9);all_reduce (/v/site-packages/torch/distributed/"
           "distributed_c10d.py:3252) 30\n"
           "thread (42): MainThread;<module> (/j/train.py:7);load_batch (/j/train.py:3) 10\n"
           "thread (43): Thread-1;run (/j/train.py:20) 99\n")
    stacks = parse_raw(raw, 42)
    assert sum(stacks.values()) == 40                    # the other thread is not the rank's main thread
    classes = {stack_class([tuple(re.match(r"(.*) \((.*):\d+\)", f).groups()) for f in k]): n for k, n in stacks.items()}
    assert classes == {"collective": 30, "data": 10}
    assert stack_class([("load_state_dict", "/j/m.py"), ("main", "/j/train.py")]) == "compute"
    assert stack_class([("synchronize", "/v/site-packages/torch/cuda/__init__.py")]) == "collective"
    assert stack_class([]) == "idle"
