"""A drill's state file: what `start` did, so that `stop` undoes exactly that and nothing else.

$MLENG_HOME/drill/state.json is written through home.write_private (a new 0600 file renamed into place)
and read through home.read_private (ours, 0600, no link, at most 1 MiB). On load it is checked as
strictly as a tool's input, and a state `start` could not have written is refused whole, saying what was
wrong, with nothing undone. A crafted file once made `stop` delete any folder, signal any pid and pass
`--user=alice` to scancel (security review 2026-12-02, R4). So: work_dir is the drill's own folder; every
process is a ProcessStamp (pid + start time); job ids are integers and job names our own pattern; node
names are the cluster's; fault kinds are the scenario model's.

Every fault is recorded BEFORE it takes effect (the intent: its Step), then done, then confirmed (the pid,
job id or stamp it produced, saved again), so `stop` after a `start` killed at any moment finds it.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ...engine.home import private_dir, read_private, write_private
from .cluster import INSTANCE, NODE_NAME, DrillError
from .scenarios import Fault
from .stamps import ProcessStamp

MAX_STATE_BYTES = 1 << 20
JOB_NAME = "drill-train-[0-9a-f]{12}"     # the training job's name: unique, so `scancel --name` finds only it


def drill_dir() -> Path:
    return private_dir("drill")


def state_file() -> Path:
    return drill_dir() / "state.json"


def work_dir() -> Path:
    """The folder the drill's fixtures and job files go to (not created here)."""
    return drill_dir() / "work"


class Step(BaseModel):
    """One fault as recorded: the scenario's fault, then what taking it produced."""
    model_config = ConfigDict(extra="forbid", strict=True)
    fault: Fault
    pid: ProcessStamp | None = None            # the slurmd signalled, or the co-tenant started
    job_name: str | None = Field(None, pattern=f"^{JOB_NAME}$")
    job_id: int | None = Field(None, gt=0)
    frozen: list[ProcessStamp] = Field(default=[], max_length=8)   # ranks SIGSTOPped
    launched: list[ProcessStamp] = Field(default=[], max_length=8)   # the ssh clients of a job started over ssh

    @model_validator(mode="after")
    def _cluster_names(self):
        for name in (getattr(self.fault, "node", None), getattr(self.fault, "peer", None)):
            if name is not None and not NODE_NAME.fullmatch(name):
                raise ValueError(f"node {name[:40]!r} is not one of the namespace cluster's (mln1..mln8)")
        return self


class DrillState(BaseModel):
    """What a running drill did, step by step (each written before it is taken)."""
    model_config = ConfigDict(extra="forbid", strict=True)
    scenario: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")
    work_dir: str
    started_cluster: bool = False       # we started the namespace cluster (stop it) or reused one (heal it)
    holder: ProcessStamp | None = None  # the process holding the cluster's session lock for the drill
    steps: list[Step] = Field(default=[], max_length=64)
    job_id: int | None = Field(None, gt=0)   # the training job, told to the agent
    instance: int = Field(INSTANCE, ge=0, le=9)   # the namespace cluster's instance (MLN_CLUSTER_INSTANCE) at start

    @field_validator("work_dir")
    @classmethod
    def _the_drills_own(cls, value: str) -> str:
        if value != str(work_dir()):
            raise ValueError(f"work_dir must be the drill's own folder {work_dir()}")
        return value

    def save(self) -> None:
        write_private(state_file(), self.model_dump_json(indent=1))

    def record(self, step: Step) -> Step:
        """Add `step` and save, before the fault takes effect."""
        self.steps.append(step)
        self.save()
        return step

    @classmethod
    def load(cls) -> DrillState | None:
        """The saved state; None when no drill is set up; DrillError when the file is not one we wrote."""
        path = state_file()
        try:
            data = read_private(path, MAX_STATE_BYTES)
        except OSError as e:
            raise DrillError(f"refusing the drill state: {e}. Nothing was undone.") from None
        if data is None:
            return None
        try:
            return cls.model_validate_json(data)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "the file"
            raise DrillError(f"{path} is not a state `mleng drill start` wrote ({where}: {first['msg'][:200]}); "
                             "refusing to act on it, nothing was undone. Check by hand that nothing of the drill "
                             "still runs, then remove the file.") from None
