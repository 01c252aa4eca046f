"""Processes: starting children that can be found again, and killing whole trees of them.

Every tool that launches processes (the runner's tool children, torchrun ranks, srun steps) starts
them through `spawn_tree` and stops them with `kill_tree`, so nothing outlives a deadline or a cancel:
no orphan ranks holding GPUs. `python_module_command` is how any part of mleng starts
`python -m <one of our modules>`, checkout or wheel alike.
"""

import collections
import os
import queue
import signal
import subprocess
import sys
import threading
import time

from .borrow import server_site_env
from .data import IMPORT_ROOT, PACKAGE
from .http_guard import TOKEN_ENV

# The longest line of a child's output kept whole: above the largest result line the runner reads
# (bounds.MAX_RESULT_CHARS, 1,000,000 characters, which json.dumps may escape to 6 bytes each when
# they are not ASCII) with room for its envelope.
MAX_LINE_BYTES = 8 << 20


def python_module_command(module: str, *args: str, python: str | None = None) -> list[str]:
    """`python -m PACKAGE.<module> args...` for `python` (default: this interpreter; module relative to the package)."""
    return [python or sys.executable, "-m", f"{PACKAGE}.{module}", *args]


def without_secrets(env: dict) -> dict:
    """`env` less the server's own secrets: the HTTP token stays in the server, not in a tool child, nor in an
    srun step (srun's default --export=ALL would send it to the node)."""
    return {k: v for k, v in env.items() if k != TOKEN_ENV}


