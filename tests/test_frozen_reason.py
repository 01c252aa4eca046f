"""frozen_reason: why a rank cannot run, and for a stopped one whether a debugger holds it (its TracerPid) or a
signal stopped it. Model round 12 asked it twice (cl-frozen-rank, cl-ssh-frozen-rank): does SIGCONT alone resume
it? Real processes: one stopped by SIGSTOP, one stopped by a ptrace attach from this test."""

import ctypes
import os
import signal
import subprocess
import sys
import time

import pytest

from tools.shared.process_targets.kernel import frozen_reason

PTRACE_ATTACH, PTRACE_DETACH = 16, 17


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0].decode()


def _wait_stopped(pid: int) -> None:
    deadline = time.monotonic() + 10
    while _state(pid) not in ("T", "t") and time.monotonic() < deadline:
        time.sleep(0.01)


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_signal_stopped_process_is_said_stopped_with_no_tracer_and_how_to_resume(sleeper):
    assert frozen_reason(sleeper.pid) == ""
    os.kill(sleeper.pid, signal.SIGSTOP)
    _wait_stopped(sleeper.pid)
    said = frozen_reason(sleeper.pid)
    assert "stopped (state T: SIGSTOP or SIGTSTP; no tracer seen)" in said, said
    assert f"kill -CONT {sleeper.pid}" in said


@pytest.mark.skipif(os.geteuid() != 0, reason="attaching to a child with ptrace needs root where Yama restricts it")
def test_a_process_a_debugger_holds_names_its_tracer(sleeper):
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    if libc.ptrace(PTRACE_ATTACH, sleeper.pid, None, None) != 0:
        pytest.skip(f"ptrace attach refused here: errno {ctypes.get_errno()}")
    try:
        os.waitpid(sleeper.pid, 0)      # the tracee's stop, reported to its tracer
        said = frozen_reason(sleeper.pid)
        assert f"traced by pid {os.getpid()} ('" in said and "detach that tracer" in said, said
    finally:
        libc.ptrace(PTRACE_DETACH, sleeper.pid, None, None)
