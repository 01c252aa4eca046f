"""Rank-side runtime shared by the distributed tools (dist_smoke_test, collective_bench).

Every rank is started by torchrun as `python -m tools.<tool>.rank '<params json>'`, a tool's own
rank module whose `__main__` calls `rank_main(job)`. It reports what it
is doing on mleng's one side channel (tools/shared/sidechannel.py: JSON lines on its stdout, each one
os.write, so lines from several ranks never interleave). torchrun passes worker stdout
through (and srun forwards it from every node), so the launcher (tools/shared/launch.py) sees each rank's
last stage even when the rank then hangs, dies or is killed: exit codes alone cannot say which rank
hung (torchrun reports every rank it killed as -15, the hung one included).

Events: start (rank, host, pid), stage (entering a named stage), data (a job's payload), error
(a Python exception, with the stage it was raised in), terminated (SIGTERM from torchrun/the
launcher: this rank was a bystander), done, and beat (every HEARTBEAT_S from a thread of its own, while
the main thread may sit in a collective): a rank whose beats stop while the others' go on is frozen
(SIGSTOP, a cgroup freezer, a stalled node), not waiting on a peer. A rank that vanishes without
done/error/terminated crashed (abort, segfault, os._exit, OOM kill) at its last stage.

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

from .sidechannel import Refused, emit

EVENTS = ("start", "stage", "data", "error", "terminated", "done", "beat")
HEARTBEAT_S = 1.0  # gloo and NCCL waits release the GIL, so the beat thread runs while a collective waits


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
        emit(record)

    def stage(self, name: str) -> None:
        """Close the current stage (recording its seconds) and enter `name`."""
        now = time.monotonic()
        self.stage_seconds[self.stage_name] = round(now - self._stage_t0, 4)
        self.stage_name, self._stage_t0 = name, now
        self.emit("stage")

    def finish(self) -> None:
        self.stage("done")
        self.emit("done", stage_seconds=self.stage_seconds)


def check_event(event: dict) -> dict:
    """The launcher's check of one rank event (the side channel's `check`): the fields the launcher
    reads have their types; anything else raises Refused and the line is skipped."""
    if event.get("ev") not in EVENTS:
        raise Refused(f"ev must be one of {', '.join(EVENTS)}")
    for name in ("rank", "world_size", "local_rank", "pid"):
        value = event.get(name, 0)
        if type(value) is not int or not 0 <= value < 1 << 31:
            raise Refused(f"{name} must be a whole number >= 0")
    for name in ("host", "stage", "error"):
        if not isinstance(event.get(name, ""), (str, type(None))):
            raise Refused(f"{name} must be text")
    if type(event.get("t", 0.0)) not in (int, float) or not isinstance(event.get("stage_seconds", {}), dict):
        raise Refused("t must be a number, stage_seconds an object")
    return event


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


def _beat(reporter: RankReporter) -> None:
    """A heartbeat on the side channel until the process ends (a daemon thread)."""
    def beat():
        while True:
            time.sleep(HEARTBEAT_S)
            reporter.emit("beat")

    threading.Thread(target=beat, name="mleng-beat", daemon=True).start()


def run_rank(job, params: dict) -> int:
    """Run `job(reporter, params)` as this rank, reporting start, errors and done on the side channel."""
    # The run's NCCL settings (shared/nccl_env.py, checked by the launcher) before any communicator
    # exists: NCCL reads its environment when the first one is created.
    os.environ.update(params.get("nccl_env") or {})
    reporter = RankReporter()
    _watch_sigterm(reporter)
    reporter.emit("start", argv=sys.argv[1:2])
    _beat(reporter)
    try:
        job(reporter, params)
    except BaseException as exc:  # report everything, including SystemExit from a library
        reporter.emit("error", error_type=type(exc).__name__, error=str(exc)[:2000])
        return 1
    reporter.finish()
    return 0


def rank_main(job) -> None:
    """The `__main__` of a tool's rank module: `python -m PACKAGE.<tool>.rank '<params json>'`."""
    if len(sys.argv) != 2:
        sys.exit("usage: python -m <tool>.rank '<params json>' (started by torchrun)")
    code = run_rank(job, json.loads(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: a half-torn-down NCCL communicator can hang at exit


# ---------------------------------------------------------------------------------------------------
# Devices and versions, as every distributed job sees them

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
