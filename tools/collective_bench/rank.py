"""collective_bench rank side, and the nccl-tests conventions it follows (pure helpers, no torch at import).

Sizes are nccl-tests' "size" column: the bytes of the larger buffer of the op (all_gather: the
gathered output; reduce_scatter: the full input; all_to_all: what each rank sends in total).
algbw = size / time; busbw = algbw x factor (nccl-tests doc/PERFORMANCE.md; knowledge://network/busbw.md):
all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n; broadcast 1; 0 with one rank.

Timing follows nccl-tests: warm-up, then `iters` calls launched back to back and timed as one batch
(CUDA events on GPUs, queued behind a short GPU sleep so host launch cost does not leave gaps between
small calls; wall clock around the batch on CPU), slowest rank's time; `blocking` instead
synchronises around every call (what a naive loop measures: small messages look much slower).
Correctness: after timing, inputs are refilled with exact values, the op runs once more, and wrong
elements are counted on every rank and summed.
"""

import dataclasses
import os
import time
from collections.abc import Callable

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
BROADCAST_VALUE = 7.0   # what rank 0 broadcasts; every other rank starts from 0


@dataclasses.dataclass(frozen=True)
class Collective:
    """Everything collective_bench knows about one op, in one place (nccl-tests keeps a struct per op).

    size is nccl-tests' "size": the bytes of the larger buffer. `sharded` ops hand each rank size / n
    of it. `layout` says what the (input, output) buffers are: "full" (size bytes), "share" (size / n)
    or "same" (in place: the input buffer). `launch(dist, inp, out)` runs it once; `expect` names what
    the output holds after `fill`: "sum" (the sum over ranks), "root" (rank 0's value) or "chunks"
    (chunk j came from rank j).
    """

    name: str
    bus_factor: Callable[[int], float]
    sharded: bool
    layout: tuple[str, str]
    launch: Callable
    expect: str

    def busbw_factor(self, world_size: int) -> float:
        return self.bus_factor(world_size) if world_size > 1 else 0.0

    def buffer_bytes(self, size: int, world_size: int) -> int:
        """Device memory one rank needs at `size`: input plus output buffers."""
        share = size // max(world_size, 1)
        return sum({"full": size, "share": share, "same": 0}[b] for b in self.layout)


COLLECTIVES = {c.name: c for c in (
    Collective("all_reduce", lambda n: 2 * (n - 1) / n, sharded=False, layout=("full", "same"),
               launch=lambda d, inp, out: d.all_reduce(inp), expect="sum"),
    Collective("all_gather", lambda n: (n - 1) / n, sharded=True, layout=("share", "full"),
               launch=lambda d, inp, out: d.all_gather_into_tensor(out, inp), expect="chunks"),
    Collective("reduce_scatter", lambda n: (n - 1) / n, sharded=True, layout=("full", "share"),
               launch=lambda d, inp, out: d.reduce_scatter_tensor(out, inp), expect="sum"),
    Collective("all_to_all", lambda n: (n - 1) / n, sharded=True, layout=("full", "full"),
               launch=lambda d, inp, out: d.all_to_all_single(out, inp), expect="chunks"),
    Collective("broadcast", lambda n: 1.0, sharded=False, layout=("full", "same"),
               launch=lambda d, inp, out: d.broadcast(inp, src=0), expect="root"),
)}
OPS = tuple(COLLECTIVES)


def busbw_factor(op: str, world_size: int) -> float:
    if op not in COLLECTIVES:
        raise ValueError(f"unknown op {op!r}")
    return COLLECTIVES[op].busbw_factor(world_size)


