"""The text launch_script writes: sbatch script, srun line, per-node torchrun commands (no SPEC).

Every value that reaches a shell goes through `q` (shlex.quote); the few shell expansions the
scripts need on purpose ($MASTER_ADDR, $SLURM_PROCID, the port from the job id) are written here as
literal text, never built from a caller's value. #SBATCH lines are read by sbatch, not by a shell:
their values are restricted by the parameter patterns and control characters are refused everywhere.
"""

from __future__ import annotations

import shlex
import sys

from ..shared import slurm as _slurm
from ..engine.data import IMPORT_ROOT as REPO_ROOT
from ..engine.data import PACKAGE
from ..engine.processes import torchrun_command

q = shlex.quote
# A port per job, so two jobs that share a node (or a stale rendezvous of the last one) do not meet.
JOB_PORT = "$(( 20000 + SLURM_JOB_ID % 20000 ))"
# SLURM >= 22.05: srun no longer inherits --cpus-per-task from sbatch; without it every node's torchrun and
# all its ranks share one core. SRUN_CPUS_PER_TASK is what srun reads.
CPUS = "${SLURM_CPUS_PER_TASK:-$SLURM_CPUS_ON_NODE}"


def interpreter(p) -> str:
    """A training command runs on the user's Python as the compute node finds it on PATH (the job inherits
    the submitting shell's environment); an mleng tool needs mleng's own interpreter."""
    return p.python or (sys.executable if p.tool else "python3")


def exports(p, env: dict[str, str]) -> list[str]:
    return [f"export {k}={q(v)}" for k, v in env.items()]


def torchrun_line(p, nproc: int, endpoint: str, rdzv_id: str, is_host: str, log_dir: str | None) -> str:
    """The per-node torchrun command for a training program, as shell text. `endpoint`, `rdzv_id`,
    `is_host` and `log_dir` are shell text written by this module (they may hold expansions)."""
    words = shlex.split(p.command)
    cmd = torchrun_command("PLACEHOLDER", nproc, [], nnodes=p.nnodes, rdzv_endpoint="E", rdzv_id="I")
    cmd[0] = interpreter(p)
    head = [w for w in cmd[:cmd.index("-m", 3)] if not w.startswith(("--rdzv-endpoint=", "--rdzv-id="))]
    if p.nnodes == 1:  # --standalone picks its own port; keep it simple for one node
        return shlex.join(head + words)
    parts = [shlex.join(head), f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}", is_host]
    if log_dir:
        parts += [f"--log-dir={log_dir}", "--tee=3"]
    return " ".join(parts + [shlex.join(words)])


def tool_line(p, nproc: int) -> str:
    return shlex.join([interpreter(p), "-m", f"{PACKAGE}.{p.tool}", "--nnodes", str(p.nnodes),
                       "--nproc-per-node", str(nproc), *p.tool_args, "--json"])


# The first node: `awk 'NR==1'` reads every line, where `head -n 1` would exit after one and, with many
# nodes, scontrol dies of SIGPIPE: under `set -o pipefail` that is exit 141 and the job ends before training.
FIRST_NODE = """$(scontrol show hostnames "$SLURM_JOB_NODELIST" | awk 'NR==1')"""
HEAD_LOOKUP = """head_node=""" + FIRST_NODE + """
# NodeAddr is how SLURM itself reaches the node; node names need not resolve everywhere.
head_addr=$(scontrol show node "$head_node" -o | tr ' ' '\\n' | sed -n 's/^NodeAddr=//p')
export MASTER_ADDR=${head_addr:-$head_node} MASTER_PORT=%s"""


