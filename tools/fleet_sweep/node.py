"""One node's part of a fleet sweep: `python -m <package>.fleet_sweep.node '<job json>'`.

Started once per node by the sweep's srun step. Reports on mleng's side channel
(tools/shared/sidechannel.py): "hello" (the checks it will run, its GPUs), then a "row" per finished
check (streamed, so the parent has it even if a later check hangs), then "done". The job JSON carries
only check names, a storage path and the time left; nothing in it is executed.

The parent believes none of it on trust: which node wrote a line comes from srun's task label, and
`check_event` below is the parent's check of every event (a bad one is skipped and counted).
"""

from __future__ import annotations

import json
import os
import socket
import sys
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..engine.on_node import NODE_ENV
from ..shared.sidechannel import emit

NAME = Field(max_length=256)


class _Event(BaseModel):
    # Unknown fields pass through (a row carries its tool's whole result); known ones are typed, so a
    # row that would crash the aggregation (a figure value "fast", problems: 7) is refused here.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, coerce_numbers_to_str=True)
    node: str = NAME                      # what the node calls itself: compared with srun's word, never used


class Hello(_Event):
    kind: Literal["hello"]
    host: str | None = Field(None, max_length=256)
    gpu_count: int = Field(0, ge=0, le=1024)
    checks: list[str] = Field(max_length=64)


class FigureOut(BaseModel):
    """A figure as checks.figure_row sends it (the contract of tools/engine/figures.py, in JSON)."""
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    name: str = NAME
    value: float | None = None
    unit: str = Field("", max_length=64)
    better: Literal["higher", "lower"] = "higher"
    gpu: int | None = Field(None, ge=0, le=1024)
    expected: float | None = None
    group: str | None = Field(None, max_length=256)


class HolderOut(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    pid: int = Field(ge=0)
    name: str = Field("?", max_length=256)
    user: str | None = Field(None, max_length=256)
    gpu: int | None = Field(None, ge=0, le=1024)
    used_mib: float | None = None
    origin: str | None = Field(None, max_length=256)


class BusyOut(BaseModel):
    """shared/occupancy.Occupancy as it travels."""
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    busy: bool = False
    why: str = Field("", max_length=2000)
    holders: list[HolderOut] = Field(default_factory=list, max_length=1000)


class Row(_Event):
    kind: Literal["row"]
    host: str | None = Field(None, max_length=256)
    check: str = NAME
    verdict: str = Field(max_length=32)
    problems: list[str] = Field(default_factory=list, max_length=10_000)
    figures: list[FigureOut] = Field(default_factory=list, max_length=10_000)
    versions: dict[str, str | None] = Field(default_factory=dict)
    started: float = 0.0
    ended: float = 0.0
    result: dict = Field(default_factory=dict)
    params: dict = Field(default_factory=dict)
    provenance: dict = Field(default_factory=dict)
    busy: BusyOut | None = None
    inventory: dict[str, int | float | str | None] | None = None
    cpu_quota: str | None = Field(None, max_length=64)        # cpu_probe, env_report: "0.25 CPU" or "none"
    cpu_quota_at: str | None = Field(None, max_length=400)    # where it is set, whose, when written (limit_words)
    gpus: list[dict] = Field(default_factory=list, max_length=1024)


class Done(_Event):
    kind: Literal["done"]


KINDS = {"hello": Hello, "row": Row, "done": Done}


def check_event(data: dict) -> dict:
    """The parent's check of one event from a node: a plain dict again, typed where it is read."""
    model = KINDS.get(data.get("kind"))
    if model is None:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}")
    return model.model_validate(data).model_dump()


def node_name() -> str:
    """The SLURM node name when under srun (what scontrol and the drain list need), the name ssh reached it
    by (engine/remote_step.py sets it), else the host."""
    return os.environ.get("SLURMD_NODENAME") or os.environ.get(NODE_ENV) or socket.gethostname()


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
    import time

    from ..engine.store import host_provenance, torch_provenance
    from .checks import CHECKS, plan, run_check, set_deadline

    job = json.loads(argv[0]) if argv else {}
    if isinstance(job.get("deadline_s"), (int, float)):
        # A little before the sweep cuts the step, so a late check is reported as such by the node.
        set_deadline(time.monotonic() + max(1.0, job["deadline_s"] - 5))
    # Events go to a private copy of stdout; fd 1 becomes stderr, so what a check or a C library
    # prints cannot land on the channel (the same arrangement as engine/child.py).
    wire = os.dup(1)
    os.dup2(2, 1)
    names = [c for c in job.get("checks", []) if c in CHECKS]
    node, host = node_name(), socket.gethostname()
    gpus = gpu_count()
    planned = plan(names, gpus, job.get("storage_path"))
    emit({"kind": "hello", "node": node, "host": host, "pid": os.getpid(), "gpu_count": gpus,
          "checks": [name for name, _ in planned]}, wire)
    provenance = host_provenance()
    for name, fn in planned:
        row = run_check(name, fn)
        emit({"kind": "row", "node": node, "host": host, **row,
              "provenance": {**provenance, **torch_provenance()}}, wire)
    emit({"kind": "done", "node": node}, wire)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
