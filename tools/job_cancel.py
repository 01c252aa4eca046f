"""job_cancel — stop a long run started by another tool, killing every process it started.

By hand: jobs live inside the MCP server process; from a shell, stop a run with Ctrl-C instead.
"""

from .engine.spec import Field, Params, Result, ToolSpec
from .engine.jobs import MANAGER


class JobCancelParams(Params):
    job_id: str = Field(min_length=1, max_length=64, description=(
        "A result's job.job_id (this session's jobs only)."))


class JobCancelResult(Result):
    state: str | None = Field(None, description="The job's state after the cancel: cancelled, or done/failed if it had ended.")


def run(params: JobCancelParams, progress) -> JobCancelResult:
    job = MANAGER.find(params.job_id)
    if job is None:
        return JobCancelResult(verdict="warn", findings=[f"No job {params.job_id!r} of this session in this server "
                                                         "process."],
                               next=["job_status"])
    if job.finished.is_set():
        return JobCancelResult(verdict="info", state=job.state,
                               findings=[f"Job {job.id} ({job.spec.name}) had already ended: {job.state}."])
    stopped = job.cancel()
    if not job.finished.is_set():
        return JobCancelResult(verdict="warn", state=job.state,
                               findings=[f"Job {job.id} was told to stop but has not ended yet; check job_status."])
    if not stopped:  # it ended on its own between the check above and the cancel
        return JobCancelResult(verdict="info", state=job.state,
                               findings=[f"Job {job.id} ({job.spec.name}) ended on its own before the cancel "
                                         f"reached it: {job.state}."])
    return JobCancelResult(verdict="ok", state=job.state,
                           findings=[f"Job {job.id} ({job.spec.name}) cancelled after {job.elapsed_s():.0f} s;"
                                     " its processes were killed and its GPU locks released."])


SPEC = ToolSpec(
    name="job_cancel", summary="Cancel a long run started by another tool; nothing is left running.",
    description=((
        "Stop (kill) a long-running mleng diagnostic or benchmark that returned a job handle, e.g. started with "
        "the wrong arguments or taking too long: kills its whole process tree and ranks, frees its GPUs. Not for "
        "SLURM jobs (scancel) or the user's own training processes.")),
    Params=JobCancelParams, Result=JobCancelResult, run=run, store=False,
    read_only=False, destructive=True, idempotent=True,
)

if __name__ == "__main__":
    from .engine.cli import tool_main

    tool_main(SPEC)
