"""The processes a drill starts or signals, each known by its pid AND its start time.

A pid alone names whichever process holds that number now: `mleng drill stop` once signalled any pid
(even 1) a state file gave it (security review 2026-12-02, R4). A stamp is (pid, start time in clock
ticks since boot, field 22 of /proc/PID/stat); a signal goes only to a process that still has both.

A detached helper (the session-lock holder, the GPU co-tenant) is started paused: it waits for a line on
its standard input before doing anything. Its stamp is recorded in the drill's state first, and only then
is it told to go; if the CLI dies before that, the pipe closes and the helper exits having done nothing
(R17: a co-tenant started before its pid was saved outlived a killed `drill start`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

from pydantic import BaseModel, ConfigDict, Field

# The first lines of every helper's code: wait for the go, exit quietly when the pipe closes instead.
WAIT_FOR_GO = "import sys\nif sys.stdin.readline() != 'go\\n':\n    sys.exit(0)\nsys.stdin.close()\n"


def start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot), or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()   # the name may hold spaces and ')'
        return int(fields[19])                             # field 22; fields[0] is field 3 (state)
    except (OSError, IndexError, ValueError):
        return None


class ProcessStamp(BaseModel):
    """One process, as the kernel knows it: a pid reused by another process has another start time."""
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    pid: int = Field(gt=1, lt=1 << 22)      # never init; Linux pids end at 2^22
    start_ticks: int = Field(ge=0)

    @classmethod
    def of(cls, pid: int) -> "ProcessStamp":
        ticks = start_ticks(pid)
        if ticks is None:
            raise ProcessLookupError(f"process {pid} is gone")
        return cls(pid=pid, start_ticks=ticks)

    def is_running(self) -> bool:
        return start_ticks(self.pid) == self.start_ticks

    def signal(self, sig: int, group: bool = False) -> bool:
        """Send `sig` (to the process group it leads, with group=True) if it is still this process;
        False when it is gone or the pid now names another process (then nothing is sent)."""
        if not self.is_running():
            return False
        try:
            os.killpg(self.pid, sig) if group else os.kill(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def end(self, timeout_s: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it has not gone within timeout_s."""
        if not self.signal(signal.SIGTERM):
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.is_running():
                return
            time.sleep(0.1)
        self.signal(signal.SIGKILL)


def start_detached(code: str, record: Callable[[ProcessStamp], None]) -> tuple[subprocess.Popen, str]:
    """Run `code` (after WAIT_FOR_GO) in a session of its own; `record` its stamp, then let it go.
    Returns the process and the first line it printed (its "ready" word, or "" if it died)."""
    proc = subprocess.Popen([sys.executable, "-c", WAIT_FOR_GO + code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True, text=True)
    try:
        record(ProcessStamp.of(proc.pid))
        proc.stdin.write("go\n")
        proc.stdin.close()
        line = proc.stdout.readline()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    proc.stdout.close()
    return proc, line.strip()
