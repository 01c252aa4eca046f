"""Runs one tool call: every call has a deadline, can be cancelled and reports progress.

`execute()` is synchronous and thread-safe; jobs.py runs it on a job thread for the server and the
CLI alike. Subprocess tools run as `python -m PACKAGE.engine.child` under processes.Supervised: on a
deadline, a cancel, a crash or an exception in the caller the child's whole process tree is killed
before execute returns. Every result is cut to bounds.MAX_RESULT_CHARS, and stored (store.save redacts).
In-process tools are short pure computations; they run on the calling thread, and their progress
callback raises at once when the call is cancelled or past its deadline (jobs.py stops waiting for
one that never calls it). Every result that comes back is stored.
"""

import base64
import binascii
import contextlib
import fcntl
import json
import os
import signal
import socket
import threading
import time

from . import store
from .bounds import bound_result
from .home import open_lock, private_dir
from .on_node import NodeUnavailable, launcher, node_command
from .printable import printable_data
from .job_python import job_python, stack_line
from .redact import redact_data
from .processes import Supervised, python_module_command
from .registry import module_of
from .spec import Params, Progress, Result, ToolFailure, ToolSpec, takes_node


class Cancelled(ToolFailure):
    """The run was cancelled by the caller (client cancellation or job_cancel)."""


class DeadlineExceeded(ToolFailure):
    """The run did not finish within its deadline (timeout_s)."""


def deadline_message(spec: ToolSpec, timeout_s: float, killed: bool) -> str:
    what = "all its processes were killed" if killed else "it was stopped"
    return (f"{spec.name} did not finish within its timeout of {timeout_s:g} s; {what}. "
            "Raise timeout_s or ask for less work.")


def execute(spec: ToolSpec, params: Params, progress: Progress | None = None, *,
            timeout_s: float | None = None, cancel: threading.Event | None = None,
            job_id: str | None = None, node: str | None = None, save: bool = True) -> Result:
    """Run `spec` with validated `params`; returns its Result (with result_id) or raises ToolFailure.

    `node`: run the child on that SLURM node through srun (on_node.py); subprocess tools only.
    save=False: the caller stores the result itself (a fleet sweep's node runs: the sweep stores them
    under the node srun ran them on)."""
    progress = progress or (lambda fraction, message: None)
    cancel = cancel or threading.Event()
    timeout_s = timeout_s or spec.timeout_s
    started = time.time()
    provenance = store.host_provenance() if spec.store else {}
    if node and not takes_node(spec):
        raise ToolFailure(f"{spec.name} does not run on a named node (node=): "
                          + ("it reaches other nodes itself" if spec.spans_nodes else "it runs in the server"))
    if spec.runs == "in_process":
        result = spec.run(params, _checked_progress(spec, progress, cancel, time.monotonic() + timeout_s, timeout_s))
    else:
        # GPU locks are this host's files: a run on another node does not take this host's GPUs.
        devices = sorted(set(spec.gpu_devices(params))) if spec.gpu_devices and not node else []
        with gpu_locks(devices, cancel, progress):
            data, child_prov, images = _run_child(spec, params, progress, timeout_s, cancel, node)
        provenance.update(child_prov)
        if node:    # stored and reported under the node we asked for; the host it names is only its claim
            provenance["host"] = node
        try:
            result = spec.Result.model_validate(data)
        except ValueError as e:
            raise ToolFailure(f"{spec.name} returned a result that does not match its schema: {e}") from None
        if spec.job_python and (stack := stack_line(child_prov)):
            result.findings.append(stack)
        if node:
            claimed, via = str(child_prov.get("host", node)), launcher()
            result.findings.append(f"Ran on node {node} (host {node}) through {via}." if claimed == node else
                                   f"Ran on node {node} through {via}; it calls itself host {claimed[:80]} (a claim: "
                                   f"stored under {node}).")
    result = bound_result(spec, result)   # what is answered and what is stored have one size limit
    result = _outbound(spec, result)      # no secret, ESC, CR or bidi override leaves, answered or stored
    if spec.runs == "subprocess":
        result._images = _decode_images(spec, images)
    if spec.store and save:
        result.result_id = store.save(
            spec.name, params.model_dump(mode="json"), result.model_dump(mode="json"),
            started=started, ended=time.time(), provenance=provenance, metric_name=spec.metric,
            job_id=job_id)
    return result


def _outbound(spec: ToolSpec, result: Result) -> Result:
    """`result` as it may leave the engine: secrets redacted and control characters escaped in every
    string (the same object when there were none). One pass for every tool, so a reader that quotes a
    line from a pasted table or a file the agent never saw cannot forget to redact it.
    A finding or a `next` entry is one line: a newline in it (a node name carrying one, then a forged
    line) is escaped too, so nothing on screen looks like a finding the tool did not make."""
    data = result.model_dump(mode="json")
    clean = printable_data(redact_data(data))     # redact first: an ESC sequence inside a key hides it once escaped
    for key in ("findings", "next"):
        clean[key] = [line.replace("\n", "\\n") for line in clean.get(key) or []]
    if clean == data:
        return result
    try:
        out = spec.Result.model_validate(clean)
    except ValueError:   # an escaped string broke a pattern or a length bound: keep the judgement only
        out = spec.Result(verdict=result.verdict, findings=clean.get("findings", []), next=clean.get("next", []))
    out._images = result._images
    return out


