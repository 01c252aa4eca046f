"""A running SLURM job's nodes, sampled at once: the straggler_find step (step.py) as one srun step inside the
job (engine/srun.py: --jobid --overlap, one task per node of the job, --kill-on-bad-exit=0).

The job is checked first (exists, RUNNING, the caller's or the caller is root): a wrong id is an answer,
not an srun that waits for resources. srun is stopped (with its step) if it outlives window + 90 s, and
anything left under the step's own name is scancelled.
"""

import uuid

from .models import NodeReport
from .step import sample_nodes
from ..engine.data import IMPORT_ROOT
from ..engine.placement import inside_job
from ..engine.spec import ToolFailure
from ..engine.srun import SrunTransport
from ..shared.process_targets import RunningJob, running_job

MAX_NODES = 64
STEP_NAME = "mleng-straggler-find"


def check_job(job_id: str) -> RunningJob:
    """The running job the caller may read, at most MAX_NODES nodes; ToolFailure naming what is wrong."""
    job = running_job(job_id)
    if job.nodes > MAX_NODES:
        raise ToolFailure(f"slurm_job_id {job_id} spans {job.nodes} nodes; straggler_find samples at most {MAX_NODES} "
                          "at once (the answer must come back in one window).")
    return job


def sample_job(job_id: str, spec: dict, progress) -> tuple[list[NodeReport], list[str]]:
    """Every node's report, and what went wrong on the way (a node without a report, srun's words)."""
    job = check_job(job_id)
    nodes = job.node_names(MAX_NODES)
    # The nodes keep only processes of the job's user (and cgroup): a SLURM_JOB_ID in an environment is a claim.
    spec = {**spec, "job_id": job.job_id, "job_uid": job.uid}
    progress(0.05, f"sampling {len(nodes)} node(s) of job {job_id} ({job.nodelist}) for {spec['window_s']:.0f} s")
    srun = SrunTransport(inside_job(job_id).srun_args, job_name=f"{STEP_NAME}-{uuid.uuid4().hex[:8]}",
                         kill_on_bad_exit=False, chdir=str(IMPORT_ROOT))
    try:
        return sample_nodes(srun, nodes, spec, progress,
                            silent_hint=f"`scontrol show job {job_id}`, `sinfo -R`")
    except FileNotFoundError:
        raise ToolFailure("srun is not on PATH: run straggler_find on a login or compute node of the cluster.") from None
