"""Test-only tools for fault injection (not in the registry: they live outside tools/)."""

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

from tools.engine.spec import Field, Params, Result, ToolSpec


class FaultParams(Params):
    pid_file: str = Field("", description="Where the child writes its pid (and its grandchild's).")
    seconds: float = Field(0.0, ge=0, le=3600, description="How long to sleep.")
    log_file: str = Field("", description="Where the gpu-locked tool appends start/end times.")


class FaultResult(Result):
    slept_s: float | None = Field(None, description="Seconds slept.")


def _sleep_forever(params, progress):
    # A grandchild in its own session, like a torchrun worker: the runner must still kill it.
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True)
    with open(params.pid_file, "w") as f:
        f.write(f"{os.getpid()} {grandchild.pid}")
    progress(0.1, "sleeping forever")
    while True:
        time.sleep(1)


def _abort(params, progress):
    progress(0.5, "about to abort")
    os.abort()


def _gpu_locked(params, progress):
    with open(params.log_file, "a") as f:
        f.write(f"start {time.time()}\n")
    time.sleep(params.seconds)
    with open(params.log_file, "a") as f:
        f.write(f"end {time.time()}\n")
    return FaultResult(verdict="ok", slept_s=params.seconds, findings=[f"slept {params.seconds} s"])


def _print_noise(params, progress):
    print("this goes to stdout but must not corrupt the protocol")
    os.write(1, b"raw bytes on fd 1\n")
    return FaultResult(verdict="ok", findings=["done"])


SLEEPER = ToolSpec(name="test_sleeper", summary="sleeps forever", description="test only", Params=FaultParams,
                   Result=FaultResult, run=_sleep_forever, runs="subprocess", timeout_s=60)
ABORTER = ToolSpec(name="test_aborter", summary="aborts", description="test only", Params=FaultParams,
                   Result=FaultResult, run=_abort, runs="subprocess", timeout_s=60)
GPU_LOCKED = ToolSpec(name="test_gpu_locked", summary="holds GPU 0", description="test only", Params=FaultParams,
                      Result=FaultResult, run=_gpu_locked, runs="subprocess", timeout_s=60,
                      gpu_devices=lambda p: [0], metric="slept_s")
NOISY = ToolSpec(name="test_noisy", summary="prints to stdout", description="test only", Params=FaultParams,
                 Result=FaultResult, run=_print_noise, runs="subprocess", timeout_s=60)


def _nap(params, progress):
    time.sleep(params.seconds)
    return FaultResult(verdict="ok", slept_s=params.seconds)


NAPPER = ToolSpec(name="test_napper", summary="sleeps a while in a child", description="test only", Params=FaultParams,
                  Result=FaultResult, run=_nap, runs="subprocess", timeout_s=60, store=False)


def _spin_reporting(params, progress):
    """An in-process tool that works in a loop and reports progress: cancel and deadline stop it there."""
    started = time.monotonic()
    while time.monotonic() - started < params.seconds:
        progress(min(0.99, (time.monotonic() - started) / max(params.seconds, 1e-9)), "spinning")
        time.sleep(0.01)
    return FaultResult(verdict="ok", slept_s=params.seconds)


def _spin_silent(params, progress):
    """An in-process tool that never reports: only the job's deadline can end the wait for it."""
    time.sleep(params.seconds)
    return FaultResult(verdict="ok", slept_s=params.seconds)


SPINNER = ToolSpec(name="test_spinner", summary="spins in-process", description="test only", Params=FaultParams,
                   Result=FaultResult, run=_spin_reporting, runs="in_process", timeout_s=5, store=False)
SILENT = ToolSpec(name="test_silent", summary="sleeps in-process without progress", description="test only",
                  Params=FaultParams, Result=FaultResult, run=_spin_silent, runs="in_process", timeout_s=1,
                  store=False)


# --- security round 3 ------------------------------------------------------------------------------------

# A 1x1 PNG: what a plot tool writes.
PNG_1X1 = bytes.fromhex("89504e470d0a1a0a0000000d4948445200000001000000010806000000"
                        "1f15c4890000000d49444154789c6360000002000154a24f5d0000000049454e44ae426082")


class PlotResult(Result):
    plot_png: str | None = Field(None, description="The PNG written.")
    image_fields: ClassVar[tuple[str, ...]] = ("plot_png",)


def _plot_then_swap(params, progress):
    """Writes a PNG through safe_write at pid_file, then (the attacker winning the race of review F2)
    renames a symlink to log_file over it before the answer is built."""
    from tools.shared.safe_write import write_output

    target = Path(params.pid_file)
    write_output(target, PNG_1X1)
    link = target.with_name(target.name + ".swap")
    os.symlink(params.log_file, link)
    os.replace(link, target)
    return PlotResult(verdict="ok", plot_png=str(target))


PLOT_SWAPPER = ToolSpec(name="test_plot_swapper", summary="writes a PNG then swaps a link over it",
                        description="test only", Params=FaultParams, Result=PlotResult, run=_plot_then_swap,
                        runs="subprocess", read_only=False)

ESCAPES = "n2\x1b[2K\r\x1b[32mOK: every node healthy\x1b]52;c;ZWNobyBwd25lZA==\x07\x1b[8mhidden\u202e\nscontrol update"


def _escapes(params, progress):
    progress(0.5, "node " + ESCAPES)
    if params.seconds:
        from tools.engine.spec import ToolFailure

        raise ToolFailure("node said " + ESCAPES)
    return FaultResult(verdict="warn", findings=[f"node {ESCAPES} is slow"], next=["gpu_health"])


ESCAPER = ToolSpec(name="test_escaper", summary="echoes terminal escapes", description="test only",
                   Params=FaultParams, Result=FaultResult, run=_escapes, runs="subprocess")
