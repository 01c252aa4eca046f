"""launch_script — write the launcher for a distributed mleng tool or a training command over N nodes x G GPUs.

Three forms: an sbatch script (default), an srun line to run inside an existing allocation, or one
torchrun command per node for machines without SLURM. A training command gets one torchrun per node
(srun task), all meeting at a c10d rendezvous on the first node; `$SLURM_PROCID` is quoted so each
task's own shell expands it; `--kill-on-bad-exit=1` stops every node when one rank fails; NCCL_*
variables are exported into the script; each node and each rank writes its own log file. An mleng
distributed tool (dist_smoke_test, collective_bench, hang_stack_dump) already starts its ranks through
srun when it runs inside an allocation, so the script runs it once and keeps its JSON result.

Dry run by default: returns the script text. `submit=true` writes it and runs sbatch (not read-only).

By hand:
    python -m tools.launch_script --command "train.py --config cfg.yaml" --nnodes 4 --gpus-per-node 8
    python -m tools.launch_script --tool dist_smoke_test --nnodes 2 --gpus-per-node 8 --submit
    python -m tools.launch_script --command "train.py" --nnodes 2 --mode torchrun --rdzv-host node1
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path
from typing import Literal

from .shared import slurm as _slurm
from .engine.data import IMPORT_ROOT as REPO_ROOT
from .engine.spec import Field, Params, Result, ToolFailure, ToolSpec
from .engine.processes import torchrun_command

MLENG_DIST_TOOLS = ("dist_smoke_test", "collective_bench", "hang_stack_dump")
PASS_THROUGH_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "TORCH_FR_", "FI_", "UCX_", "GLOO_")
SAFE_TEXT = r"^[^\n\r\x00]*$"


class LaunchScriptParams(Params):
    command: str | None = Field(None, max_length=2000, pattern=SAFE_TEXT, description=(
        "The training program and its arguments, as given to torchrun: 'train.py --cfg a.yaml' or "
        "'-m mypkg.train --lr 3e-4'. Exactly one of command / tool."))
    tool: Literal[MLENG_DIST_TOOLS] | None = Field(None, description=(
        "An mleng distributed tool to run across the nodes instead of a training command."))
    tool_args: list[str] = Field(default_factory=list, max_length=40, description=(
        "Extra command-line arguments for the tool, e.g. ['--pg-timeout-s', '30']."))
    nnodes: int = Field(2, ge=1, le=4096, description="Nodes.")
    gpus_per_node: int = Field(8, ge=0, le=64, description="GPUs per node to request (0: CPU only, gloo).")
    nproc_per_node: int | None = Field(None, ge=1, le=256, description=(
        "Ranks per node (default: gpus_per_node, or 1 without GPUs)."))
    mode: Literal["sbatch", "srun", "torchrun"] = Field("sbatch", description=(
        "sbatch: a batch script; srun: one line for inside salloc; torchrun: per-node commands, no SLURM."))
    job_name: str = Field("mleng", pattern=r"^[A-Za-z0-9_.\-]{1,64}$", description="SLURM job name.")
    partition: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-,]{1,200}$", description="Partition (-p).")
    account: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-]{1,100}$", description="Account (-A).")
    time_limit: str = Field("00:30:00", pattern=r"^(\d+-)?\d+(:\d+){0,2}$", description=(
        "Time limit in SLURM form: 'MM', 'HH:MM:SS' or 'D-HH:MM:SS'."))
    gpu_option: Literal["gpus-per-node", "gres"] = Field("gpus-per-node", description=(
        "How to ask for GPUs: --gpus-per-node=G (select/cons_tres, SLURM 19.05+) or --gres=gpu:G (older "
        "clusters, select/cons_res)."))
    cpus_per_task: int | None = Field(None, ge=1, le=1024, description="CPUs for each node's torchrun task.")
    extra_sbatch: list[str] = Field(default_factory=list, max_length=20, description=(
        "More #SBATCH options, e.g. ['--exclusive', '--qos=high']."))
    env: dict[str, str] = Field(default_factory=dict, description=(
        "Variables to export on every node, e.g. {'NCCL_DEBUG': 'WARN'}."))
    pass_nccl_env: bool = Field(True, description=(
        "Also export the NCCL_*, TORCH_NCCL_*, TORCH_DISTRIBUTED_*, FI_*, UCX_* variables set here now."))
    rdzv_port: int = Field(29500, ge=1024, le=65535, description="Rendezvous port on the first node.")
    rdzv_host: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-:]{1,255}$", description=(
        "torchrun mode: the first node's address (sbatch/srun find it themselves)."))
    python: str | None = Field(None, max_length=500, pattern=SAFE_TEXT, description=(
        "Python interpreter on the nodes (default: the one running mleng)."))
    workdir: str | None = Field(None, max_length=1000, pattern=SAFE_TEXT, description=(
        "Directory the job runs in and logs go under (default: the current one)."))
    log_dir: str = Field("logs", max_length=1000, pattern=SAFE_TEXT, description=(
        "Log directory, relative to workdir: per-node files %x-%j-node<N>.out, per-rank files under <job id>/."))
    submit: bool = Field(False, description="Write the script and submit it with sbatch (sbatch mode only).")
    script_path: str | None = Field(None, max_length=1000, pattern=SAFE_TEXT, description=(
        "Where to write the script (default with submit: <workdir>/<job_name>.sbatch)."))


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
        env.update({k: v for k, v in sorted(os.environ.items()) if k.startswith(PASS_THROUGH_PREFIXES)})
    env.update(params.env)
    bad = [k for k in env if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k)]
    if bad:
        raise ToolFailure(f"not valid environment variable names: {bad}")
    return env


def _torchrun_line(params: LaunchScriptParams, nproc: int, endpoint: str, rdzv_id: str,
                   is_host: str, log_dir: str | None) -> str:
    """The per-node torchrun command for a training program, as shell text. `endpoint`, `rdzv_id`,
    `is_host` and `log_dir` may hold shell expansions that each node's shell fills in."""
    words = shlex.split(params.command)
    cmd = torchrun_command("PLACEHOLDER", nproc, [], nnodes=params.nnodes, rdzv_endpoint="E", rdzv_id="I")
    cmd[0] = params.python or sys.executable
    head = [w for w in cmd[:cmd.index("-m", 3)] if not w.startswith(("--rdzv-endpoint=", "--rdzv-id="))]
    if params.nnodes == 1:  # --standalone picks its own port; keep it simple for one node
        return shlex.join(head + words)
    parts = [shlex.join(head), f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}", is_host]
    if log_dir:
        parts += [f"--log-dir={log_dir}", "--tee=3"]
    return " ".join(parts + [shlex.join(words)])


