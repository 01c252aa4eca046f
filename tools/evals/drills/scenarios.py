"""Drill scenarios: data files under evals/scenarios/, checked into typed records.

A scenario file is TOML:

    id = "slow-node"                      # the file name without .toml
    message = "All-reduce over our 4 nodes ..."   # the operator's words: no tool names, no culprit
    place = "cluster"                     # local | cluster | gpu
    nodes = 4                             # cluster size (place = cluster)
    transport = "ssh"                     # the agent reaches the nodes over ssh, no SLURM (default "slurm")
    topic = "slow collective"             # hang | slow collective | straggler | drift | dead node |
                                          # post-mortem | control (nothing is wrong)
    [[fault]]                             # zero or more, applied in order, undone in reverse
    kind = "rate_limit"                   # see FAULTS below
    node = "mln3"
    [truth]
    kind = "node"                         # node | link | rank | gpu | setting | none
    identity = ["mln3"]                   # every culprit (a link as "mln1-mln2", a rank as "3")
    drain_ok = ["mln3"]                   # nodes a right answer may drain (default: none)
    [[truth.also]]                        # two faults at once: culprits of another kind (optional)
    kind = "link"
    identity = ["mln1-mln2"]

The message is what the agent is told; `{dir}` in it becomes the folder the scenario's fixture files were
copied to. Fixtures live in evals/scenarios/fixtures/ with their source in its SOURCE.md.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ...engine.data import EVAL_CASES_DIR
from .cluster import NODE_NAME

SCENARIOS_DIR = EVAL_CASES_DIR / "scenarios"
FIXTURES_DIR = SCENARIOS_DIR / "fixtures"
TOOL_WORDS = ("fleet_sweep", "collective_bench", "dist_smoke_test", "hang_stack_dump", "straggler_find",
              "log_triage", "nccl_log_analyze", "flight_recorder_analyze", "gpu_health", "nic_health", "mleng")


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RateLimit(_Fault):
    """tc tbf on a node's link: everything it sends is capped (a degraded NIC or cable)."""
    kind: Literal["rate_limit"]
    node: str
    rate: str = "50mbit"


class SlowLink(_Fault):
    """htb + u32 on both ends: only traffic between two nodes is capped (a bad cable or switch port)."""
    kind: Literal["slow_link"]
    node: str
    peer: str
    rate: str = "50mbit"


class LinkDown(_Fault):
    """The node's link is down: it cannot reach or be reached by any peer."""
    kind: Literal["link_down"]
    node: str


class CpuLimit(_Fault):
    """A cgroup CPU quota on everything that runs on the node (a starved or throttled host)."""
    kind: Literal["cpu_limit"]
    node: str
    percent: int = Field(ge=1, le=100)


class CpuHog(_Fault):
    """Busy loops of another user on a node, in its network namespace and cpu cgroup with no quota: a
    co-tenant (another team's job on the same host) the node's ranks share their CPUs with. Unlike
    cpu_limit nothing is throttled: the rank waits in the run queue behind the loops."""
    kind: Literal["cpu_hog"]
    node: str
    processes: int = Field(default=2, ge=1, le=8)
    user: str = Field(default="nobody", pattern=r"^[a-z_][a-z0-9_-]{0,31}$")


class KillSlurmd(_Fault):
    """The node's slurmd is killed (SIGKILL): SLURM marks it not responding, then down."""
    kind: Literal["kill_slurmd"]
    node: str


class FreezeSlurmd(_Fault):
    """The node's slurmd is stopped (SIGSTOP): it holds its port but answers nothing."""
    kind: Literal["freeze_slurmd"]
    node: str


class KillSshd(_Fault):
    """The node's sshd is killed (SIGKILL): nothing answers on its ssh port (a dead host, transport = "ssh")."""
    kind: Literal["kill_sshd"]
    node: str


class Fixture(_Fault):
    """Files from evals/scenarios/fixtures copied to a private folder the message names as {dir}."""
    kind: Literal["fixture"]
    files: list[str] = Field(min_length=1)


class TrainingJob(_Fault):
    """A small gloo training job (bench/straggler_workload.py, one rank per node) through sbatch.

    `slow_rank` / `loader_sleep_s` make one rank's data loading slow (a fault inside the job); with
    `loader_sleep_fraction` instead, that rank sleeps this fraction of its own recent step time, so it
    stays that much slower whatever the host's load does to the step (a small straggler);
    `freeze_rank` SIGSTOPs that rank once the job runs (a rank frozen mid-collective).
    `launcher = "ssh"`: no SLURM job; torchrun started on every node over ssh (cluster-local.sh sshd), rank K-1 on
    mlnK, rendezvous id SSH_RUN_ID (the scenario's message tells the operator's agent)."""
    kind: Literal["training_job"]
    launcher: Literal["sbatch", "ssh"] = "sbatch"
    steps: int = Field(default=100000, ge=1)
    slow_rank: int | None = None
    loader_sleep_s: float = Field(default=0.0, ge=0, le=10)
    loader_sleep_fraction: float = Field(default=0.0, ge=0, le=1)
    freeze_rank: int | None = None


class GpuCotenant(_Fault):
    """A second process that keeps GPU 0 busy with matmuls (another user's job on a shared GPU)."""
    kind: Literal["gpu_cotenant"]
    gpu: int = 0


Fault = Annotated[Union[RateLimit, SlowLink, LinkDown, CpuLimit, CpuHog, KillSlurmd, FreezeSlurmd, KillSshd, Fixture,
                        TrainingJob, GpuCotenant], Field(discriminator="kind")]
