"""dist_smoke_test across 2 SLURM nodes (srun + one torchrun per node, c10d rendezvous).

Runs only where a SLURM cluster with 2 idle nodes answers (e.g. scripts/slurm-local.sh with NODES=2;
set SLURM_CONF if its config is not the default). Skips otherwise.
"""

import json
import os
import shutil
import subprocess
import sys
import time

import psutil
import pytest

from tools.engine.data import IMPORT_ROOT as REPO_ROOT


def _two_idle_nodes() -> bool:
    if not shutil.which("salloc") or not shutil.which("sinfo"):
        return False
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%D %t"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return sum(int(n) for n, state in (line.split() for line in out.splitlines() if line.strip())
               if state == "idle") >= 2


pytestmark = pytest.mark.skipif(not _two_idle_nodes(), reason="needs a SLURM cluster with 2 idle nodes")


def test_hang_on_the_second_node_is_named_through_srun():
    tag = f"slurm-{os.getpid()}-{time.monotonic_ns()}"  # only our processes count as leftovers
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
    env["MLENG_TEST_TAG"] = tag
    t0 = time.monotonic()
    out = subprocess.run(["salloc", "-N2", "--time=3", sys.executable, "-m", "tools.dist_smoke_test", "--json",
                          "--pg-timeout-s", "8", "--inject-fault", "sleep_before_all_reduce", "--fault-rank", "3"],
                         capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, env=env)
    elapsed = time.monotonic() - t0
    result = json.loads(out.stdout[out.stdout.index("{"):])
    assert result["nnodes"] == 2 and result["world_size"] == 4
    assert result["culprit_ranks"] == [3], result["findings"]
    assert result["launch_command"].startswith("srun --nodes=2")
    assert elapsed < 8 + 10 + 15  # timeout + naming + two torchruns starting
    time.sleep(0.5)
    left = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if "tools.dist_smoke_test.rank" in " ".join(p.info["cmdline"] or []) and p.environ().get("MLENG_TEST_TAG") == tag:
                left.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    assert not left