def _tool_line(params: LaunchScriptParams, nproc: int) -> str:
    py = params.python or sys.executable
    return shlex.join([py, "-m", f"tools.{params.tool}", "--nnodes", str(params.nnodes),
                       "--nproc-per-node", str(nproc), *params.tool_args, "--json"])


HEAD_LOOKUP = """head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
# NodeAddr is how SLURM itself reaches the node; node names need not resolve everywhere.
head_addr=$(scontrol show node "$head_node" -o | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')
export MASTER_ADDR=${head_addr:-$head_node} MASTER_PORT=%d"""


def sbatch_script(params: LaunchScriptParams, nproc: int, workdir: str) -> str:
    log_dir = params.log_dir
    lines = ["#!/bin/bash", f"#SBATCH --job-name={params.job_name}", f"#SBATCH --nodes={params.nnodes}",
             "#SBATCH --ntasks-per-node=1"]
    if params.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={params.gpus_per_node}" if params.gpu_option == "gpus-per-node"
                     else f"#SBATCH --gres=gpu:{params.gpus_per_node}")
    if params.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={params.cpus_per_task}")
    lines.append(f"#SBATCH --time={params.time_limit}")
    lines += [f"#SBATCH --partition={params.partition}"] if params.partition else []
    lines += [f"#SBATCH --account={params.account}"] if params.account else []
    lines.append(f"#SBATCH --output={log_dir}/%x-%j.out")
    lines += [f"#SBATCH {opt}" for opt in params.extra_sbatch]
    lines += ["# Written by mleng launch_script.", "set -euo pipefail",
              f"cd {shlex.quote(workdir)}", f"mkdir -p {shlex.quote(log_dir)}"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in _exports(params).items()]
    if params.tool:
        lines += [f"export PYTHONPATH={shlex.quote(str(REPO_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}",
                  "# The tool starts one torchrun per node through srun itself and prints one JSON report.",
                  f"{_tool_line(params, nproc)} > {shlex.quote(log_dir)}/\"$SLURM_JOB_NAME-$SLURM_JOB_ID.json\""]
        return "\n".join(lines) + "\n"
    lines.append(HEAD_LOOKUP % params.rdzv_port)
    per_node = _torchrun_line(params, nproc, "$MASTER_ADDR:$MASTER_PORT", "$SLURM_JOB_ID",
                              _slurm.RDZV_IS_HOST, f"{log_dir}/$SLURM_JOB_ID/node$SLURM_PROCID")
    lines += ["# One torchrun per node; single quotes keep $SLURM_PROCID for each task's own shell.",
              f"srun --kill-on-bad-exit=1 --export=ALL --ntasks-per-node=1 "
              f"--output={log_dir}/%x-%j-node%t.out bash -c {shlex.quote(per_node)}"]
    return "\n".join(lines) + "\n"