SSH_RUN_ID = "drill-ssh-train"
CULPRIT_KINDS = ("node", "link", "rank", "gpu", "setting", "none")
TOPICS = ("hang", "slow collective", "straggler", "drift", "dead node", "post-mortem", "control")


class Culprit(BaseModel):
    """A second culprit of another kind (two faults at once: a slow link and a starved node)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["node", "link", "rank", "gpu", "setting"]
    identity: list[str] = Field(min_length=1)


class Truth(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["node", "link", "rank", "gpu", "setting", "none"]
    identity: list[str] = []
    also: list[Culprit] = Field(default=[], max_length=4)   # [[truth.also]]: culprits of other kinds
    # [[truth.same_as]]: the same culprit named by another kind, equally right. A rank held back by its node's own
    # limit (a cgroup quota, another user's busy loops) is "the worker the others wait for" and also what to act on
    # is the node: straggler_find types it "node", a user asking "which worker" expects the rank.
    same_as: list[Culprit] = Field(default=[], max_length=2)
    drain_ok: list[str] = []
    # Other names the evidence itself gives a culprit (a host shortened in a log's prefix and spelled out in a
    # peer field): {"...-48": ["node48"]}. An answer naming the alias is graded as naming the culprit.
    aliases: dict[str, list[str]] = {}
    why: str = ""

    @model_validator(mode="after")
    def _consistent(self):
        if (self.kind == "none") != (not self.identity):
            raise ValueError("truth.identity must be empty exactly when truth.kind is 'none'")
        if self.also and (self.kind == "none" or any(c.kind == self.kind for c in self.also)):
            raise ValueError("truth.also names culprits of kinds other than truth.kind (and not with 'none')")
        if self.same_as and (self.kind == "none" or self.also or any(c.kind == self.kind for c in self.same_as)):
            raise ValueError("truth.same_as names the one culprit by another kind (not with 'none' or truth.also)")
        return self


class Scenario(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str
    message: str = Field(min_length=20)
    place: Literal["local", "cluster", "gpu"]
    nodes: int = Field(default=0, ge=0, le=8)
    transport: Literal["slurm", "ssh"] = "slurm"   # ssh: the agent gets host names and ssh, no SLURM
    topic: Literal["hang", "slow collective", "straggler", "drift", "dead node", "post-mortem", "control"]
    fault: list[Fault] = []
    truth: Truth
    ci: bool = Field(default=False, description="the scripted baseline runs it in CI (fits a 2-core machine)")

    @model_validator(mode="after")
    def _honest(self):
        if self.place == "cluster" and not 1 <= self.nodes <= 8:
            raise ValueError("a cluster scenario needs nodes = 1..8")
        if self.place != "cluster" and self.nodes:
            raise ValueError("nodes is for place = 'cluster' only")
        if self.transport == "ssh" and (self.place != "cluster" or any(
                isinstance(f, (KillSlurmd, FreezeSlurmd, TrainingJob)) for f in self.fault)):
            raise ValueError("transport = 'ssh' is for place = 'cluster' without SLURM faults or jobs")
        if self.transport != "ssh" and any(isinstance(f, KillSshd) for f in self.fault):
            raise ValueError("kill_sshd needs transport = 'ssh' (the nodes' sshd runs only there)")
        text = self.message.lower()
        for word in TOOL_WORDS:
            if word in text:
                raise ValueError(f"the message names the tool {word!r}: say it in the operator's words")
        for culprit in [*self.truth.identity, *(n for c in self.truth.also for n in c.identity)]:
            for part in re.split(r"[-,]", culprit):
                if NODE_NAME.fullmatch(part) and re.search(rf"\b{part}\b", text):
                    raise ValueError(f"the message names the culprit {part!r}")
        used = {getattr(f, "node", None) for f in self.fault} | {getattr(f, "peer", None) for f in self.fault}
        for node in used - {None}:
            if not NODE_NAME.fullmatch(node) or int(node[3:]) > self.nodes:
                raise ValueError(f"fault on {node!r}, which is not one of the scenario's nodes mln1..mln{self.nodes}")
        if self.topic == "control" and self.truth.kind != "none":
            raise ValueError("a control scenario's truth is 'none'")
        return self

    @property
    def node_names(self) -> list[str]:
        return [f"mln{k}" for k in range(1, self.nodes + 1)]


class ScenarioError(ValueError):
    pass


def scenario_path(scenario_id: str) -> Path:
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,63}", scenario_id):
        raise ScenarioError(f"scenario id {scenario_id[:70]!r} is not a scenario name (lowercase letters, digits, '-')")
    path = SCENARIOS_DIR / f"{scenario_id}.toml"
    if not path.is_file():
        raise ScenarioError(f"no scenario {scenario_id!r}; `mleng drill list` shows them")
    return path


def load_scenario(scenario_id: str) -> Scenario:
    path = scenario_path(scenario_id)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        scenario = Scenario(**data)
    except (tomllib.TOMLDecodeError, ValidationError) as e:
        raise ScenarioError(f"{path.name}: {e}") from None
    if scenario.id != path.stem:
        raise ScenarioError(f"{path.name}: id {scenario.id!r} differs from the file name")
    for fault in scenario.fault:
        if isinstance(fault, Fixture):
            for name in fault.files:
                if ".." in Path(name).parts or not (FIXTURES_DIR / name).exists():
                    raise ScenarioError(f"{path.name}: fixture {name!r} is not under evals/scenarios/fixtures")
    return scenario


def all_scenarios() -> list[Scenario]:
    return [load_scenario(p.stem) for p in sorted(SCENARIOS_DIR.glob("*.toml"))]