def child_env(env: dict | None = None) -> dict:
    """`env` (default: ours) with our package importable, whatever the child's working directory, and no
    secret of the server's."""
    env = without_secrets(dict(os.environ if env is None else env))
    parts = [str(IMPORT_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(IMPORT_ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    # `python -m` would put the working directory first on sys.path: a user's own `tools/` or `mleng/`
    # folder there must not shadow ours (PYTHONSAFEPATH is -P for every Python this child starts).
    env["PYTHONSAFEPATH"] = "1"
    for key, value in server_site_env().items():   # kept when set: a grandchild borrows from the server, not the job
        env.setdefault(key, value)
    return env



def spawn_tree(cmd: list[str], env: dict | None = None, **popen_kwargs) -> subprocess.Popen:
    """Start `cmd` as the leader of a new session, so kill_tree can find everything it starts."""
    return subprocess.Popen(cmd, env=env, start_new_session=True, **popen_kwargs)


def kill_tree(pid: int, grace_s: float = 3.0, known: list | None = None) -> list[int]:
    """SIGTERM a process and every descendant, then SIGKILL what is left after `grace_s`.

    Descendants are found through parent links (psutil), not the process group: torchrun puts each
    worker in a session of its own, so a group signal would miss the ranks. `known` adds processes
    seen earlier (psutil.Process objects): once a parent dies its children are reparented and can
    no longer be found from it. Returns the pids signalled.
    """
    import psutil

    procs = {}
    for p in known or []:
        if p.is_running():  # is_running also checks the creation time: a reused pid is not ours
            procs[p.pid] = p
    try:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            procs[p.pid] = p
    except psutil.NoSuchProcess:
        pass
    for p in list(procs.values()):
        try:
            procs.update({c.pid: c for c in p.children(recursive=True)})
            p.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(list(procs.values()), timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=grace_s)
    try:  # Anything reparented away from the tree but still in the leader's process group.
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    return sorted(procs)


def descendants(pid: int) -> list:
    """psutil.Process objects of every live descendant of pid (empty when pid is gone)."""
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def torchrun_command(module: str, nproc_per_node: int, args: list[str], *, nnodes: int = 1,
                     rdzv_endpoint: str | None = None, rdzv_id: str | None = None,
                     monitor_interval_s: float = 0.1) -> list[str]:
    """`python -m torch.distributed.run ...` for `python -m <module> <args>` on every rank.

    One node: --standalone. Several: a c10d rendezvous at `rdzv_endpoint` (host:port of the first node).
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc_per_node}",
           f"--monitor-interval={monitor_interval_s}"]
    if nnodes == 1 and rdzv_endpoint is None:
        cmd.append("--standalone")
    else:
        if not rdzv_endpoint:
            raise ValueError("several nodes need rdzv_endpoint=host:port")
        cmd += [f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}",
                f"--rdzv-id={rdzv_id or 'mleng'}"]
    return cmd + ["-m", module, *args]


def local_gpu_count() -> int:
    """NVIDIA GPUs visible through NVML (0 when there is no driver). Does not import torch."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


def interrupt_on_sigterm() -> None:
    """Turn SIGTERM into KeyboardInterrupt in the main thread, so `finally` blocks kill the ranks a run
    started (the default action would end this process at once and leave its children running)."""
    def _raise(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, _raise)


class Supervised:
    """A child process tree under supervision, the one way mleng runs children it must be able to stop.

    stdout is read line by line on a thread: `parse_line(text)` turns a line into an event (None: not
    an event, kept in a bounded `output_tail`); events queue up for `next_event`. stderr goes to a
    bounded tail, and through `parse_stderr` (when given) to the same queue. Lines are bounded
    (max_line_bytes) and a line that breaks a parser is skipped and counted (`skipped`): neither
    stops the reader. Descendants are remembered as they appear, so `stop()` finds them even after their
    parent died, and kills the whole tree. Use it as a context manager: leaving the block stops it.
    """

    EOF = object()   # next_event's answer once stdout is closed

    def __init__(self, cmd: list[str], *, parse_line, parse_stderr=None, env: dict | None = None, cwd=None,
                 stdin_bytes: bytes | None = None, tail_lines: int = 400, max_line_bytes: int = MAX_LINE_BYTES):
        self.cmd = cmd
        self.events: queue.Queue = queue.Queue()
        self.output_tail: collections.deque = collections.deque(maxlen=200)
        self.stderr_tail: collections.deque = collections.deque(maxlen=tail_lines)
        self.skipped: collections.Counter = collections.Counter()   # why lines were not read, and how many
        self._parse = parse_line
        self._parse_stderr = parse_stderr
        self._max_line = max_line_bytes
        self._known: dict[int, object] = {}
        self._last_scan = 0.0
        self.proc = spawn_tree(cmd, env=child_env(env), cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.PIPE if stdin_bytes is not None else subprocess.DEVNULL)
        self._readers = [threading.Thread(target=self._read_stdout, daemon=True),
                         threading.Thread(target=self._read_stderr, daemon=True)]
        for t in self._readers:
            t.start()
        if stdin_bytes is not None:
            try:
                self.proc.stdin.write(stdin_bytes)
                self.proc.stdin.close()
            except BrokenPipeError:
                pass  # it died at once; its exit status and stderr say why

    def _read_stdout(self) -> None:
        try:
            for line in self._lines(self.proc.stdout, "stdout"):
                event = self._event(self._parse, line, "stdout")
                if event is not None:
                    self.events.put(event)
                elif line.strip():
                    self.output_tail.append(line[:500])
        finally:  # whatever a line did, the consumer learns that the output ended
            self.events.put(self.EOF)

    def _read_stderr(self) -> None:
        for line in self._lines(self.proc.stderr, "stderr"):
            self.stderr_tail.append(line[:500])
            if self._parse_stderr and (event := self._event(self._parse_stderr, line, "stderr")) is not None:
                self.events.put(event)

    def _event(self, parse, line: str, stream: str):
        """parse(line), or None: a line that breaks the parser is counted, never fatal to the reader
        (one deeply nested line once ended the thread, so no later line of any node was read)."""
        if not line.strip():
            return None
        try:
            return parse(line)
        except Exception as exc:  # noqa: BLE001 - the parser's bug or a hostile line: skip it, say so
            self.skipped[f"{stream} line the parser could not read ({type(exc).__name__})"] += 1
            return None

    def _lines(self, stream, name: str):
        """Decoded lines, each at most max_line_bytes: memory stays bounded whatever the child prints
        (a progress bar redrawn with carriage returns, never a newline, grew the reader by GBs). A
        longer line is read through and dropped, and counted in `skipped`."""
        while True:
            raw = stream.readline(self._max_line)
            if not raw:
                return
            if not raw.endswith(b"\n") and len(raw) >= self._max_line:
                self.skipped[f"{name} line longer than {self._max_line} bytes (skipped)"] += 1
                while (rest := stream.readline(self._max_line)) and not rest.endswith(b"\n"):
                    pass
                continue
            yield raw.decode(errors="replace").rstrip("\n")

    def next_event(self, timeout_s: float):
        """The next event, EOF, or None when nothing came within timeout_s."""
        self._remember_descendants()
        try:
            return self.events.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def follow(self, on_event, deadline: float, cancelled: threading.Event | None = None) -> bool:
        """on_event(event) for each event until stdout ends (True), or the monotonic deadline passes or
        `cancelled` is set (False)."""
        while not (cancelled and cancelled.is_set()):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            item = self.next_event(min(left, 1.0))
            if item is self.EOF:
                return True
            if item is not None:
                on_event(item)
        return False

    def _remember_descendants(self) -> None:
        if time.monotonic() - self._last_scan > 0.5:
            self._known.update({p.pid: p for p in descendants(self.proc.pid)})
            self._last_scan = time.monotonic()

    def stop(self, grace_s: float = 3.0, exit_wait_s: float = 0.0) -> int | None:
        """Let it exit on its own for up to exit_wait_s, then kill the whole tree; returns its exit status
        as it was before we killed anything (None when it was still running)."""
        if exit_wait_s:
            try:
                self.proc.wait(timeout=exit_wait_s)
            except subprocess.TimeoutExpired:
                pass
        returncode = self.proc.poll()
        try:
            kill_tree(self.proc.pid, grace_s=grace_s, known=list(self._known.values()))
        except ImportError:  # no psutil (a bare GPU box): the leader passes SIGTERM on (torchrun does)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()
        for t in self._readers:
            t.join(timeout=5)
        return returncode

    def stderr_text(self) -> str:
        return "\n".join(self.stderr_tail)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()   # kill_tree returns at once when nothing is left to wait for
        return False