def srun_line(params: LaunchScriptParams, nproc: int) -> str:
    if params.tool:
        return _tool_line(params, nproc)
    if params.nnodes == 1:
        inner = _torchrun_line(params, nproc, "", "", "", None)
    else:
        inner = _torchrun_line(params, nproc, f"$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)"
                               f":{params.rdzv_port}", "$SLURM_JOB_ID", _slurm.RDZV_IS_HOST, None)
    return (f"srun --nodes={params.nnodes} --ntasks-per-node=1 --kill-on-bad-exit=1 --export=ALL "
            f"bash -c {shlex.quote(inner)}")


def torchrun_lines(params: LaunchScriptParams, nproc: int) -> list[str]:
    if params.tool:
        if params.nnodes == 1:
            return [_tool_line(params, nproc)]
        host = params.rdzv_host or "FIRST_NODE"
        same_everywhere = shlex.join([params.python or sys.executable, "-m", f"tools.{params.tool}",
                                      "--nnodes", str(params.nnodes), "--nproc-per-node", str(nproc),
                                      "--rdzv-endpoint", f"{host}:{params.rdzv_port}", *params.tool_args])
        return [same_everywhere] * params.nnodes
    host = params.rdzv_host or "FIRST_NODE"
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in _exports(params).items())
    return [(exports + " " if exports else "")
            + _torchrun_line(params, nproc, f"{host}:{params.rdzv_port}", "mleng",
                             f"--rdzv-conf=is_host={int(i == 0)}", None) for i in range(params.nnodes)]


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
        result.commands = [srun_line(params, nproc)]
        findings.append("Run this line inside an allocation (salloc or an sbatch script).")
    elif params.mode == "torchrun":
        result.commands = torchrun_lines(params, nproc)
        findings.append("Run line i on node i, all at about the same time; FIRST_NODE is the first node's "
                        "address unless rdzv_host was given.")
    else:
        result.script = sbatch_script(params, nproc, workdir)
    if params.mode == "torchrun":
        result.script = "".join(f"# on node {i}\n{c}\n" for i, c in enumerate(result.commands))
    elif params.mode == "srun":
        result.script = result.commands[0] + "\n"
    path = params.script_path or (os.path.join(workdir, f"{params.job_name}.sbatch") if params.submit else None)
    if path and params.mode == "sbatch":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(result.script)
        result.script_path = path
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
        "Generate a correct multi-node launcher: an sbatch script (default), an srun line for inside salloc, or "
        "per-node torchrun commands without SLURM, for a training command or an mleng distributed tool "
        "(dist_smoke_test, collective_bench, hang_stack_dump) over N nodes x G GPUs. One torchrun per node, c10d "
        "rendezvous on the first node, $SLURM_PROCID expanded per task, --kill-on-bad-exit, NCCL variables "
        "exported, per-node and per-rank log files. Use for 'how do I launch on 4 nodes', 'write me an sbatch "
        "script', 'torchrun multi-node command'. Instant and read-only by default (a dry run); submit=true "
        "writes the script and runs sbatch, returning the job id. Not for diagnosing a job (slurm_job_diagnose)."),
    Params=LaunchScriptParams, Result=LaunchScriptResult, run=run,
    runs="subprocess", read_only=False, destructive=False, idempotent=False, open_world=True,
    timeout_s=90, store=False,
)

if __name__ == "__main__":
    from .engine.cli import tool_main

    tool_main(SPEC)
