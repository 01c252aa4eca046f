"""The small shared harness every tool plugs into.

A tool is one module in `tools/` that defines a `SPEC = ToolSpec(...)`: its name (from the catalog in
DESIGN.md), a description written for an agent, a `Params` model, a `Result` model and a `run()`
function. The harness owns everything else: the registry, argument parsing (`main`), the child
process protocol, timeouts, GPU locks, the results store, MCP wiring. A tool file never parses argv,
spawns its own child, formats tables or talks MCP.

Tool modules are imported by the server at start, so they must import quickly: heavy imports
(torch, matplotlib) go inside `run()`.
"""

import dataclasses
import functools
import os
import signal
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Field", "Params", "Result", "ToolSpec", "Progress", "ToolFailure", "main", "load_data",
    "REPO_ROOT", "KNOWLEDGE_DIR", "spawn_tree", "kill_tree", "descendants", "interrupt_on_sigterm", "torchrun_command", "local_gpu_count",
]

REPO_ROOT = Path(__file__).resolve().parent.parent
KNOWLEDGE_DIR = REPO_ROOT / "knowledge"

Verdict = Literal["ok", "warn", "fail", "info"]
RunsIn = Literal["in_process", "subprocess"]

# progress(fraction_done_0_to_1, message). Cheap to call; the harness rate-limits nothing, so call it
# at natural boundaries (per shape, per size, per rank), not in inner loops.
Progress = Callable[[float, str], None]


class ToolFailure(Exception):
    """A run that could not produce a result: bad environment, missing prerequisite, crashed child.

    The message is shown to the agent as is: say what happened, what was expected, what to do.
    """


class Params(BaseModel):
    """Base for every tool's parameters: unknown fields are refused, values validated on construction."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class JobRef(BaseModel):
    """Set on a result whose run outlived the caller's wait budget: follow it with job_status."""

    job_id: str = Field(description="Pass to job_status / job_cancel.")
    state: str = Field(description="running | done | failed | cancelled")
    elapsed_s: float = Field(description="Seconds since the run started.")


class Result(BaseModel):
    """Base for every tool's result. Subclasses add their measured data; every field needs a default
    (a result that is still running, or returned as a job handle, carries only the base fields)."""

    verdict: Verdict = Field("info", description="ok | warn | fail | info (info: nothing to judge).")
    findings: list[str] = Field(
        default_factory=list, description="Plain sentences with numbers and units, most important first."
    )
    next: list[str] = Field(
        default_factory=list, description="Suggested next tools (catalog names) or knowledge:// pages."
    )
    job: JobRef | None = Field(None, description="Present when the run continues in the background.")
    result_id: int | None = Field(None, description="Row id of this result in the results store.")


@dataclasses.dataclass(frozen=True)
class ToolSpec:
    """Everything the server, the CLI and the runner need to know about one tool."""

    name: str
    summary: str
    description: str
    Params: type[Params]
    Result: type[Result]
    run: Callable[[Any, Progress], Result]
    runs: RunsIn = "in_process"
    read_only: bool = True
    destructive: bool = False
    idempotent: bool = True
    open_world: bool = False
    timeout_s: float = 300.0
    # GPUs (local indices) the run occupies; the runner holds a per-GPU lock on each while it runs.
    gpu_devices: Callable[[Any], list[int]] | None = None
    # Name of the Result field that is the headline figure, for results_history outliers/regressions.
    metric: str | None = None
    higher_is_better: bool = True
    # Whether results are worth keeping in the store (pure look-ups are not).
    store: bool = True
    # Part of `mleng doctor`? Called with {"gpu_count": int, "gpu_names": [str]}; returns the params
    # for a quick, safe run on this machine, or None to sit this machine out. Order: doctor_order.
    doctor: Callable[[dict], dict | None] | None = None
    doctor_order: int = 50

    def __post_init__(self):
        if not self.name.isidentifier() or self.name != self.name.lower():
            raise ValueError(f"tool name {self.name!r}: use lower_snake_case")
        if not issubclass(self.Params, Params) or not issubclass(self.Result, Result):
            raise TypeError(f"{self.name}: Params/Result must subclass harness Params/Result")
        missing = [n for n, f in self.Result.model_fields.items() if f.is_required()]
        if missing:
            raise TypeError(f"{self.name}: Result fields need defaults: {missing}")
        undocumented = [n for n, f in self.Params.model_fields.items() if not f.description]
        if undocumented:
            raise TypeError(f"{self.name}: Params fields need a description: {undocumented}")
        if self.metric and self.metric not in self.Result.model_fields:
            raise ValueError(f"{self.name}: metric {self.metric!r} is not a Result field")


# ---------------------------------------------------------------------------------------------------
# Knowledge data (one source of truth for spec figures: pages and tools read the same TOML)

@functools.cache
def load_data(name: str) -> dict:
    """Parsed `knowledge/data/<name>.toml`. Raises ToolFailure naming the file when it is missing."""
    path = KNOWLEDGE_DIR / "data" / f"{name}.toml"
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ToolFailure(f"data table {path} is missing: reinstall mleng from a full checkout") from None


# ---------------------------------------------------------------------------------------------------
# Processes: tools that launch ranks use these so that nothing outlives a timeout or a cancel.

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


def main(spec: ToolSpec) -> None:
    """`python -m tools.<name> [--field value ...] [--json]`: run one tool from the command line."""
    from tools.cli import run_tool_cli

    sys.exit(run_tool_cli(spec, sys.argv[1:], prog=f"python -m tools.{spec.name}"))