def sbatch_header(p) -> list[str]:
    lines = ["#!/bin/bash", f"#SBATCH --job-name={p.job_name}", f"#SBATCH --nodes={p.nnodes}",
             "#SBATCH --ntasks-per-node=1"]
    if p.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={p.gpus_per_node}" if p.gpu_option == "gpus-per-node"
                     else f"#SBATCH --gres=gpu:{p.gpus_per_node}")
    if p.cpus_per_task:
        lines.append(f"#SBATCH --cpus-per-task={p.cpus_per_task}")
    if p.exclusive:
        lines.append("#SBATCH --exclusive")
    lines.append(f"#SBATCH --time={p.time_limit}")
    lines += [f"#SBATCH --partition={p.partition}"] if p.partition else []
    lines += [f"#SBATCH --account={p.account}"] if p.account else []
    lines.append(f"#SBATCH --output={p.log_dir}/%x-%j.out")
    return lines + [f"#SBATCH {opt}" for opt in p.extra_sbatch]


def sbatch_script(p, nproc: int, workdir: str, env: dict[str, str]) -> str:
    lines = sbatch_header(p)
    lines += ["# Written by mleng launch_script.", "set -euo pipefail", f"cd {q(workdir)}", f"mkdir -p {q(p.log_dir)}"]
    lines += exports(p, env)
    lines += ["# srun (SLURM >= 22.05) does not inherit --cpus-per-task from sbatch: pass it on.",
              f"export SRUN_CPUS_PER_TASK={CPUS}"]
    if p.tool:
        lines += [f"export PYTHONPATH={q(str(REPO_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}",
                  "# The tool starts one torchrun per node through srun itself and prints one JSON report.",
                  f"{tool_line(p, nproc)} > {q(p.log_dir)}/\"$SLURM_JOB_NAME-$SLURM_JOB_ID.json\""]
        return "\n".join(lines) + "\n"
    lines.append(HEAD_LOOKUP % (p.rdzv_port or JOB_PORT))
    per_node = torchrun_line(p, nproc, "$MASTER_ADDR:$MASTER_PORT", "$SLURM_JOB_ID", _slurm.RDZV_IS_HOST,
                             f"{q(p.log_dir)}/\"$SLURM_JOB_ID\"/node\"$SLURM_PROCID\"")
    lines += ["# One torchrun per node; single quotes keep $SLURM_PROCID for each task's own shell.",
              f"srun --kill-on-bad-exit=1 --export=ALL --ntasks-per-node=1 --cpus-per-task=\"$SRUN_CPUS_PER_TASK\" "
              f"--output={q(p.log_dir + '/%x-%j-node%t.out')} bash -c {q(per_node)}"]
    return "\n".join(lines) + "\n"


def srun_line(p, nproc: int) -> str:
    if p.tool:
        return tool_line(p, nproc)
    if p.nnodes == 1:
        inner = torchrun_line(p, nproc, "", "", "", None)
    else:
        port = p.rdzv_port or JOB_PORT
        inner = torchrun_line(p, nproc, f"{FIRST_NODE}:{port}",
                              "$SLURM_JOB_ID", _slurm.RDZV_IS_HOST, None)
    return (f"srun --nodes={p.nnodes} --ntasks-per-node=1 --kill-on-bad-exit=1 --export=ALL "
            f"--cpus-per-task=\"{CPUS}\" bash -c {q(inner)}")


def torchrun_lines(p, nproc: int, env: dict[str, str]) -> list[str]:
    host = p.rdzv_host or "FIRST_NODE"
    port = p.rdzv_port or 29500
    if p.tool:
        if p.nnodes == 1:
            return [tool_line(p, nproc)]
        same_everywhere = shlex.join([interpreter(p), "-m", f"{PACKAGE}.{p.tool}", "--nnodes", str(p.nnodes),
                                      "--nproc-per-node", str(nproc), "--rdzv-endpoint", f"{host}:{port}", *p.tool_args])
        return [same_everywhere] * p.nnodes
    prefix = " ".join(f"{k}={q(v)}" for k, v in env.items())
    return [(prefix + " " if prefix else "")
            + torchrun_line(p, nproc, q(f"{host}:{port}"), "mleng", f"--rdzv-conf=is_host={int(i == 0)}", None)
            for i in range(p.nnodes)]
