"""Every node of a running SLURM job, dumped at once: the per-node dump step (step.py) as one srun step inside
the job (engine/srun.py: --jobid --overlap, one task per node of the job, --kill-on-bad-exit=0, started in
mleng's folder), cut past its deadline and anything left under the step's own name scancelled.
"""

import os
import uuid

from .stacks import ProcessStack
from .step import dump_nodes
from ..engine.data import IMPORT_ROOT
from ..engine.placement import inside_job
from ..engine.spec import ToolFailure
from ..engine.srun import SrunTransport
from ..shared import slurm
from ..shared.process_targets import running_job

MAX_NODES = slurm.MAX_HOSTS
STEP_NAME = "mleng-hang-stack-dump"


def job_transport(job_id: str, job_name: str | None = None) -> SrunTransport:
    """srun inside the job, beside its own steps; a node whose dump fails leaves the others going."""
    return SrunTransport(inside_job(job_id).srun_args, job_name=job_name, kill_on_bad_exit=False,
                         chdir=str(IMPORT_ROOT))


def job_nodes(job_id: str) -> list[str]:
    """The nodes of a job the caller may read (its owner, or root): ToolFailure naming what is wrong."""
    return running_job(job_id).node_names(MAX_NODES)


def hint_nodes(job_id: str) -> list[str]:
    """The job's nodes for the printed all-nodes command: this allocation's when we run inside that job (as each
    node of an all-nodes dump does: no squeue from every node), else squeue's; [] when neither says."""
    try:
        if os.environ.get("SLURM_JOB_ID") == job_id:
            return slurm.allocation_nodes()
        return job_nodes(job_id)
    except (ToolFailure, ValueError):
        return []


def dump_job(job_id: str, nodes: list[str], argv: list[str], per_process_timeout_s: float,
             progress) -> tuple[list[ProcessStack], list[str], list[str], list[str]]:
    """(processes, problems, nodes that sent no report, processes the nodes left out)."""
    srun = job_transport(job_id, f"{STEP_NAME}-{uuid.uuid4().hex[:8]}")
    try:
        return dump_nodes(srun, nodes, argv, per_process_timeout_s, progress, "through srun",
                          silent_hint=f"`scontrol show job {job_id}`, `sinfo -R`")
    except FileNotFoundError:
        raise ToolFailure("srun is not on PATH: run this on a node of the cluster (login or compute).") from None
