"""One node's part of a fleet sweep: `python -m <package>.fleet_sweep.node '<job json>'`.

Started once per node by the sweep's srun step. Prints one line per event on stdout, each
`MLENG_FLEET {json}`: "hello" (the checks it will run, its GPUs), then a "row" per finished check
(streamed, so the parent has it even if a later check hangs), then "done". The job JSON carries
only check names and a storage path; nothing in it is executed.
"""

from __future__ import annotations

import json
import os
import socket
import sys

EVENT_PREFIX = "MLENG_FLEET "


def emit(event: dict) -> None:
    sys.stdout.write(EVENT_PREFIX + json.dumps(event, default=str) + "\n")
    sys.stdout.flush()


def parse_event(line: str) -> dict | None:
    """The parent's side: an event from a line of the step's output, None for any other line."""
    _, sep, payload = line.partition(EVENT_PREFIX)
    if not sep:
        return None
    try:
        event = json.loads(payload)
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) and "kind" in event else None


def node_name() -> str:
    """The SLURM node name when under srun (what scontrol and the drain list need), else the host."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def main(argv: list[str]) -> int:
    from ..engine.processes import local_gpu_count
    from ..engine.store import host_provenance, torch_provenance
    from .checks import CHECKS, plan, run_check

    job = json.loads(argv[0]) if argv else {}
    names = [c for c in job.get("checks", []) if c in CHECKS]
    node, host = node_name(), socket.gethostname()
    gpus = local_gpu_count()
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
