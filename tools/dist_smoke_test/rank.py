"""dist_smoke_test, rank side: init, barrier, a size check, all_reduce, verify, allocate, destroy.

Started by torchrun on every rank as `python -m tools.dist_smoke_test.rank '<params json>'`; each stage
is reported on the side channel (tools/shared/ranks.py) so the launcher can say where a rank stopped.
"""

import os
import time

from ..shared.ranks import RankReporter, pick_device, rank_main, rank_versions

# Faults a rank can be told to inject, to prove the tool names the culprit (tests, self-checks).
FAULTS = ("none", "exit_in_init", "sleep_before_all_reduce", "wrong_size")



def check_same_sizes(sizes: list[int]) -> list[int]:
    """Ranks whose element count differs from the most common one (empty when all agree)."""
    common = max(set(sizes), key=sizes.count)
    return [rank for rank, size in enumerate(sizes) if size != common]


def smoke_job(rep: RankReporter, params: dict) -> None:
    timeout_s = float(params.get("timeout_s", 60))
    numel = int(params.get("numel", 1 << 20))
    fault = params.get("fault", "none") if rep.rank == params.get("fault_rank", 1) else "none"

    rep.stage("import_torch")
    import datetime

    import torch
    import torch.distributed as dist

    backend, device = pick_device(params.get("backend", "auto"), rep.local_rank)
    rep.emit("data", kind="versions", versions=rank_versions(device), backend=backend)

    rep.stage("init")
    if fault == "exit_in_init":
        os._exit(3)
    timeout = datetime.timedelta(seconds=timeout_s)
    if device.type == "cuda":  # device_id: create the NCCL communicator now, inside this stage
        dist.init_process_group(backend, timeout=timeout, device_id=device)
    else:
        dist.init_process_group(backend, timeout=timeout)

    rep.stage("barrier")
    dist.barrier()

    # Exchange element counts first: a rank with a different tensor size would make gloo abort
    # the *other* rank (a victim) inside all_reduce, or NCCL hang; compared here, the odd rank is named.
    rep.stage("shape_check")
    my_numel = numel + 1 if fault == "wrong_size" else numel
    gathered = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(rep.world_size)]
    dist.all_gather(gathered, torch.tensor([my_numel], dtype=torch.int64, device=device))
    sizes = [int(t.item()) for t in gathered]
    odd = check_same_sizes(sizes)
    if odd:
        rep.emit("data", kind="culprits", ranks=odd, reason="tensor size differs from the other ranks",
                 sizes=sizes)
        raise RuntimeError(f"tensor sizes differ across ranks: {sizes} (element counts by rank)")
    if fault == "sleep_before_all_reduce":
        time.sleep(timeout_s * 3 + 30)

    rep.stage("all_reduce")
    data = torch.full((numel,), float(rep.rank + 1), dtype=torch.float32, device=device)
    work = dist.all_reduce(data, async_op=True)
    if params.get("watchdog_only") and device.type == "cuda":
        # Leave timeouts to NCCL's watchdog (what a training job sees): it dumps the flight recorder
        # (TORCH_NCCL_DUMP_ON_TIMEOUT=1) and tears the process down. Used to record real FR dumps.
        work.wait()
    else:
        work.wait(timeout=timeout)
    if device.type == "cuda":
        torch.cuda.synchronize(device)

    rep.stage("verify")
    expected = rep.world_size * (rep.world_size + 1) / 2  # sum of 1..n: exact in float32 here
    wrong = int((data != expected).sum().item())
    rep.emit("data", kind="verify", wrong_elements=wrong, numel=numel, expected=expected)
    if wrong:
        raise RuntimeError(f"all_reduce returned {wrong} wrong elements of {numel} (expected {expected})")

    rep.stage("alloc")
    block = torch.empty(int(params.get("alloc_mib", 64)) << 20, dtype=torch.uint8, device=device)
    block.fill_(1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    del block

    rep.stage("destroy")
    dist.destroy_process_group()


if __name__ == "__main__":
    rank_main(smoke_job)
