"""A small data-parallel training loop for drills: gloo on CPU, one rank per SLURM task.

Nothing in it knows mleng. Each step: load a batch (rank DRILL_SLOW_RANK sleeps DRILL_LOADER_SLEEP_S in
its loader when set), a forward/backward of a small MLP, an all_reduce of the gradients, an optimizer
step. Rank 0 prints one line per step with its step time, as training scripts do. Each rank writes its
pid to $DRILL_WORK/rank<R>.pid so a drill can signal it; rank 0 touches rank0.steps once it has run.
"""

import os
import time

import torch
import torch.distributed as dist

rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
work = os.environ["DRILL_WORK"]
steps = int(os.environ.get("DRILL_STEPS", "100000"))
slow = int(os.environ["DRILL_SLOW_RANK"]) if os.environ.get("DRILL_SLOW_RANK") else None
loader_sleep = float(os.environ.get("DRILL_LOADER_SLEEP_S", "0"))
torch.set_num_threads(1)
with open(os.path.join(work, f"rank{rank}.pid"), "w") as f:
    f.write(str(os.getpid()))
dist.init_process_group("gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                        rank=rank, world_size=world)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
generator = torch.Generator().manual_seed(rank)


def load_batch():
    if rank == slow and loader_sleep:
        time.sleep(loader_sleep)
    return torch.randn(64, 256, generator=generator)


for step in range(steps):
    t0 = time.perf_counter()
    batch = load_batch()
    loss = model(batch).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    optimizer.step()
    if rank == 0:
        print(f"step {step} loss {loss.item():.4f} step_time_ms {1000 * (time.perf_counter() - t0):.1f}", flush=True)
        if step == 5:
            open(os.path.join(work, "rank0.steps"), "w").close()
dist.destroy_process_group()
