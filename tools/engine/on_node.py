"""Run a subprocess tool on a named node: the call option `node`, through srun, or over SSH.

    mleng run gpu_health --node gpu-017          # CLI
    gpu_health(node="gpu-017")                    # MCP (any tool whose schema lists `node`)

The runner starts the same child (`python -m <pkg>.engine.child TOOL`, params on stdin, JSON lines on
stdout) under `srun` on that node instead of here (or over ssh where there is no srun, or where
MLENG_TRANSPORT=ssh: engine/transport.py, with its key and host-key rules), so every per-node tool gets it with no code of its
own. Inside an allocation that holds the node, the step joins it (`--overlap`, beside the job's own
steps); otherwise srun asks for a one-node job of its own on that node, in the first partition that
node belongs to, limited to the call's timeout. The node must see the same Python and package path
(a shared filesystem or the same image), as for every multi-node tool.

Trust: the node name is the caller's and is checked against SLURM's node-name characters before it
reaches argv (no shell is involved); the child's output is read through the same parser as a local one.
"""

import os
import re
import shutil
import subprocess

from .placement import inside_allocation, own_job
from .processes import without_secrets
from .remote_step import NODE_ENV, NODE_PATTERN   # noqa: F401  (kept there: the node's end of an SSH step starts light)
from .srun import SrunTransport, unreachable_reason
from .transport import TRANSPORT_ENV, SshTransport

NODE_MAX_CHARS = 255


class NodeUnavailable(RuntimeError):
    """No srun here, or the name is not a node name."""


def _allocation_nodes(env: dict) -> list[str]:
    """Nodes of the allocation we run in, expanded by scontrol (SLURM's own hostlist syntax)."""
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not (env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")) or not nodelist:
        return []
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                             timeout=10, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return out.stdout.split() if out.returncode == 0 else []


def _node_in_slurm(node: str, env: dict) -> tuple[str | None, str | None]:
    """(the first partition `node` is in, its state as sinfo prints it), so a job of our own can land on it; None
    for what sinfo does not say."""
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-n", node, "-o", "%P %T"], capture_output=True, text=True,
                             timeout=10, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    rows = [line.split() for line in out.stdout.splitlines()] if out.returncode == 0 else []
    rows = [row for row in rows if len(row) == 2]
    return (rows[0][0].rstrip("*"), rows[0][1].lower()) if rows else (None, None)


def launcher(env: dict | None = None) -> str:
    """How `node=` reaches the node: "ssh" where MLENG_TRANSPORT=ssh or there is no srun here, else "srun"."""
    env = os.environ if env is None else env
    return "ssh" if env.get(TRANSPORT_ENV) == "ssh" or not shutil.which("srun") else "srun"


def node_command(node: str, cmd: list[str], timeout_s: float, job_name: str,
                 env: dict | None = None) -> tuple[list[str], dict]:
    """(argv, env) that run `cmd` as one task on `node` through srun (and how it was placed) or ssh."""
    if not re.fullmatch(NODE_PATTERN, node):
        raise NodeUnavailable(f"node {node[:80]!r} is not a node name (letters, digits, _ . -)")
    env = without_secrets(dict(os.environ if env is None else env))
    if launcher(env) == "ssh":
        return SshTransport(env).command(node, cmd), env
    if node in _allocation_nodes(env):
        place = inside_allocation()   # beside the allocation's own steps, on the resources it already holds
    else:
        env = own_job(None, timeout_s).env(env)   # not the allocation we may be inside: srun would try it
        partition, state = _node_in_slurm(node, env)
        why = unreachable_reason(state) if state else None
        if why:   # srun would wait for it until the call's timeout and say only that (model round 8, cl-link-down)
            silent = state.endswith("*") or state.startswith(("down", "fail", "unknown"))
            raise NodeUnavailable(f"node: {why}; srun cannot start a task there. " + (
                "slurm_status dials its slurmd from here and says whether the host or only slurmd is down" if silent
                else "A node in this state takes no new job: run the tool over ssh (MLENG_TRANSPORT=ssh), or return "
                     "the node to service first"))
        place = own_job(partition, timeout_s, job_name)
    env = {**place.env(env), NODE_ENV: node}
    return SrunTransport(place.srun_args, kill_on_bad_exit=True).command(node, cmd), env
