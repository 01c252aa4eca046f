"""launch_script's per-node torchrun commands (the no-SLURM form), run for real: two "nodes" on this
host, each one torchrun, meeting at the c10d rendezvous the commands name. gloo on CPU; with two or
more NVIDIA GPUs, the same with NCCL and one GPU per "node" (marker gpu).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from tools import launch_script

PROGRAM = """
import os, sys, torch, torch.distributed as dist
backend = sys.argv[1]
dist.init_process_group(backend)
device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
t = torch.ones(1 << 20, device=device) * (dist.get_rank() + 1)
dist.all_reduce(t)
world = dist.get_world_size()
ok = bool((t == world * (world + 1) / 2).all())
print(f"rank {dist.get_rank()} of {world} on {device} {'OK' if ok else 'WRONG'}", flush=True)
dist.destroy_process_group()
sys.exit(0 if ok else 1)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_nodes(tmp_path, backend: str, gpus_per_node: int) -> list[str]:
    (tmp_path / "prog.py").write_text(PROGRAM)
    p = launch_script.LaunchScriptParams(
        command=f"prog.py {backend}", mode="torchrun", nnodes=2, gpus_per_node=gpus_per_node, nproc_per_node=1,
        rdzv_host="127.0.0.1", rdzv_port=_free_port(), pass_nccl_env=False, python=sys.executable)
    commands = launch_script.run(p, lambda f, m: None).commands
    assert len(commands) == 2
    procs = []
    for node, cmd in enumerate(commands):
        # TMPDIR: torchrun's torchelastic_* folder, which a killed torchrun leaves behind, goes to the test's folder
        env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(tmp_path)}
        if gpus_per_node:
            env["CUDA_VISIBLE_DEVICES"] = str(node)
        procs.append(subprocess.Popen(["bash", "-c", cmd], cwd=tmp_path, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True))
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=120)
            outputs.append(out)
            assert proc.returncode == 0, out[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    return outputs


@pytest.mark.slow
def test_two_torchrun_nodes_meet_at_the_rendezvous_gloo(tmp_path):
    outputs = _run_nodes(tmp_path, "gloo", 0)
    text = "".join(outputs)
    assert text.count(" of 2 on cpu OK") == 2 and "rank 0 of 2" in text and "rank 1 of 2" in text


def _gpu_count() -> int:
    from tools.engine.processes import local_gpu_count

    return local_gpu_count()


@pytest.mark.gpu
def test_two_torchrun_nodes_meet_at_the_rendezvous_nccl(tmp_path):
    if _gpu_count() < 2:
        pytest.skip("needs 2 NVIDIA GPUs (one per simulated node)")
    text = "".join(_run_nodes(tmp_path, "nccl", 1))
    assert text.count(" of 2 on cuda:0 OK") == 2
