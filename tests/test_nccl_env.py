"""NCCL settings for one distributed run (shared/nccl_env.py): only allowed names and one-token values
pass, every rank sets them before its process group exists, the result echoes them."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from tools.collective_bench import CollectiveBenchParams
from tools.dist_smoke_test import SPEC as SMOKE, DistSmokeTestParams
from tools.engine.runner import execute

REPO = Path(__file__).resolve().parent.parent


def test_allowed_settings_pass_and_the_rest_are_refused_by_name():
    ok = DistSmokeTestParams(nccl_env={"NCCL_ALGO": "Ring", "NCCL_IB_GID_INDEX": "3", "NCCL_IB_HCA": "^=mlx5_0:1"})
    assert ok.nccl_env["NCCL_IB_HCA"] == "^=mlx5_0:1"
    for bad, needle in [({"NCCL_NET_PLUGIN": "libevil.so"}, "loads code or touches files"),
                        ({"LD_PRELOAD": "/tmp/x.so"}, "cannot be set"),
                        ({"NCCL_DEBUG_FILE": "/etc/passwd"}, "cannot be set"),
                        ({"NCCL_SOCKET_IFNAME": "eth0; rm -rf /"}, "no spaces, no paths"),
                        ({"NCCL_ALGO": "../../x/y"}, "no spaces, no paths")]:
        with pytest.raises(ValidationError, match=needle) as err:
            CollectiveBenchParams(nccl_env=bad)
        assert "nccl_env" in str(err.value)


def test_every_rank_sets_them_before_its_job_runs():
    # In a process of its own: run_rank blocks SIGTERM and watches for it, as a rank must.
    code = textwrap.dedent("""
        import json, os
        from tools.shared.ranks import run_rank
        def job(reporter, params):
            print("SEEN", json.dumps({k: os.environ.get(k) for k in ("NCCL_ALGO", "NCCL_PROTO")}), flush=True)
        run_rank(job, {"nccl_env": {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}})
        """)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}, "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
                         cwd=str(REPO))
    line = next((l for l in out.stdout.splitlines() if l.startswith("SEEN ")), None)
    assert line, out.stderr[-2000:]
    assert json.loads(line[5:]) == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "Simple"}


@pytest.mark.slow
def test_a_real_run_echoes_its_settings():
    params = DistSmokeTestParams(backend="gloo", nproc_per_node=2, numel=4096, alloc_mib=1,
                                 nccl_env={"NCCL_ALGO": "Ring", "NCCL_DEBUG": "WARN"})
    result = execute(SMOKE, params)   # through the runner and its child process, as every call goes
    assert result.verdict == "ok", result.findings
    assert result.nccl_env == {"NCCL_ALGO": "Ring", "NCCL_DEBUG": "WARN"}
    assert "NCCL settings for this run: NCCL_ALGO=Ring, NCCL_DEBUG=WARN." in result.findings
    # The same run without settings echoes none: test_dist_smoke.py::test_all_ranks_ok checks it on its real
    # runs (a second launch here cost ~20 s of the quick test command and checked nothing more).
