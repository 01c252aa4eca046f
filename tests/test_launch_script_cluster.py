"""launch_script's sbatch script run for real across the nodes of the multi-node test cluster
(tests/multinode_cluster.py: one slurmd per network namespace, each node its own hostname and address):
one torchrun per node, two ranks each, meeting at one rendezvous (on the first node's NodeAddr, at the
port derived from the job id), each node's task holding all of its CPUs. Skipped with the reason where the cluster
cannot start."""

from __future__ import annotations

import sys
import textwrap
import time

import pytest

from tests.multinode_cluster import multinode_cluster  # noqa: F401  (the fixture)
from tools import launch_script

pytestmark = pytest.mark.slurm

RANKS = textwrap.dedent("""
    import os, socket, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.ones(4) * (dist.get_rank() + 1)
    dist.all_reduce(t)
    print("rank", dist.get_rank(), "of", dist.get_world_size(), "host", socket.gethostname(),
          "sum", int(t[0].item()), "run", os.environ["TORCHELASTIC_RUN_ID"],
          "cpus", os.environ.get("SLURM_CPUS_PER_TASK", "?"), os.environ.get("SLURM_CPUS_ON_NODE", "?"), flush=True)
    dist.destroy_process_group()
""")


def _wait(cluster, job_id: str, timeout_s: float = 180) -> str:
    deadline = time.monotonic() + timeout_s
    state = "UNKNOWN"
    while time.monotonic() < deadline:
        out = cluster.cmd("scontrol", "show", "job", "-o", job_id, check=False).stdout
        state = next((w.split("=", 1)[1] for w in out.split() if w.startswith("JobState=")), "UNKNOWN")
        if state in ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY"):
            return state
        time.sleep(0.5)
    return state


def test_generated_script_runs_one_torchrun_per_node_across_the_cluster(multinode_cluster, tmp_path):  # noqa: F811
    (tmp_path / "ranks.py").write_text(RANKS)
    nodes = 3
    p = launch_script.LaunchScriptParams(
        command="ranks.py", nnodes=nodes, gpus_per_node=0, nproc_per_node=2, time_limit="5", job_name="mn",
        workdir=str(tmp_path), python=sys.executable, pass_nccl_env=False, env={"OMP_NUM_THREADS": "1"},
        submit=True)
    r = launch_script.run(p, lambda f, m: None)
    assert r.submitted and r.job_id
    state = _wait(multinode_cluster, r.job_id)
    batch_log = tmp_path / "logs" / f"mn-{r.job_id}.out"
    assert state == "COMPLETED", batch_log.read_text()[-3000:] if batch_log.exists() else state
    lines = [line[line.index("rank "):] for f in sorted((tmp_path / "logs").glob(f"mn-{r.job_id}-node*.out"))
             for line in f.read_text().splitlines() if "rank " in line]  # torchrun --tee prefixes [default0]:
    world = 2 * nodes
    assert len(lines) == world, [f.read_text()[-1500:] for f in (tmp_path / "logs").glob("*.out")]
    assert {line.split()[5] for line in lines} == {f"mln{k}" for k in range(1, nodes + 1)}  # one torchrun per node
    assert all(f"sum {world * (world + 1) // 2}" in line for line in lines)
    assert all(f"run {r.job_id} " in line for line in lines), lines  # one rendezvous, the job's
    # srun got --cpus-per-task: each node's torchrun has all the node's CPUs (whole nodes), not one core
    assert all(line.split()[-2] == line.split()[-1] != "?" for line in lines), lines