def size_sweep(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    """min, min*f, min*f^2 ... up to max (both inclusive when on the ladder), like nccl-tests -b -e -f."""
    sizes, size = [], min_bytes
    while size <= max_bytes:
        sizes.append(size)
        if factor <= 1:
            break
        size *= factor
    return sizes


def round_size(size: int, op: str, world_size: int, elem_bytes: int) -> int:
    """Bytes rounded down so each rank's share is whole elements (at least one per rank)."""
    unit = elem_bytes * (world_size if COLLECTIVES[op].sharded else 1)
    return max(unit, size - size % unit)


def buffer_bytes(op: str, size: int, world_size: int) -> int:
    """Device memory one rank needs for `op` at `size`: input plus output buffers."""
    return COLLECTIVES[op].buffer_bytes(size, world_size)


def bandwidths(op: str, size: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (decimal) for one call of `op` moving `size` bytes in `seconds`."""
    algbw = size / seconds / 1e9 if seconds > 0 else 0.0
    return algbw, algbw * busbw_factor(op, world_size)


def exact_value_base(dtype: str, world_size: int) -> float:
    """Per-rank fill step so sums over ranks stay exactly representable (bf16 has 8 bits of mantissa)."""
    limit = {"float32": 1 << 24, "bfloat16": 256, "float16": 2048}[dtype]
    return 1.0 if world_size * (world_size + 1) / 2 <= limit else 0.0


def rdma_ports(sysfs: str = "/sys") -> list[dict]:
    """InfiniBand/RoCE ports of this node from sysfs: name, rate (Gb/s), active, link layer."""
    import glob

    def read(path):
        try:
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return ""

    ports = []
    for port in sorted(glob.glob(os.path.join(sysfs, "class", "infiniband", "*", "ports", "*"))):
        dev = os.path.basename(os.path.dirname(os.path.dirname(port)))
        rate = read(os.path.join(port, "rate")).split(" ")[0]
        ports.append({"name": f"{dev}/{os.path.basename(port)}",
                      "rate_gbits": float(rate) if rate.replace(".", "", 1).isdigit() else None,
                      "active": "ACTIVE" in read(os.path.join(port, "state")),
                      "link_layer": read(os.path.join(port, "link_layer")) or None})
    return ports


# ---------------------------------------------------------------------------------------------------
# Rank side (torch imported inside)

class _Op:
    """Buffers for one op at one size, laid out as its Collective record says; `fill` + `count_wrong`
    for the correctness check."""

    def __init__(self, torch, dist, op, size, dtype, device, rank, world):
        self.torch, self.dist, self.coll, self.rank, self.world = torch, dist, COLLECTIVES[op], rank, world
        count = size // DTYPE_BYTES[dtype]
        kw = {"dtype": getattr(torch, dtype), "device": device}
        sizes = {"full": count, "share": count // world}
        in_kind, out_kind = self.coll.layout
        self.inp = torch.empty(sizes[in_kind], **kw)
        self.out = self.inp if out_kind == "same" else torch.empty(sizes[out_kind], **kw)
        self.step = exact_value_base(dtype, world)

    def __call__(self):
        self.coll.launch(self.dist, self.inp, self.out)

    def fill(self):
        """Inputs such that every output element is known exactly."""
        if self.coll.expect == "root":
            self.inp.fill_(BROADCAST_VALUE if self.rank == 0 else 0.0)
        else:
            self.inp.fill_((self.rank + 1) * self.step if self.step else 1.0)

    def count_wrong(self) -> int:
        torch, n = self.torch, self.world
        if self.coll.expect == "root":
            return int((self.out != BROADCAST_VALUE).sum().item())
        if self.coll.expect == "sum":
            expected = n * (n + 1) / 2 if self.step else float(n)
            return int((self.out != expected).sum().item())
        # "chunks": chunk j of the output came from rank j
        expect = (torch.arange(n, device=self.out.device, dtype=self.out.dtype) + 1) if self.step else \
            torch.ones(n, device=self.out.device, dtype=self.out.dtype)
        return int((self.out.view(n, -1) != expect.view(n, 1)).sum().item())


def _time_batch(op: _Op, iters: int, blocking: bool, device, torch, dist) -> float:
    """Seconds per call on this rank."""
    cuda = device.type == "cuda"
    dist.barrier()
    if cuda:
        torch.cuda.synchronize(device)
    if blocking:
        total = 0.0
        for _ in range(iters):
            dist.barrier()
            if cuda:
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            op()
            if cuda:
                torch.cuda.synchronize(device)
            total += time.perf_counter() - t0
        return total / iters
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # Keep the GPU busy while the host queues the batch: the ~20-30 us of Python/torch work per call
        # then overlaps the queue instead of showing up between small collectives, as in nccl-tests
        # (C launches) or a training step whose host runs ahead. The wait is outside the timed events.
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(int(2e9 * min(0.02, 60e-6 * iters)))  # cycles at ~2 GHz
        start.record()
        for _ in range(iters):
            op()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        op()
    return (time.perf_counter() - t0) / iters


def _size_cap(torch, dist, device, world: int) -> int:
    """Bytes of buffers one rank may allocate: the smallest free memory over ranks, less headroom."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        free = max(0, int(free * 0.85) - (2 << 30))  # NCCL's own buffers and workspace
    else:
        import psutil
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        free = int(psutil.virtual_memory().available * 0.5 / max(local, 1))
    t = torch.tensor([free], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


def bench_job(rep, params: dict) -> None:
    import datetime
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)  # *_tensor ops renamed in newer torch
    rep.stage("import_torch")
    import torch
    import torch.distributed as dist

    from ..shared.ranks import pick_device, rank_versions

    backend, device = pick_device(params.get("backend", "auto"), rep.local_rank)
    rep.stage("init")
    timeout = datetime.timedelta(seconds=float(params.get("timeout_s", 120)))
    if device.type == "cuda":
        dist.init_process_group(backend, timeout=timeout, device_id=device)
    else:
        dist.init_process_group(backend, timeout=timeout)
    world, rank = dist.get_world_size(), dist.get_rank()
    dtype = params.get("dtype", "float32")
    if rank == 0:
        env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        rep.emit("data", kind="setup", versions=rank_versions(device), backend=backend, world_size=world,
                 local_world_size=local_world, nccl_env=env,
                 rdma_ports=rdma_ports() if local_world < world else [])
    cap = _size_cap(torch, dist, device, world)
    sizes = size_sweep(int(params["min_bytes"]), int(params["max_bytes"]), int(params["factor"]))
    plant = params.get("plant_error_rank")
    for op_name in params["ops"]:
        for size in sizes:
            size = round_size(size, op_name, world, DTYPE_BYTES[dtype])
            if buffer_bytes(op_name, size, world) * 1.25 > cap:  # + the check's temporary mask
                if rank == 0:
                    rep.emit("data", kind="skipped", op=op_name, bytes=size, cap_bytes=cap)
                continue
            rep.stage(f"{op_name} {size}")
            op = _Op(torch, dist, op_name, size, dtype, device, rank, world)
            op.fill()
            for _ in range(int(params["warmup"])):
                op()
            seconds = _time_batch(op, int(params["iters"]), bool(params.get("blocking")), device, torch, dist)
            op.fill()
            op()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if plant is not None and rank == plant:
                op.out.view(-1)[0] = -3.0  # self-test: a corrupted element the check must count
            slowest = torch.tensor([seconds], dtype=torch.float64, device=device)
            wrong = torch.tensor([op.count_wrong()], dtype=torch.int64, device=device)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            dist.all_reduce(wrong, op=dist.ReduceOp.SUM)
            seconds, wrong = float(slowest.item()), int(wrong.item())
            if rank == 0:
                algbw, busbw = bandwidths(op_name, size, seconds, world)
                rep.emit("data", kind="row", op=op_name, bytes=size, count=size // DTYPE_BYTES[dtype],
                         dtype=dtype, time_us=round(seconds * 1e6, 3), algbw_gbps=round(algbw, 6),
                         busbw_gbps=round(busbw, 6), wrong=wrong)
            del op
            if device.type == "cuda" and size >= 1 << 30:
                torch.cuda.empty_cache()  # give GiB-sized blocks back so the next op's buffers fit
    rep.stage("destroy")
    dist.destroy_process_group()


if __name__ == "__main__":
    from ..shared.ranks import rank_main

    rank_main(bench_job)
