"""Runs one tool: in this process, or in a child process with a timeout, cancellation and GPU locks.

`execute()` is synchronous and thread-safe; the server runs it on a job thread, the CLI directly.
Whatever happens (timeout, cancel, crash, exception in the caller) the child's whole process tree is
killed before it returns, and every result that comes back is written to the results store.
"""

import collections
import contextlib
import fcntl
import json
import queue
import signal
import subprocess
import sys
import threading
import time

from tools import module_of, store
from tools.harness import REPO_ROOT, Params, Progress, Result, ToolFailure, ToolSpec, descendants, kill_tree

STDERR_TAIL_BYTES = 8192


class Cancelled(ToolFailure):
    """The run was cancelled by the caller (client cancellation or job_cancel)."""


def execute(spec: ToolSpec, params: Params, progress: Progress | None = None, *,
            timeout_s: float | None = None, cancel: threading.Event | None = None,
            job_id: str | None = None) -> Result:
    """Run `spec` with validated `params`; returns its Result (with result_id) or raises ToolFailure."""
    progress = progress or (lambda fraction, message: None)
    cancel = cancel or threading.Event()
    started = time.time()
    provenance = store.host_provenance() if spec.store else {}
    if spec.runs == "in_process":
        result = spec.run(params, progress)
    else:
        devices = sorted(set(spec.gpu_devices(params))) if spec.gpu_devices else []
        with gpu_locks(devices, cancel, progress):
            data, child_prov = _run_child(spec, params, progress, timeout_s or spec.timeout_s, cancel)
        provenance.update(child_prov)
        try:
            result = spec.Result.model_validate(data)
        except ValueError as e:
            raise ToolFailure(f"{spec.name} returned a result that does not match its schema: {e}") from None
    if spec.store:
        result.result_id = store.save(
            spec.name, params.model_dump(mode="json"), result.model_dump(mode="json"),
            started=started, ended=time.time(), provenance=provenance, metric_name=spec.metric,
            job_id=job_id)
    return result


def _run_child(spec: ToolSpec, params: Params, progress: Progress, timeout_s: float,
               cancel: threading.Event) -> tuple[dict, dict]:
    module = module_of(spec)
    cmd = [sys.executable, "-m", "tools.child", spec.name] + ([module] if module else [])
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    events: queue.Queue = queue.Queue()
    stderr_tail: collections.deque = collections.deque()
    readers = [threading.Thread(target=_read_events, args=(proc.stdout, events), daemon=True),
               threading.Thread(target=_read_tail, args=(proc.stderr, stderr_tail), daemon=True)]
    for t in readers:
        t.start()
    deadline = time.monotonic() + timeout_s
    outcome = None
    known: dict[int, object] = {}  # descendants seen so far: found again even after their parent died
    last_scan = 0.0
    try:
        proc.stdin.write(params.model_dump_json().encode())
        proc.stdin.close()
        while outcome is None:
            if cancel.is_set():
                raise Cancelled(f"{spec.name} was cancelled; its processes were killed.")
            if time.monotonic() > deadline:
                raise ToolFailure(
                    f"{spec.name} did not finish within its timeout of {timeout_s:g} s; all its processes"
                    f" were killed. Raise timeout_s or ask for less work.{_tail_note(stderr_tail)}")
            if time.monotonic() - last_scan > 0.5:
                known.update({p.pid: p for p in descendants(proc.pid)})
                last_scan = time.monotonic()
            try:
                event = events.get(timeout=0.1)
            except queue.Empty:
                continue
            if event is None:  # stdout closed: the child exited (or closed it) without a result
                outcome = ("crash", None)
            elif event.get("event") == "progress":
                progress(event.get("fraction", 0.0), event.get("message", ""))
            elif event.get("event") in ("result", "error"):
                outcome = (event["event"], event)
    finally:
        if outcome is not None:  # the child is on its way out: let it exit so its status is its own
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                pass
        returncode = proc.poll()
        kill_tree(proc.pid, grace_s=2.0, known=list(known.values()))
        proc.wait()
        for t in readers:
            t.join(timeout=2)
    kind, event = outcome
    if kind == "result":
        return event["result"], event.get("provenance") or {}
    if kind == "error":
        raise ToolFailure(event["message"])
    raise ToolFailure(f"{spec.name} crashed: {_describe_exit(returncode)}.{_tail_note(stderr_tail)}")


def _read_events(stream, events: queue.Queue) -> None:
    for line in stream:
        line = line.strip()
        if not line:
            continue
        try:
            events.put(json.loads(line))
        except json.JSONDecodeError:
            pass  # not ours: the child redirects stdout, so this should not happen; never fatal
    events.put(None)


def _read_tail(stream, tail: collections.deque) -> None:
    size = 0
    for chunk in iter(lambda: stream.read1(4096), b""):
        tail.append(chunk)
        size += len(chunk)
        while size > STDERR_TAIL_BYTES and len(tail) > 1:
            size -= len(tail.popleft())


def _tail_note(tail: collections.deque) -> str:
    text = b"".join(tail).decode(errors="replace").strip()
    if not text:
        return ""
    lines = text.splitlines()[-25:]
    return "\nLast lines of its stderr:\n" + "\n".join(lines)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        hint = {"SIGSEGV": " (segmentation fault: often a CUDA/driver or extension bug)",
                "SIGABRT": " (abort: a C++ exception or failed assertion, e.g. a CUDA or NCCL error)",
                "SIGKILL": " (killed: often the kernel OOM killer — check `dmesg`)"}.get(name, "")
        return f"killed by {name}{hint}"
    return f"exited with status {code} without a result"


# ---------------------------------------------------------------------------------------------------
# Per-GPU locks: two GPU benchmarks never share a device. File locks, so they hold across the server,
# the CLI and other users' processes on the host; the kernel drops them if a holder dies.

@contextlib.contextmanager
def gpu_locks(devices: list[int], cancel: threading.Event, progress: Progress):
    lock_dir = store.mleng_home() / "locks"
    lock_dir.mkdir(parents=True, exist_ok=True)
    held = []
    try:
        for device in devices:  # sorted by the caller: a fixed order cannot deadlock
            f = open(lock_dir / f"gpu{device}.lock", "a+")
            told = False
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if cancel.is_set():
                        f.close()
                        raise Cancelled("cancelled while waiting for a GPU lock") from None
                    if not told:
                        progress(0.0, f"waiting for GPU {device}: another mleng benchmark is using it")
                        told = True
                    time.sleep(0.2)
            held.append(f)
        yield
    finally:
        for f in held:
            fcntl.flock(f, fcntl.LOCK_UN)
            f.close()
