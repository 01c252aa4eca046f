"""launch_script — write the launcher for a distributed mleng tool or a training command over N nodes x G GPUs.

Three forms: an sbatch script (default), an srun line to run inside an existing allocation, or one
torchrun command per node for machines without SLURM. A training command gets one torchrun per node
(srun task), all meeting at a c10d rendezvous on the first node; `$SLURM_PROCID` is quoted so each
task's own shell expands it; `--kill-on-bad-exit=1` stops every node when one rank fails; NCCL_*
variables are exported into the script; each node and each rank writes its own log file. An mleng
distributed tool (dist_smoke_test, collective_bench, hang_stack_dump) already starts its ranks through
srun when it runs inside an allocation, so the script runs it once and keeps its JSON result.

Every value that reaches a shell is quoted by one function (render.q); control characters are
refused in every field. The script passes --cpus-per-task to srun (SLURM >= 22.05 does not inherit it),
asks for whole nodes (--exclusive) unless told otherwise, takes its rendezvous port from the job id,
and runs a training command on the user's Python as the nodes find it on PATH.

Dry run by default: returns the script text. `submit=true` writes it and runs sbatch (not read-only).

By hand:
    mleng run launch_script --command "train.py --config cfg.yaml" --nnodes 4 --gpus-per-node 8
    mleng run launch_script --tool dist_smoke_test --nnodes 2 --gpus-per-node 8 --submit
    mleng run launch_script --command "train.py" --nnodes 2 --mode torchrun --rdzv-host node1
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Literal

from pydantic import field_validator, model_validator

from . import render
from ..shared import slurm as _slurm
from ..shared.safe_write import output_path, write_output
from ..engine.spec import SELF_EVIDENT, Field, Params, Result, ToolFailure, ToolSpec

MLENG_DIST_TOOLS = ("dist_smoke_test", "collective_bench", "hang_stack_dump")
PASS_THROUGH_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "TORCH_FR_", "FI_", "UCX_", "GLOO_")
SAFE_TEXT = r"^[^\x00-\x1f\x7f]*$"  # no control characters (newlines would start new shell lines)
PATH_TEXT = r"^[A-Za-z0-9_./%+@,:=-]{1,1000}$"  # goes into #SBATCH --output, which no shell unquotes
CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class LaunchScriptParams(Params):
    command: str | None = Field(None, max_length=2000, pattern=SAFE_TEXT, description=(
        "Program and args for torchrun ('train.py --cfg a.yaml', '-m pkg.train'); or tool."))
    tool: Literal[MLENG_DIST_TOOLS] | None = Field(None, description=(
        "An mleng tool to run instead of a command."))
    tool_args: list[str] = Field(default_factory=list, max_length=40, description=(
        "Its CLI arguments, e.g. ['--pg-timeout-s', '30']."))
    nnodes: int = Field(2, ge=1, le=4096, json_schema_extra=SELF_EVIDENT, description="Nodes.")
    gpus_per_node: int = Field(8, ge=0, le=64, description="0: CPU only (gloo).")
    nproc_per_node: int | None = Field(None, ge=1, le=256, description=(
        "Default: gpus_per_node, or 1."))
    mode: Literal["sbatch", "srun", "torchrun"] = Field("sbatch", description=(
        "sbatch script, srun line (in salloc) or per-node torchrun (no SLURM)."))
    job_name: str = Field("mleng", pattern=r"^[A-Za-z0-9_.\-]{1,64}$",
            json_schema_extra=SELF_EVIDENT, description="SLURM job name.")
    partition: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-,]{1,200}$",
            json_schema_extra=SELF_EVIDENT, description="Partition (-p).")
    account: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-]{1,100}$",
            json_schema_extra=SELF_EVIDENT, description="Account (-A).")
    time_limit: str = Field("00:30:00", pattern=r"^(\d+-)?\d+(:\d+){0,2}$", description=(
        "'MM', 'HH:MM:SS' or 'D-HH:MM:SS'."))
    gpu_option: Literal["gpus-per-node", "gres"] = Field("gpus-per-node", description=(
        "--gpus-per-node (cons_tres) or --gres=gpu:G."))
    cpus_per_task: int | None = Field(None, ge=1, le=1024, description=(
        "Per torchrun task; default all (exclusive)."))
    exclusive: bool = Field(True, json_schema_extra=SELF_EVIDENT, description="Whole nodes (#SBATCH --exclusive).")
    extra_sbatch: list[str] = Field(default_factory=list, max_length=20, description=(
        "More #SBATCH options, e.g. ['--qos=high']."))
    env: dict[str, str] = Field(default_factory=dict, max_length=100, description=(
        "Exported on every node."))
    pass_nccl_env: bool = Field(True, description=(
        "Export the NCCL_*, TORCH_*, FI_*, UCX_* variables set now."))
    rdzv_port: int | None = Field(None, ge=1024, le=65535, description=(
        "Default: 20000 + job id % 20000, else 29500."))
    rdzv_host: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-:]{1,255}$", description=(
        "torchrun mode: node 0's address."))
    python: str | None = Field(None, max_length=500, pattern=SAFE_TEXT, description=(
        "Default: python3 on the job's PATH."))
    workdir: str | None = Field(None, max_length=1000, pattern=SAFE_TEXT, description=(
        "Where the job runs and logs; default: the cwd."))
    log_dir: str = Field("logs", pattern=PATH_TEXT, description=(
        "Under workdir (letters, digits, _ . / % + @ , : = -)."))
    submit: bool = Field(False, description="Write and sbatch it (sbatch mode).")
    script_path: str | None = Field(None, max_length=1000, pattern=SAFE_TEXT, description=(
        "Default with submit: <workdir>/<job_name>.sbatch."))
    overwrite: bool = Field(False, json_schema_extra=SELF_EVIDENT, description="Replace script_path if it exists.")

    @field_validator("tool_args", "extra_sbatch")
    @classmethod
    def _no_control_characters(cls, values: list[str]) -> list[str]:
        for v in values:
            if CONTROL.search(v):
                raise ValueError(f"{v[:40]!r}: control characters (newline, tab, ...) are not allowed")
        return values

    @field_validator("extra_sbatch")
    @classmethod
    def _sbatch_options(cls, values: list[str]) -> list[str]:
        for v in values:
            if not v.startswith("-") or len(v) > 200:
                raise ValueError(f"{v[:40]!r}: each extra_sbatch item is one sbatch option starting with '-'")
        return values

    @field_validator("env")
    @classmethod
    def _env_names_and_values(cls, env: dict[str, str]) -> dict[str, str]:
        bad = [k for k in env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", k)]
        if bad:
            raise ValueError(f"not valid environment variable names: {bad[:5]}")
        for k, v in env.items():
            if CONTROL.search(v) or len(v) > 4000:
                raise ValueError(f"env {k}: control characters are not allowed (and at most 4000 characters)")
        return env

    @model_validator(mode="after")
    def _command_splits(self):
        if self.command is not None:
            try:
                words = shlex.split(self.command)
            except ValueError as e:
                raise ValueError(f"command: {e} (it is split like a shell line: close every quote)") from None
            if not words:
                raise ValueError("command is empty")
        return self


class LaunchScriptResult(Result):
    mode: str = Field("", description="sbatch | srun | torchrun.")
    script: str = Field("", description="The sbatch script, or (srun/torchrun modes) the lines to run, one per line.")
    commands: list[str] = Field(default_factory=list, description="srun line, or one torchrun command per node.")
    script_path: str | None = Field(None, description="Where the script was written (submit or script_path).")
    submitted: bool = Field(False, description="Whether sbatch accepted it.")
    job_id: str | None = Field(None, description="SLURM job id when submitted.")
    world_size: int = Field(0, description="Ranks in total (nodes x ranks per node).")


def _exports(params: LaunchScriptParams) -> dict[str, str]:
    env = {}
    if params.pass_nccl_env:
        env.update({k: v for k, v in sorted(os.environ.items()) if k.startswith(PASS_THROUGH_PREFIXES)
                    and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k) and not CONTROL.search(v)})
    env.update(params.env)
    return env


def run(params: LaunchScriptParams, progress) -> LaunchScriptResult:
    if (params.command is None) == (params.tool is None):
        raise ToolFailure("give exactly one of `command` (a training program for torchrun) or `tool` "
                          f"({', '.join(MLENG_DIST_TOOLS)})")
    if params.submit and params.mode != "sbatch":
        raise ToolFailure("submit=true needs mode='sbatch' (srun and torchrun lines are run by you)")
    nproc = params.nproc_per_node or max(1, params.gpus_per_node)
    workdir = params.workdir or os.getcwd()
    findings = [f"{params.nnodes} node(s) x {nproc} rank(s) = {params.nnodes * nproc} ranks"
                + (f", {params.gpus_per_node} GPU(s) per node" if params.gpus_per_node else ", CPU only (gloo)") + "."]
    result = LaunchScriptResult(mode=params.mode, world_size=params.nnodes * nproc,
                                next=["knowledge://orchestration/launchers.md", "knowledge://orchestration/slurm.md"])
    if params.mode == "srun":
        result.commands = [render.srun_line(params, nproc)]
        findings.append("Run this line inside an allocation (salloc or an sbatch script).")
    elif params.mode == "torchrun":
        result.commands = render.torchrun_lines(params, nproc, _exports(params))
        findings.append("Run line i on node i, all at about the same time; FIRST_NODE is the first node's "
                        "address unless rdzv_host was given.")
    else:
        result.script = render.sbatch_script(params, nproc, workdir, _exports(params))
    if params.command:
        findings.append(f"Python on the nodes: {render.interpreter(params)}" + ("" if params.python else
                        " from the job's PATH (the environment you submit from; set python to pin one)") + ".")
    if params.mode == "sbatch" and not params.exclusive and not params.cpus_per_task:
        findings.append("Neither exclusive nor cpus_per_task: each node's task gets SLURM's default CPUs (often 1), "
                        "shared by all its ranks and their data loaders; set cpus_per_task.")
    if params.mode == "torchrun":
        result.script = "".join(f"# on node {i}\n{c}\n" for i, c in enumerate(result.commands))
    elif params.mode == "srun":
        result.script = result.commands[0] + "\n"
    path = params.script_path or (os.path.join(workdir, f"{params.job_name}.sbatch") if params.submit else None)
    if path and params.mode == "sbatch":
        target = write_output(output_path(path, "scripts", f"{params.job_name}.sbatch"), result.script,
                              overwrite=params.overwrite, field="script_path")
        result.script_path = path = str(target)
        findings.append(f"Script written to {path}.")
    if params.mode == "sbatch":  # SLURM opens --output before the script runs: the directory must exist
        if params.submit or params.script_path:
            Path(workdir, params.log_dir).mkdir(parents=True, exist_ok=True)
        else:
            findings.append(f"Create {os.path.join(workdir, params.log_dir)} before sbatch: SLURM opens the "
                            "log file before the script runs, and a missing directory fails the job silently.")
    if params.submit:
        progress(0.5, "submitting with sbatch")
        try:
            out = _slurm.run_cmd(["sbatch", "--parsable", "--chdir", workdir, path], timeout_s=60)
        except _slurm.SlurmError as e:
            raise ToolFailure(f"sbatch refused the script {path}: {e}") from None
        result.job_id = out.strip().split(";")[0]
        result.submitted = True
        findings.append(f"Submitted as job {result.job_id}; logs under {os.path.join(workdir, params.log_dir)}. "
                        f"Follow it with slurm_status, and slurm_job_diagnose --job-id {result.job_id} if it fails.")
        result.next = ["slurm_status", "slurm_job_diagnose", *result.next]
    else:
        findings.append("Dry run: nothing was submitted (submit=true runs sbatch).")
    result.findings = findings
    progress(1.0, "done")
    return result


SPEC = ToolSpec(
    name="launch_script",
    summary="Write an sbatch script / srun line / per-node torchrun commands for a training or mleng tool over N nodes.",
    description=(
        "Writes a multi-node launcher for a training command or an mleng tool (dist_smoke_test, "
        "collective_bench) over N nodes x G GPUs: an sbatch script (default), an srun line for inside salloc, "
        "or per-node torchrun commands without SLURM; one torchrun per node, c10d rendezvous, "
        "--kill-on-bad-exit, partition and NCCL variables, per-rank logs, every value quoted. Use for 'how do "
        "I launch on 4 nodes', 'write me an sbatch script', 'torchrun multi-node command', 'submit the smoke "
        "test to 8 nodes'. A dry run unless submit=true (runs sbatch, returns the job id). Not for diagnosing "
        "a job (slurm_job_diagnose)."),
    Params=LaunchScriptParams, Result=LaunchScriptResult, run=run,
    runs="subprocess", read_only=False, destructive=True, idempotent=False, open_world=True,
    timeout_s=90, store=False,
    spans_nodes=True,  # reaches the cluster itself: the engine's node= option does not apply
)
