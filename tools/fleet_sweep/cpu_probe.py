"""fleet_sweep's CPU-side check: single-thread FP32 matmul and memory-copy throughput of one core.

This is a probe for comparing nodes with each other, not a benchmark of the CPU: one thread, a
256x256 FP32 matmul (2*256^3 FLOP each) and a 64 MiB tensor copy (read + write counted once, like
`memcpy` figures), each timed over `windows` windows of `window_s` seconds, the two alternating; the
figure is the best window. Windows longer than the scheduler's quota period (100 ms for a CFS cgroup limit) make a node
whose processes are CPU-limited (a cgroup quota, a thermally throttled CPU, a wrong power governor)
read low instead of averaging its bursts at full speed; taking the best of several windows keeps a
busy moment (another process on the core) from reading as a slow node. No expected figure: CPUs
differ too much; only the fleet median judges it.
"""

from __future__ import annotations

import os
import time

from ..engine.figures import Figure, Measured, SweepContract

MATMUL_N = 256
COPY_BYTES = 64 << 20


def _rate(work, units_per_call: float, window_s: float) -> float:
    """Units done per second while calling work() for window_s."""
    calls, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < window_s:
        work()
        calls += 1
    return calls * units_per_call / elapsed


def measure(window_s: float = 0.3, windows: int = 6) -> dict:
    """{"matmul_gflops": GFLOP/s (1e9), "copy_gbps": GB/s (1e9 bytes), "threads": 1, "node_type"}."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.rand(MATMUL_N, MATMUL_N)
        b = torch.rand(MATMUL_N, MATMUL_N)
        src = torch.empty(COPY_BYTES // 4)
        dst = torch.empty_like(src)
        src.fill_(1.0)
        dst.copy_(src)  # touch both buffers once: page faults are not throughput
        gflops = gbps = 0.0
        for _ in range(windows):  # alternate, so both figures see the same moments of a busy machine
            gflops = max(gflops, _rate(lambda: torch.mm(a, b), 2 * MATMUL_N ** 3 / 1e9, window_s))
            gbps = max(gbps, _rate(lambda: dst.copy_(src), COPY_BYTES / 1e9, window_s))
    finally:
        torch.set_num_threads(threads)
    return {"matmul_gflops": round(gflops, 2), "copy_gbps": round(gbps, 2), "threads": 1, "node_type": node_type()}


MATMUL = Figure("matmul_gflops", "GFLOP/s", "higher")
COPY = Figure("copy_gbps", "GB/s", "higher")
# No expected figure (CPUs differ too much); compared within the node type (CPU model and count).
SWEEP = SweepContract(figures=(MATMUL, COPY), read=lambda res: [
    Measured(MATMUL, res["matmul_gflops"], group=res.get("node_type")), Measured(COPY, res["copy_gbps"], group=res.get("node_type"))])


def node_type() -> str:
    """CPU model and count: nodes of one type are compared with each other."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{model or 'unknown CPU'} x{os.cpu_count()}"