def _checked_progress(spec: ToolSpec, progress: Progress, cancel: threading.Event, deadline: float,
                      timeout_s: float) -> Progress:
    """progress() for an in-process run: where the tool reports, it also stops if it must."""
    def report(fraction: float, message: str) -> None:
        if cancel.is_set():
            raise Cancelled(f"{spec.name} was cancelled.")
        if time.monotonic() > deadline:
            raise DeadlineExceeded(deadline_message(spec, timeout_s, killed=False))
        progress(fraction, message)
    return report


def _parse_wire(line: str) -> dict | None:
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return None   # not ours: the child redirects stdout, so this should not happen; never fatal
    return event if isinstance(event, dict) else None


def _decode_images(spec: ToolSpec, images) -> dict[str, bytes]:
    """The PNGs the child read back from what it wrote, for the fields the Result declares."""
    out = {}
    for field, text in images.items():
        if field in spec.Result.image_fields and isinstance(text, str):
            with contextlib.suppress(binascii.Error, ValueError):
                out[field] = base64.b64decode(text, validate=True)
    return out


def _run_child(spec: ToolSpec, params: Params, progress: Progress, timeout_s: float,
               cancel: threading.Event, node: str | None = None) -> tuple[dict, dict, dict]:
    module = module_of(spec)
    cmd = python_module_command("engine.child", spec.name, *([module] if module else []),
                                python=job_python() if spec.job_python else None)
    env = None
    if node:
        try:
            cmd, env = node_command(node, cmd, timeout_s, job_name=f"mleng-{spec.name}")
        except NodeUnavailable as e:
            raise ToolFailure(str(e)) from None
        progress(0.0, f"starting on node {node} through {launcher(env)}")
    deadline = time.monotonic() + timeout_s
    outcome, images = None, {}
    child = Supervised(cmd, parse_line=_parse_wire, env=env, stdin_bytes=params.model_dump_json().encode(),
                       tail_lines=60)
    try:
        while outcome is None:
            if cancel.is_set():
                raise Cancelled(f"{spec.name} was cancelled; its processes were killed.")
            if time.monotonic() > deadline:
                raise DeadlineExceeded(deadline_message(spec, timeout_s, killed=True) + _tail_note(child))
            event = child.next_event(0.1)
            if event is None:
                continue
            if event is Supervised.EOF:  # stdout closed: the child exited (or closed it) without a result
                outcome = ("crash", None)
            elif event.get("event") == "progress":
                progress(event.get("fraction", 0.0), event.get("message", ""))
            elif event.get("event") == "image" and isinstance(event.get("field"), str):
                images[event["field"]] = event.get("png")
            elif event.get("event") in ("result", "error"):
                outcome = (event["event"], event)
    finally:
        # After an outcome the child is on its way out: let it exit so its status is its own.
        returncode = child.stop(grace_s=2.0, exit_wait_s=3.0 if outcome is not None else 0.0)
    kind, event = outcome
    if kind == "result":
        return event["result"], event.get("provenance") or {}, images
    if kind == "error":
        raise ToolFailure(event["message"])
    if node:   # srun's or ssh's own refusal (unknown node, down, host key) is in its stderr
        if launcher(env) == "srun" and any(words in child.stderr_text() for words in NO_SLURM_CONFIG):
            raise ToolFailure(
                f"{spec.name} cannot reach node {node}: there is no SLURM configuration on this machine (srun found "
                "no slurm.conf and no configless server). Run the tool on that node itself (`mleng run "
                f"{spec.name}` there), set SLURM_CONF to the cluster's slurm.conf, or reach the node over ssh "
                "(MLENG_TRANSPORT=ssh, the node's key in known_hosts).")
        raise ToolFailure(f"{spec.name} on node {node} did not answer: {launcher(env)} {_describe_exit(returncode)}."
                          f"{_tail_note(child)}")
    raise ToolFailure(f"{spec.name} crashed: {_describe_exit(returncode)}.{_tail_note(child)}")


# srun's words when it finds no configuration at all (no slurm.conf, no DNS SRV record for a configless slurmctld)
NO_SLURM_CONFIG = ("Could not establish a configuration source", "fetch_config: DNS SRV lookup failed",
                   "Unable to process configuration file")


def _tail_note(child: Supervised) -> str:
    text = child.stderr_text().strip()
    if not text:
        return ""
    return "\nLast lines of its stderr:\n" + "\n".join(text.splitlines()[-25:])


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
# the CLI and every process of this user; the kernel drops them if a holder dies. They live in the
# user's own 0700 $MLENG_HOME, so another user's benchmarks do not see them (a home shared between users
# would let each of them rewrite the other's results and tool list: review 2026-12-01, F19).

@contextlib.contextmanager
def gpu_locks(devices: list[int], cancel: threading.Event, progress: Progress):
    # Per host: $MLENG_HOME may be a home directory shared by every node, and flock on NFS locks
    # cluster-wide; GPU 0 of one node is not GPU 0 of another.
    lock_dir = private_dir("locks", socket.gethostname())
    held = []
    try:
        for device in devices:  # sorted by the caller: a fixed order cannot deadlock
            fd = open_lock(lock_dir / f"gpu{device}.lock")   # O_NOFOLLOW, ours: a planted link is refused
            told = False
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if cancel.is_set():
                        os.close(fd)
                        raise Cancelled("cancelled while waiting for a GPU lock") from None
                    if not told:
                        progress(0.0, f"waiting for GPU {device}: another mleng benchmark is using it")
                        told = True
                    time.sleep(0.2)
            held.append(fd)
        yield
    finally:
        for fd in held:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
