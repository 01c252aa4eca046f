"""Rank-side runtime shared by the distributed tools (dist_smoke_test, collective_bench).

Every rank is started by torchrun as `python -m tools._ranks <job> '<params json>'`. It reports what it
is doing on a side channel: one JSON line per event on its stdout, prefixed with EVENT_PREFIX, written
with a single os.write so lines from several ranks never interleave. torchrun passes worker stdout
through (and srun forwards it from every node), so the launcher (tools/_launch.py) sees each rank's
last stage even when the rank then hangs, dies or is killed: exit codes alone cannot say which rank
hung (torchrun reports every rank it killed as -15, the hung one included).

Events: start (rank, host, pid), stage (entering a named stage), data (a job's payload), error
(a Python exception, with the stage it was raised in), terminated (SIGTERM from torchrun/the
launcher: this rank was a bystander), done. A rank that vanishes without done/error/terminated crashed
(abort, segfault, os._exit, OOM kill) at its last stage.

Only the standard library is imported at module level; torch is imported inside the jobs, after
the start event, so that a rank stuck importing torch is visible as such.
"""

import json
import os
import signal
import socket
import sys
import threading
import time

EVENT_PREFIX = "@@mleng-rank "


class RankReporter:
    """Writes this rank's events to the side channel and times its stages."""

    def __init__(self):
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.host = socket.gethostname()
        self.stage_name = "start"
        self._stage_t0 = time.monotonic()
        self.stage_seconds: dict[str, float] = {}

    def emit(self, event: str, **data) -> None:
        record = {"ev": event, "rank": self.rank, "local_rank": self.local_rank,
                  "world_size": self.world_size, "host": self.host, "pid": os.getpid(),
                  "stage": self.stage_name, "t": time.time(), **data}
        line = (EVENT_PREFIX + json.dumps(record, default=str) + "\n").encode()
        try:
            os.write(1, line)
        except OSError:
            pass  # the launcher went away; nothing useful left to do with the event

    def stage(self, name: str) -> None:
        """Close the current stage (recording its seconds) and enter `name`."""
        now = time.monotonic()
        self.stage_seconds[self.stage_name] = round(now - self._stage_t0, 4)
        self.stage_name, self._stage_t0 = name, now
        self.emit("stage")

    def finish(self) -> None:
        self.stage("done")
        self.emit("done", stage_seconds=self.stage_seconds)


def _watch_sigterm(reporter: RankReporter) -> None:
    """Report SIGTERM even while the main thread is blocked inside a C++ collective.

    A Python signal handler only runs between bytecodes of the main thread, i.e. not while it waits
    in gloo/NCCL. So SIGTERM is blocked in every thread (set before torch starts its own threads) and
    one thread takes it with sigwait, reports the stage the rank was in, and exits.
    """
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def wait_for_term():
        signal.sigwait({signal.SIGTERM})
        reporter.emit("terminated")
        os._exit(128 + signal.SIGTERM)

    threading.Thread(target=wait_for_term, name="mleng-sigterm", daemon=True).start()


def run_job(job: str, params: dict) -> int:
    reporter = RankReporter()
    _watch_sigterm(reporter)
    reporter.emit("start", argv=sys.argv[1:2])
    try:
        if job == "smoke":
            smoke_job(reporter, params)
        elif job == "bench":
            from tools._collectives import bench_job
            bench_job(reporter, params)
        else:
            raise ValueError(f"unknown job {job!r}")
    except BaseException as exc:  # report everything, including SystemExit from a library
        reporter.emit("error", error_type=type(exc).__name__, error=str(exc)[:2000])
        return 1
    reporter.finish()
    return 0


# ---------------------------------------------------------------------------------------------------
# dist_smoke_test, rank side

# Faults a rank can be told to inject, to prove the tool names the culprit (tests, self-checks).
FAULTS = ("none", "exit_in_init", "sleep_before_all_reduce", "wrong_size")


def pick_device(backend: str, local_rank: int):
    """(backend, torch.device) for this rank: NCCL on cuda:<local_rank> when GPUs exist, else gloo/CPU."""
    import torch

    if backend == "auto":
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError("backend nccl asked for, but torch sees no CUDA device on this rank")
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"local rank {local_rank} has no GPU: only {torch.cuda.device_count()} visible")
        torch.cuda.set_device(local_rank)
        return backend, torch.device("cuda", local_rank)
    return backend, torch.device("cpu")


def rank_versions(device) -> dict:
    """Versions that must agree across ranks (torch, CUDA, NCCL, driver), plus this rank's device."""
    import torch

    info = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
            "nccl": None, "driver": None, "device": str(device), "device_name": "cpu"}
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception:
            pass
        try:
            import pynvml

            pynvml.nvmlInit()
            driver = pynvml.nvmlSystemGetDriverVersion()
            info["driver"] = driver.decode() if isinstance(driver, bytes) else driver
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return info


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
    if len(sys.argv) != 3:
        sys.exit("usage: python -m tools._ranks <smoke|bench> '<params json>' (started by torchrun)")
    code = run_job(sys.argv[1], json.loads(sys.argv[2]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: a half-torn-down NCCL communicator can hang at exit
