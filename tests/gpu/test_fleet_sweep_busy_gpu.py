"""Busy is not broken (issue 24), on the GPU box: a co-tenant process keeps GPU 0 busy with a bf16 matmul
loop while fleet_sweep runs on localhost. The sweep must say busy, name the co-tenant's pid, and put
nothing on the drain list; the same sweep with the GPU quiet must not call it busy.
`python -m pytest tests/gpu/test_fleet_sweep_busy_gpu.py -m gpu -s` prints FIGURE lines (~3 min on one H200)."""

import os
import subprocess
import sys
import time

import pytest
import torch

from tools import fleet_sweep as fs
from tools.engine.runner import execute

pytestmark = pytest.mark.gpu

COTENANT = """
import sys, torch
a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
print("ready", flush=True)
while True:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
"""
CHECKS = ["gpu_health", "matmul_bench", "memory_bandwidth_bench"]


def sweep():
    return execute(fs.SPEC, fs.SPEC.Params(hosts=["localhost"], checks=CHECKS, deadline_s=600, plot=False), timeout_s=700)


def test_a_cotenant_on_the_gpu_makes_the_sweep_say_busy_with_its_pid_and_drain_nothing():
    child = subprocess.Popen([sys.executable, "-c", COTENANT], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        time.sleep(2)   # let NVML's utilisation window see it
        busy = sweep()
    finally:
        child.kill()
        child.wait()
    print(f"\nFIGURE busy sweep on {torch.cuda.get_device_name(0)}: verdict {busy.verdict}")
    for line in busy.findings:
        print("FIGURE  ", line)
    for g in busy.gpus:
        print(f"FIGURE   GPU {g.gpu} {g.figure} = {g.value} {g.unit} (expected {g.expected})")
    rows = {b.check: b for b in busy.busy}
    assert {"matmul_bench", "memory_bandwidth_bench"} <= set(rows), busy.findings
    assert any(f"pid {child.pid} " in h for h in rows["matmul_bench"].holders), rows["matmul_bench"].holders
    assert busy.drain == [] and not [o for o in busy.outliers if o.status == "confirmed"], busy.findings
    assert busy.verdict != "fail" and any(f.startswith("BUSY") for f in busy.findings)
    assert not any(f.startswith("FAILED") for f in busy.findings), busy.findings

    quiet = sweep()
    print(f"FIGURE quiet sweep: verdict {quiet.verdict}; busy rows {len(quiet.busy)}")
    for g in quiet.gpus:
        print(f"FIGURE   GPU {g.gpu} {g.figure} = {g.value} {g.unit} (expected {g.expected})")
    assert quiet.busy == [] and quiet.drain == [], quiet.findings
    assert os.path.exists(f"/proc/{child.pid}") is False
