"""straggler_find on a real GPU: a one-GPU training loop (matmuls + an optimizer step) shares its GPU with a
co-tenant process; the GPU must be named (index, serial, utilisation) with the holder. Alone, the same job
names nobody. `. scripts/gpu_env.sh && python -m pytest tests/gpu/test_straggler_find_gpu.py -m gpu -s`
prints the FIGURE lines for docs/benchmarks.md. About 1.5 minutes on one H200."""

import subprocess
import sys
import time

import pytest

from tools import straggler_find as sf
from tools.engine.processes import kill_tree

pytestmark = pytest.mark.gpu

TRAIN = """
import os, sys, time, torch
torch.manual_seed(0)
w = torch.randn(8192, 8192, device="cuda", requires_grad=True)
opt = torch.optim.SGD([w], lr=1e-6)
def train_step(x):
    loss = (x @ w).square().mean()
    loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
x = torch.randn(8192, 8192, device="cuda")
print("ready", flush=True)
t0, n = time.perf_counter(), 0
while True:
    train_step(x); n += 1
    if n % 20 == 0:
        print(f"step_ms {1000 * (time.perf_counter() - t0) / 20:.1f}", flush=True); t0 = time.perf_counter()
"""
CO_TENANT = """
import torch
a = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
print("ready", flush=True)
while True:
    a = (a @ a).clamp_(-1, 1)
"""


def _start(code: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True,
                            env={"RANK": "0", "LOCAL_RANK": "0", **__import__("os").environ})
    assert proc.stdout.readline().strip() == "ready"
    return proc


def _step_ms(proc: subprocess.Popen, lines: int = 3) -> float:
    values = [float(proc.stdout.readline().split()[1]) for _ in range(lines)]
    return sorted(values)[len(values) // 2]


def test_a_gpu_shared_with_a_co_tenant_is_named_with_its_holder():
    pytest.importorskip("pynvml", reason="straggler_find sees GPUs through nvidia-ml-py")
    pytest.importorskip("psutil")
    job = _start(TRAIN)
    try:
        alone_ms = _step_ms(job)
        alone = sf.run(sf.StragglerFindParams(pids=[job.pid], window_s=10), lambda f, m: None)
        assert alone.stragglers == [], alone.findings
        assert alone.gpus and alone.gpus[0].uuid and alone.ranks[0].gpu_index is not None
        tenant = _start(CO_TENANT)
        try:
            time.sleep(2)
            shared_ms = _step_ms(job)
            shared = sf.run(sf.StragglerFindParams(pids=[job.pid], window_s=10), lambda f, m: None)
        finally:
            kill_tree(tenant.pid)
    finally:
        kill_tree(job.pid)
    named = [s for s in shared.stragglers if s.reason == "gpu"]
    assert named and named[0].pid == job.pid and named[0].gpu_index == alone.ranks[0].gpu_index, shared.findings
    assert f"pid {tenant.pid}" in " ".join(named[0].evidence)
    gpu = next(g for g in shared.gpus if g.index == named[0].gpu_index)
    print(f"\nFIGURE straggler_find co-tenant: step {alone_ms:.1f} ms alone -> {shared_ms:.1f} ms shared; "
          f"GPU {gpu.index} serial {gpu.serial} util {gpu.utilization_median_pct}% SM {gpu.sm_clock_median_mhz} MHz; "
          f"named: {named[0].evidence[0]}")


NCCL_TIMED = """
import os, socket, time, torch, torch.distributed as dist
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:" + os.environ["FR_PORT"], rank=0, world_size=1)
x = torch.ones(1 << 24, device="cuda")
for _ in range(30):
    dist.all_reduce(x)
torch.cuda.synchronize()
time.sleep(1)                               # the watchdog reads each collective's CUDA events
c10d = torch._C._distributed_c10d
dump = getattr(c10d, "_dump_nccl_trace", None) or c10d._dump_fr_trace
prefix = os.environ["TORCH_FR_DUMP_TEMP_FILE"]
with open(prefix + "0.tmp", "wb") as f:
    f.write(dump(True, False, False))
os.replace(prefix + "0.tmp", prefix + "0")
print("dumped", flush=True)
time.sleep(60)
"""


def test_flight_recorder_durations_are_read_from_a_real_nccl_dump(tmp_path):
    """TORCH_NCCL_ENABLE_TIMING=1: the dump carries duration_ms per collective (CUDA events), which straggler_find
    reads beside when each collective was issued. One GPU: one rank, so durations are read, not compared."""
    pytest.importorskip("psutil")
    import socket

    from tools.straggler_find import flight

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**__import__("os").environ, "RANK": "0", "TORCH_NCCL_ENABLE_TIMING": "1", "FR_PORT": str(port),
           "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_")}
    proc = subprocess.Popen([sys.executable, "-c", NCCL_TIMED], stdout=subprocess.PIPE, text=True,
                            start_new_session=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "dumped"
        row = flight.read_rank(proc.pid, 0, "gpu-host")
    finally:
        kill_tree(proc.pid)
    assert row is not None and not row.error and len(row.entries) >= 30, row
    durations = [d for (_, _, _, d) in row.entries if d is not None]
    assert len(durations) >= 25 and all(d > 0 for d in durations), row.entries[-3:]
    print(f"\nFIGURE straggler_find flight recorder: {len(durations)} of {len(row.entries)} NCCL all_reduce "
          f"entries carry duration_ms, median {sorted(durations)[len(durations) // 2]:.3f} ms (64 MiB, 1 GPU)")
