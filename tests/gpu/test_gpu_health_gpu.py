"""gpu_health on a real GPU node, idle and under a heavy load, through the runner (child process) as users run
it: a healthy node must come back with no warning in either case (PCIe judged under load against the PCI tree,
NVLink and clock events over the window, the test's own load process named as a memory holder of yours).
`python -m pytest tests/gpu/test_gpu_health_gpu.py -m gpu -s` prints FIGURE lines for docs/benchmarks.md."""

import subprocess
import sys
import time

import pytest

from tools.engine.runner import execute
from tools.gpu_health import SPEC, GpuHealthParams

pytestmark = pytest.mark.gpu

# Every GPU busy with back-to-back 8192^3 bf16 matmuls until killed (the heavy load of the second case).
LOAD = """
import sys, threading, torch
def spin(d):
    torch.cuda.set_device(d)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while True:
        for _ in range(10):
            a @ a
        torch.cuda.synchronize()
for d in range(torch.cuda.device_count()):
    threading.Thread(target=spin, args=(d,), daemon=True).start()
print("loaded", flush=True)
threading.Event().wait()
"""


def _report(label, r):
    print(f"\nFIGURE gpu_health {label}: verdict {r.verdict}, action {r.action}, window {r.window_s} s ({r.load}); "
          + "; ".join(f"GPU {g.index} {g.name} PCIe Gen{g.pcie_gen} x{g.pcie_width} chain "
                      f"{[(h.bdf, h.gen, h.width) for h in g.pcie_chain]} NVLink {g.nvlink_active}/{g.nvlink_total} "
                      f"clock events {g.clock_event_s} replays {g.pcie_replays_window} holders "
                      f"{[(h.pid, h.mine, h.state) for h in g.holders]}" for g in r.gpus))
    for f in r.findings:
        print("   ", f)


def _assert_healthy(r):
    assert r.gpu_count >= 1
    problems = [(g.index, p.code, p.action, p.text) for g in r.gpus for p in g.problems if p.action != "none"]
    assert r.verdict == "ok" and r.action == "none", problems
    assert all(g.pcie_chain for g in r.gpus), "no PCIe chain read from sysfs"


def test_idle_node_has_no_warning():
    r = execute(SPEC, GpuHealthParams(sample_s=3.0), timeout_s=120)
    _report("idle", r)
    _assert_healthy(r)
    assert "matmuls" in r.load, r.load


def test_node_under_heavy_load_has_no_warning():
    load = subprocess.Popen([sys.executable, "-c", LOAD], stdout=subprocess.PIPE, text=True)
    try:
        assert load.stdout.readline().strip() == "loaded"
        time.sleep(10)                       # let clocks and power settle under the load
        r = execute(SPEC, GpuHealthParams(sample_s=5.0), timeout_s=120)
    finally:
        load.kill()
        load.wait(timeout=30)
    _report("under load", r)
    _assert_healthy(r)
    mine = [h for g in r.gpus for h in g.holders if h.pid == load.pid]
    assert mine and all(h.mine for h in mine), [h for g in r.gpus for h in g.holders]
