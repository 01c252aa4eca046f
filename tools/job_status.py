"""job_status — follow a long run that another tool started and handed back as a job.

By hand: jobs live inside the MCP server process, so this tool is useful through the server;
`mleng run job_status --job-id ID` from a shell only finds jobs of that same process (none).
Finished runs are also in the results store: `mleng run results_history --tool NAME`.
"""

import time
from collections import Counter
from typing import Any

from .engine.rendering import answer_record
from .engine.spec import Field, Params, Record, Result, ToolSpec
from .engine.jobs import ANONYMOUS, CALLER, MANAGER, STATUS_WAIT_MAX_S as WAIT_MAX_S


class JobStatusParams(Params):
    job_id: str = Field("", max_length=64, description="The handle's job_id.")
    all_sessions: bool = Field(False, description="Count other sessions' jobs too (no ids).")
    wait_s: float = Field(0, ge=0, le=WAIT_MAX_S, description="Seconds to wait for its end.")


class JobInfo(Record):
    job_id: str = Field(description="Job id.")
    tool: str = Field(description="Tool the job runs.")
    state: str = Field(description="running | done | failed | cancelled")
    elapsed_s: float = Field(description="Seconds since it started (until it ended).")
    fraction_done: float = Field(description="Last progress fraction reported, 0..1.")
    message: str = Field(description="Last progress message.")


class OtherJobs(Record):
    tool: str = Field(description="Tool the jobs run.")
    state: str = Field(description="running | done | failed | cancelled")
    count: int = Field(description="How many jobs of other sessions.")


class JobStatusResult(Result):
    whole_fields = ("result",)     # already the tool's own model view (answer_record): cut no further

    jobs: list[JobInfo] = Field(default_factory=list, description="The job asked for, or this session's jobs.")
    other_sessions: list[OtherJobs] = Field(default_factory=list, description=(
        "With all_sessions: other sessions' jobs, counted per tool and state."))
    recent_progress: list[str] = Field(default_factory=list, description="Last progress messages of the job.")
    error: str | None = Field(None, description="Why the job failed or was cancelled.")
    result: dict[str, Any] | None = Field(None, description=(
        "The tool's answer once the job is done, as the tool itself answers (not_shown: what results_history has)."))


def _info(job) -> JobInfo:
    return JobInfo(job_id=job.id, tool=job.spec.name, state=job.state, elapsed_s=job.elapsed_s(),
                   fraction_done=round(job.fraction, 3), message=job.message)


def _others() -> list[OtherJobs]:
    mine = {j.id for j in MANAGER.visible()}
    counts = Counter((j.spec.name, j.state) for j in MANAGER.all() if j.id not in mine)
    return [OtherJobs(tool=t, state=s, count=n) for (t, s), n in sorted(counts.items())]


def _wait_for(job, wait_s: float, progress) -> None:
    """Block until the job ends or wait_s passes; progress() each second is where a cancelled call stops."""
    end = time.monotonic() + wait_s
    while not job.finished.is_set() and (left := end - time.monotonic()) > 0:
        progress(1 - left / wait_s, f"waiting for {job.spec.name} ({job.fraction:.0%}: {job.message})")
        job.finished.wait(min(1.0, left))


def run(params: JobStatusParams, progress) -> JobStatusResult:
    if not params.job_id:
        jobs = sorted(MANAGER.visible(), key=lambda j: j.started, reverse=True)
        running = sum(j.state == "running" for j in jobs)
        out = JobStatusResult(verdict="info", jobs=[_info(j) for j in jobs],
                              findings=[f"{len(jobs)} job(s) of this session, {running} running."])
        if CALLER.get() == ANONYMOUS:
            out.findings = ["This HTTP connection has no session, so no jobs are listed: follow a run with the "
                            "job_id its call returned (job.job_id)."]
        if params.all_sessions:
            out.other_sessions = _others()
            out.findings.append(f"{sum(o.count for o in out.other_sessions)} job(s) of other sessions, "
                                f"{sum(o.count for o in out.other_sessions if o.state == 'running')} running.")
        return out
    job = MANAGER.find(params.job_id)
    if job is None:
        return JobStatusResult(
            verdict="warn", findings=[f"No job {params.job_id!r} of this session in this server process. Jobs are "
                                      "lost when the server restarts; finished results stay in the results store."],
            next=["results_history"])
    _wait_for(job, params.wait_s, progress)
    out = JobStatusResult(jobs=[_info(job)], error=job.error,
                          recent_progress=[f"{t:.1f}s {f:.0%} {m}" for t, f, m in job.progress_log[-10:]])
    if job.state == "running":
        out.verdict = "info"
        out.findings = [f"{job.spec.name} still running after {job.elapsed_s():.0f} s, {job.fraction:.0%} done:"
                        f" {job.message}. Call job_status again (wait_s={WAIT_MAX_S:g} waits up to {WAIT_MAX_S:g} s"
                        " for the end), or job_cancel to stop it."]
        out.next = ["job_status", "job_cancel"]
    elif job.state == "done":
        out.result = answer_record(job.result)
        out.verdict = job.result.verdict
        # Its findings are said once, in `result` (the tool's answer as the tool gives it).
        out.findings = [f"{job.spec.name} finished in {job.elapsed_s():.0f} s; its answer is `result`."]
        out.next = job.result.next
    else:
        out.verdict = "fail"
        out.findings = [f"{job.spec.name} {job.state} after {job.elapsed_s():.0f} s: {job.error}"]
    return out


SPEC = ToolSpec(
    name="job_status", summary="Progress and result of a long run that returned a job handle.",
    description=(
        "Check on a long-running mleng diagnostic or benchmark that returned a job handle: is it done, its "
        "progress, the full result once done; without job_id this session's jobs. SLURM jobs: slurm_job_diagnose."),
    Params=JobStatusParams, Result=JobStatusResult, run=run, store=False, idempotent=False,
)

if __name__ == "__main__":
    from .engine.cli import tool_main

    tool_main(SPEC)
