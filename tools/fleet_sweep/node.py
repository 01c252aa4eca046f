"""One node's part of a fleet sweep: `python -m <package>.fleet_sweep.node '<job json>'`.

Started once per node by the sweep's srun step. Prints one line per event on stdout, each
`MLENG_FLEET {json}`: "hello" (the checks it will run, its GPUs), then a "row" per finished check
(streamed, so the parent has it even if a later check hangs), then "done". The job JSON carries
only check names and a storage path; nothing in it is executed.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import sys

EVENT_PREFIX = "MLENG_FLEET "
# srun relays every node's output through one stream; long lines from several nodes at once came
# back cut and interleaved (a 10+ kB env_report row was lost on the namespace cluster). Events
# longer than this go out as numbered parts, base64 so a part's line is ~4/3 of it (< 1 kB),
# reassembled by the parent.
PART_CHARS = 600


def emit(event: dict) -> None:
    text = json.dumps(event, default=str)
    if len(text) <= PART_CHARS:
        lines = [text]
    else:
        key = f"{event.get('node')}-{os.getpid()}-{id(event)}"
        raw = text.encode()
        chunks = [base64.b64encode(raw[i:i + PART_CHARS]).decode() for i in range(0, len(raw), PART_CHARS)]
        lines = [json.dumps({"kind": "part", "key": key, "i": i, "n": len(chunks), "data": c})
                 for i, c in enumerate(chunks)]
    sys.stdout.write("".join(EVENT_PREFIX + line + "\n" for line in lines))
    sys.stdout.flush()


def parse_event(line: str) -> dict | None:
    """The parent's side: an event (or part of one) from a line of the step's output, else None."""
    _, sep, payload = line.partition(EVENT_PREFIX)
    if not sep:
        return None
    try:
        event = json.loads(payload)
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) and "kind" in event else None


class Reassembler:
    """Whole events from a stream of events and parts (parts of several events may interleave)."""

    def __init__(self):
        self.pending: dict[str, dict[int, bytes]] = {}

    def feed(self, event: dict) -> dict | None:
        if event.get("kind") != "part":
            return event
        parts = self.pending.setdefault(str(event.get("key")), {})
        try:
            parts[int(event.get("i", 0))] = base64.b64decode(str(event.get("data", "")))
        except ValueError:
            return None
        if len(parts) < int(event.get("n", 1)):
            return None
        del self.pending[str(event.get("key"))]
        text = b"".join(parts[i] for i in sorted(parts)).decode(errors="replace")
        return parse_event(EVENT_PREFIX + text)


def node_name() -> str:
    """The SLURM node name when under srun (what scontrol and the drain list need), else the host."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def gpu_count() -> int:
    """GPUs here: NVML (no torch import); torch only where NVML's Python binding is not installed."""
    import importlib.util

    from ..engine.processes import local_gpu_count

    if importlib.util.find_spec("pynvml"):
        return local_gpu_count()
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        return 0


def main(argv: list[str]) -> int:
    from ..engine.store import host_provenance, torch_provenance
    from .checks import CHECKS, plan, run_check

    job = json.loads(argv[0]) if argv else {}
    names = [c for c in job.get("checks", []) if c in CHECKS]
    node, host = node_name(), socket.gethostname()
    gpus = gpu_count()
    planned = plan(names, gpus, job.get("storage_path"))
    emit({"kind": "hello", "node": node, "host": host, "pid": os.getpid(), "gpu_count": gpus,
          "checks": [name for name, _ in planned]})
    provenance = host_provenance()
    for name, fn in planned:
        row = run_check(name, fn)
        emit({"kind": "row", "node": node, "host": host, **row,
              "provenance": {**provenance, **torch_provenance()}})
    emit({"kind": "done", "node": node})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
