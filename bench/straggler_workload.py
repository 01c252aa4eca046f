"""A small data-parallel training loop on gloo, with nothing of mleng in it: what straggler_find reads.

Each step loads a batch (optionally slow on one rank), computes (matmuls on the CPU), all_reduces
the gradient and applies it, so every rank runs at the pace of the slowest, as in real synchronous
data parallel. It prints one `step N rank R step_ms X` line per step on rank 0 and, at the end,
`result <checksum>`: the same on every run with the same arguments, whatever watched it.

    # one node, four ranks
    torchrun --standalone --nproc-per-node 4 bench/straggler_workload.py --steps 200
    # under SLURM, one rank per node (rank and world from SLURM_PROCID / SLURM_NTASKS)
    srun -N4 -n4 python bench/straggler_workload.py --master mln1 --steps 200
    # one rank with a slow loader (0.2 s per batch on rank 2)
    srun -N4 -n4 python bench/straggler_workload.py --master mln1 --slow-loader-rank 2 --loader-sleep-s 0.2
    # a small straggler: rank 3 sleeps 15% of its own recent step time, ~15% slower whatever the host's load
    srun -N4 -n4 python bench/straggler_workload.py --master mln1 --slow-loader-rank 3 --loader-sleep-fraction 0.15
    # a compute straggler: rank 3 runs 15% more matmuls per step than the others (CPU work, no sleep)
    torchrun --standalone --nproc-per-node 4 bench/straggler_workload.py --slow-compute-rank 3 --extra-compute-fraction 0.15
    # paced by its input: every rank's loader takes 0.05 s a batch (a live job that leaves the CPUs mostly idle)
    torchrun --standalone --nproc-per-node 2 bench/straggler_workload.py --pace-s 0.05 --dim 128
    # writing its flight recorder every 20 steps, as a job that dumps it periodically would
    TORCH_FR_DUMP_TEMP_FILE=/tmp/fr/rank_ torchrun --standalone --nproc-per-node 4 bench/straggler_workload.py --fr-dump-every 20

The fault drills (tools/evals/drills) run it as their training job, with --pid-dir so that a drill can
SIGSTOP one rank from outside.
"""

import argparse
import collections
import os
import statistics
import time


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--dim", type=int, default=384, help="matrix size of the compute (CPU matmuls)")
    ap.add_argument("--matmuls", type=int, default=8, help="matmuls per step")
    ap.add_argument("--grad-floats", type=int, default=65536, help="floats all_reduced per step (256 KiB)")
    ap.add_argument("--slow-loader-rank", type=int, default=-1, help="this rank sleeps in its loader")
    ap.add_argument("--loader-sleep-s", type=float, default=0.2)
    ap.add_argument("--pace-s", type=float, default=0.0, help="every rank's loader sleeps this long a batch (a job "
                    "paced by its input, as tests that only need a live job want; the slow rank's stall comes on top)")
    ap.add_argument("--loader-sleep-fraction", type=float, default=0.0, help="instead of --loader-sleep-s: "
                    "sleep this fraction of the rank's median step time over its last 20 steps (sleep not counted)")
    ap.add_argument("--slow-compute-rank", type=int, default=-1, help="this rank does more matmuls per step")
    ap.add_argument("--extra-compute-fraction", type=float, default=0.15, help="its extra matmuls, a fraction of "
                    "--matmuls (owed and run whole: 0.15 of 8 is one extra matmul most steps, two every fifth)")
    ap.add_argument("--fr-dump-every", type=int, default=0, help="write the flight recorder to "
                    "$TORCH_FR_DUMP_TEMP_FILE<rank> every N steps (0: never)")
    ap.add_argument("--master", default="127.0.0.1", help="first node's address (srun; torchrun gives its own)")
    ap.add_argument("--port", type=int, default=29531, help="rendezvous port (srun; torchrun gives its own)")
    ap.add_argument("--pid-dir", help="each rank writes its pid to PID_DIR/rank<R>.pid (to be signalled from outside)")
    return ap.parse_args()


