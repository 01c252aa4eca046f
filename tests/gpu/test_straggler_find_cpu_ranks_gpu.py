"""straggler_find on the GPU machine's CPUs (issue 35): 8 gloo ranks of bench/straggler_workload.py (CPU matmuls,
one thread each, on a 16-core host), rank 5 doing 15% more matmuls a step. It must be named for compute within
60 s of sampling; the same job without it names nobody. The GPUs are there but no rank holds one, so the
CPU-time rule applies (judge._more_cpu_work); the twin of tests/test_straggler_find.py's 4-rank test on a
loaded 2-core host.

    . scripts/gpu_env.sh && python -m pytest tests/gpu/test_straggler_find_cpu_ranks_gpu.py -m gpu -s -q

prints FIGURE lines for docs/benchmarks.md. About 1.5-2 minutes (two jobs' start, up to 60 s sampling each)."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools import straggler_find as sf
from tools.engine.processes import kill_tree, torchrun_command

pytestmark = pytest.mark.gpu

WORKLOAD = Path(__file__).resolve().parents[2] / "bench" / "straggler_workload.py"
RANKS, SLOW = 8, 5


def _job(tmp_path, *args) -> subprocess.Popen:
    log = tmp_path / "job.log"
    proc = subprocess.Popen(torchrun_command("straggler_workload", RANKS, ["--steps", "1000000", *args]), cwd=tmp_path,
                            stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=str(WORKLOAD.parent), TMPDIR=str(tmp_path),
                                     CUDA_VISIBLE_DEVICES=""))
    deadline = time.monotonic() + 120
    while "step 10 " not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.5)
    return proc


def _sample(tmp_path, *args):
    proc = _job(tmp_path, *args)
    try:
        started = time.monotonic()
        result = sf.run(sf.StragglerFindParams(launcher_pid=proc.pid, window_s=60), lambda f, m: None)
        took = time.monotonic() - started
    finally:
        kill_tree(proc.pid)
    cpu = {r.rank: r.cpu_fraction for r in result.ranks}
    print(f"\nFIGURE straggler_find 8 CPU ranks {'rank 5 +15% compute' if args else 'healthy'}: named "
          f"{[s.rank for s in result.stragglers]} after {result.window_s:.0f} s sampled, {took:.0f} s wall, load "
          f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; CPU-s/s {cpu}")
    return result


def test_a_rank_15_percent_slower_of_8_cpu_ranks_is_named_and_its_twin_names_nobody(tmp_path):
    if (os.cpu_count() or 0) < RANKS:
        pytest.skip(f"needs {RANKS} CPUs for {RANKS} single-threaded ranks")
    slow = _sample(tmp_path, "--slow-compute-rank", str(SLOW), "--extra-compute-fraction", "0.15")
    assert [s.rank for s in slow.stragglers] == [SLOW], slow.findings
    assert slow.stragglers[0].reason == "compute" and slow.window_s <= 60, slow.findings
    healthy = _sample(tmp_path)
    assert healthy.stragglers == [] and healthy.verdict in ("ok", "info"), healthy.findings


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-m", "gpu", "-s", "-q"]))
