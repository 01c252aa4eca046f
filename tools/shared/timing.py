"""Per-iteration timing shared by the compute benchmarks (imports torch lazily; child process only).

Each iteration is timed alone: `before()` (cache flush, output refresh...) runs outside the timed
region, then a pair of CUDA/HIP events brackets `op()` only. All iterations are queued back to back
and read after one synchronize, so no host round-trip sits between them. On the CPU the same loop
uses perf_counter.
"""

import time
from collections.abc import Callable


def iteration_times(op: Callable[[], object], iterations: int, device, before: Callable[[], object] | None = None) -> list[float]:
    """Seconds per iteration of op() on `device` ('cpu' or a torch device)."""
    if str(device) == "cpu":
        out = []
        for _ in range(iterations):
            if before:
                before()
            t0 = time.perf_counter()
            op()
            out.append(time.perf_counter() - t0)
        return out
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    for start, end in zip(starts, ends, strict=True):
        if before:
            before()
        start.record()
        op()
        end.record()
    torch.cuda.synchronize(device)
    return [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True)]