class LoaderStall:
    """The slow rank's loader stall: a fixed sleep per batch, or a fraction of its own recent step time.

    The fraction follows the step: on a shared host the step time moves with the load, and a fixed sleep
    that was 15% of a step at one load is 8% at another. The slow rank's own step time, less its sleep,
    is the healthy pace (the others wait for it, it waits for nobody). What it owes is kept as a debt and
    slept once it reaches MIN_SLEEP_S, less what earlier sleeps overran: a 1 ms sleep on a loaded host
    lasts several, and would make a 15% straggler of a 7 ms step a 50% one. --pace-s adds the same sleep on every
    rank, the slow one's stall on top."""

    MIN_SLEEP_S = 0.002

    def __init__(self, rank: int, args):
        self.on = rank == args.slow_loader_rank
        self.pace_s = getattr(args, "pace_s", 0.0)     # a Namespace made by hand (tests/test_drills.py) may lack it
        self.fixed_s, self.fraction = args.loader_sleep_s, args.loader_sleep_fraction
        self.recent_s = collections.deque(maxlen=20)   # its last step times without the stall
        self.owed_s = 0.0
        self.slept_s = 0.0                             # this step's

    def per_step_s(self) -> float:
        return self.pace_s + self.stall_s()

    def stall_s(self) -> float:
        if not self.on:
            return 0.0
        if not self.fraction:
            return self.fixed_s
        return self.fraction * statistics.median(self.recent_s) if len(self.recent_s) >= 5 else 0.0

    def due_s(self) -> float:
        """What to sleep now: the debt once it reaches MIN_SLEEP_S, else 0 (the debt grows)."""
        self.owed_s += self.per_step_s()
        return self.owed_s if self.owed_s >= self.MIN_SLEEP_S else 0.0

    def paid(self, slept_s: float) -> None:
        self.slept_s = slept_s
        self.owed_s -= slept_s

    def step_done(self, step_s: float) -> None:
        self.recent_s.append(step_s - self.slept_s)
        self.slept_s = 0.0


def load_batch(step: int, rank: int, stall: LoaderStall, args, torch):
    """The data loader: a deterministic batch; the slow rank sleeps here, as a stalled reader would."""
    due_s = stall.due_s()
    if due_s:      # the sleep itself in this frame: the stack a sampler sees is the loader's
        t0 = time.perf_counter()
        time.sleep(due_s)
        stall.paid(time.perf_counter() - t0)
    gen = torch.Generator().manual_seed(step * 1000 + rank)
    return torch.randn(args.dim, args.dim, generator=gen)


def dump_flight_recorder(rank: int, torch) -> None:
    """This rank's flight recorder where torch's own dump goes (<prefix><rank>), whole or not at all."""
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE")
    if not prefix:
        return
    # No stack traces: the first dump with them costs 1-3 s of symbolizing, a visible stall in the loop.
    data = torch._C._distributed_c10d._dump_fr_trace(True, False, False)
    with open(f"{prefix}{rank}.tmp", "wb") as f:
        f.write(data)
    os.replace(f"{prefix}{rank}.tmp", f"{prefix}{rank}")


class ExtraCompute:
    """The compute straggler's surplus: fraction x matmuls extra per step, kept as a debt and run in whole
    matmuls, so over a window it does (1 + fraction) times the others' work in the same frames they do."""

    def __init__(self, rank: int, args):
        self.per_step = args.extra_compute_fraction * args.matmuls if rank == args.slow_compute_rank else 0.0
        self.owed = 0.0

    def due(self) -> int:
        self.owed += self.per_step
        whole = int(self.owed)
        self.owed -= whole
        return whole


def compute(batch, weight, args, torch, extra: int = 0):
    out = batch
    for _ in range(args.matmuls + extra):
        out = torch.tanh(out @ weight)
    return out.mean(dim=0)


def main():
    args = parse_args()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))
    if args.pid_dir:
        with open(os.path.join(args.pid_dir, f"rank{rank}.pid"), "w") as f:
            f.write(str(os.getpid()))
    # torchrun already runs a store at MASTER_ADDR:MASTER_PORT (env://); srun tasks meet at --master:--port.
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    init = "env://" if under_torchrun else f"tcp://{args.master}:{args.port}"
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    weight = torch.eye(args.dim) * 0.5
    grad = torch.zeros(args.grad_floats)
    stall = LoaderStall(rank, args)
    surplus = ExtraCompute(rank, args)
    for step in range(args.steps):
        t0 = time.perf_counter()
        batch = load_batch(step, rank, stall, args, torch)
        update = compute(batch, weight, args, torch, surplus.due())
        grad[: update.numel()] = update
        dist.all_reduce(grad)
        weight += 1e-3 * grad[: args.dim].view(1, -1) / world
        if args.fr_dump_every and (step + 1) % args.fr_dump_every == 0:
            dump_flight_recorder(rank, torch)
        stall.step_done(time.perf_counter() - t0)
        if rank == 0:
            print(f"step {step} rank {rank} step_ms {1000 * (time.perf_counter() - t0):.1f}", flush=True)
    if rank == 0:
        print(f"result {weight.double().sum().item():.9e}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
