"""Every tool call is a job: it runs on a thread of its own, the caller waits up to `wait_s`.

MCP tasks are not in the SDK. A call waits up to its wait budget; if the run is still going, the
call answers with a Result whose `job` field holds the handle, and the run goes on. `job_status`
shows progress and, once done, the result; `job_cancel` stops it (a subprocess run's whole process
tree is killed). The server and the CLI both go through `JobManager.start` and `wait`, so both offer
the same wait-or-hand-back behaviour. Jobs live in the process that started them; finished results
are also in the results store.

At most `max_runs` subprocess runs go at once per process (MLENG_MAX_RUNS, default 4): beyond that a
call is refused with a "busy" answer naming the caller's own runs in progress and counting the others,
rather than letting twenty smoke tests take the host's memory. In-process calls are short and never
count, so job_status and job_cancel always answer. Over HTTP, where many clients share the server, one
caller (a session, or all sessionless requests together) holds at most max_runs - 1 of the slots, so a
token holder starting long runs with wait_s 0 cannot shut every other session out.

Sessions own their jobs: a job records the caller that started it (an HTTP session; ANONYMOUS for a
sessionless HTTP request; None for stdio and the CLI, the process's one client), and `visible` / `find`
give a caller only its own. An HTTP server has many clients; one must not read another's results (env
values, log evidence) or cancel its runs. An ANONYMOUS caller lists nothing: it follows a job by the
id its call returned, 128 random bits, so the id itself is the capability.
"""

import contextvars
import os
import threading
import time
import uuid

from .printable import printable
from .redact import redact
from .runner import Cancelled, DeadlineExceeded, deadline_message, execute
from .spec import JobRef, Params, Progress, Result, ToolFailure, ToolSpec

MAX_FINISHED_KEPT = 200
IN_PROCESS_GRACE_S = 1.0   # an in-process run gets this long past its deadline to notice it


class Busy(ToolFailure):
    """Too many runs in progress: the call was refused, nothing was started."""


# The longest one job_status call waits for a job's end: it runs in the server's process, whose calls are capped
# at the spec's timeout (30 s), and the wait stays under it. The handle says it, so an agent knows a long run
# takes several calls rather than one long wait.
STATUS_WAIT_MAX_S = 25


# Who is calling: set on each job's thread to the job's owner, so job_status and job_cancel (in-process
# tools, run on that thread) see the jobs of the session that called them.
CALLER: contextvars.ContextVar[str | None] = contextvars.ContextVar("mleng_caller", default=None)
ANONYMOUS = "anonymous"   # sessionless HTTP callers: each holds only the ids it was given


class Job:
    def __init__(self, spec: ToolSpec, params: Params, timeout_s: float | None, owner: str | None = None,
                 node: str | None = None):
        self.id = uuid.uuid4().hex   # 128 random bits: with no session, holding the id is owning the job
        self.owner = owner
        self.spec = spec
        self.params = params
        self.node = node
        self.timeout_s = timeout_s or spec.timeout_s
        self.started = time.time()
        self.deadline = time.monotonic() + self.timeout_s
        self.ended: float | None = None
        self.state = "running"          # running | done | failed | cancelled
        self.fraction = 0.0
        self.message = "starting"
        self.progress_log: list[tuple[float, float, str]] = []   # (elapsed_s, fraction, message)
        self.result: Result | None = None
        self.error: str | None = None
        self.cancel_event = threading.Event()
        self.finished = threading.Event()
        self._end_lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name=f"job-{spec.name}-{self.id}", daemon=True)

    def _progress(self, fraction: float, message: str) -> None:
        # Progress notifications must increase: keep the running maximum.
        self.fraction = max(self.fraction, min(max(fraction, 0.0), 1.0))
        self.message = message = printable(redact(str(message)))
        self.progress_log.append((round(time.time() - self.started, 2), self.fraction, message))
        del self.progress_log[:-50]  # bounded: the last 50 events are enough to see where it is

    def _end(self, state: str, result: Result | None = None, error: str | None = None) -> bool:
        """Record how the job ended, once: a late in-process thread cannot overwrite a deadline."""
        with self._end_lock:
            if self.finished.is_set():
                return False
            # An error is one line: a newline or CR in it came from outside (a process's name, a file) and would
            # start a forged line of its own in the CLI and in what the agent reads. Secrets are redacted too.
            self.state, self.result, self.error = state, result, (
                printable(redact(error), newlines=False) if error else error)
            self.ended = time.time()
            self.finished.set()
            return True

    def _work(self) -> None:
        CALLER.set(self.owner)
        try:
            result = execute(self.spec, self.params, self._progress, timeout_s=self.timeout_s,
                             cancel=self.cancel_event, job_id=self.id, node=self.node)
            self._end("done", result=result)
        except Cancelled as e:
            self._end("cancelled", error=str(e))
        except ToolFailure as e:
            self._end("failed", error=str(e))
        except Exception as e:  # a bug in a tool: report it, never take the server down
            self._end("failed", error=f"internal error in {self.spec.name}: {type(e).__name__}: {e}")

    def check_deadline(self) -> None:
        """An in-process run that never reports progress cannot be interrupted: past its deadline the
        job ends as failed and whatever the thread returns later is dropped."""
        if (not self.finished.is_set() and self.spec.runs == "in_process"
                and time.monotonic() > self.deadline + IN_PROCESS_GRACE_S):
            self._end("failed", error=deadline_message(self.spec, self.timeout_s, killed=False))

    def elapsed_s(self) -> float:
        return round((self.ended or time.time()) - self.started, 2)

    def cancel(self, wait_s: float = 10.0) -> bool:
        """Stop the run; True when this call stopped it (False: it had already ended by itself)."""
        if self.finished.is_set():
            return False
        self.cancel_event.set()
        self.finished.wait(wait_s)
        if self.spec.runs == "in_process":
            self._end("cancelled", error=f"{self.spec.name} was cancelled.")
        return self.state == "cancelled"

    def handle(self) -> Result:
        """The answer for a caller whose wait budget ran out: the job handle and where the run is."""
        return self.spec.Result(
            verdict="info", job=JobRef(job_id=self.id, state=self.state, elapsed_s=self.elapsed_s()),
            findings=[f"{self.spec.name} is still running after {self.elapsed_s():.0f} s"
                      f" ({self.fraction:.0%}: {self.message}). Follow it with job_status(job_id='{self.id}',"
                      f" wait_s={STATUS_WAIT_MAX_S:g}): one call waits up to {STATUS_WAIT_MAX_S:g} s and answers as"
                      " soon as the run ends; stop it with job_cancel."],
            next=["job_status", "job_cancel"])

    def outcome(self) -> Result:
        """The result of a finished job, or the handle of a running one; raises ToolFailure (Cancelled
        for a cancelled run) when it failed."""
        if not self.finished.is_set():
            return self.handle()
        if self.state == "done":
            return self.result
        if self.state == "cancelled":
            raise Cancelled(self.error or f"{self.spec.name} was cancelled")
        raise ToolFailure(self.error or f"{self.spec.name} {self.state}")


class JobManager:
    def __init__(self, max_runs: int | None = None):
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()
        self.max_runs = max_runs or int(os.environ.get("MLENG_MAX_RUNS", "4"))

    def start(self, spec: ToolSpec, params: Params, timeout_s: float | None = None, owner: str | None = None,
              node: str | None = None) -> Job:
        job = Job(spec, params, timeout_s, owner, node)
        with self._lock:
            if spec.runs == "subprocess":
                running = [j for j in self._jobs.values() if j.spec.runs == "subprocess" and not j.finished.is_set()]
                if len(running) >= self.max_runs:
                    raise Busy(_busy_message(running, owner, self.max_runs))
                own = [j for j in running if owner is not None and j.owner == owner]
                if self.max_runs > 1 and len(own) >= self.max_runs - 1:
                    raise Busy(_busy_message(running, owner, self.max_runs, per_caller=True))
            self._jobs[job.id] = job
            finished = [j for j in self._jobs.values() if j.finished.is_set()]
            for old in sorted(finished, key=lambda j: j.started)[:-MAX_FINISHED_KEPT]:
                del self._jobs[old.id]
        job._thread.start()
        return job

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def find(self, job_id: str) -> Job | None:
        """The caller's own job with this id (CALLER); another session's job is as unknown as a wrong id."""
        job = self.get(job_id)
        return job if job is not None and job.owner == CALLER.get() else None

    def visible(self) -> list[Job]:
        """The caller's own jobs (CALLER)."""
        caller = CALLER.get()
        return [] if caller == ANONYMOUS else [j for j in self.all() if j.owner == caller]

    def all(self) -> list[Job]:
        with self._lock:
            return list(self._jobs.values())

    def cancel_all(self) -> None:
        for job in self.all():
            if not job.finished.is_set():
                job.cancel()


def _busy_message(running: list[Job], owner: str | None, max_runs: int, per_caller: bool = False) -> str:
    mine = [j for j in running if j.owner == owner and owner != ANONYMOUS]
    listed = "".join(f"; yours: {j.spec.name} ({j.id}, {j.elapsed_s():.0f} s)" for j in mine)
    limit = (f"the most one caller of a shared server may hold ({max_runs - 1} of MLENG_MAX_RUNS={max_runs})"
             if per_caller else f"the most this server runs at once (MLENG_MAX_RUNS={max_runs})")
    return (f"busy: {len(running)} runs are in progress ({len(mine)} of this session, {len(running) - len(mine)} of "
            f"other sessions{listed}), {limit}. Wait for one "
            "with job_status, stop one of yours with job_cancel, or try again later; nothing was started.")


def wait(job: Job, wait_s: float, progress: Progress | None = None, poll_s: float = 0.1) -> Result:
    """Block up to wait_s for `job`, forwarding progress; its outcome (see Job.outcome)."""
    end = time.monotonic() + wait_s
    reported = -1.0
    while not job.finished.wait(min(poll_s, max(0.0, end - time.monotonic()))):
        job.check_deadline()
        if progress and job.fraction > reported:
            reported = job.fraction
            progress(job.fraction, job.message)
        if time.monotonic() >= end:
            break
    return job.outcome()


# One manager per process: tool calls and the job_status / job_cancel tools share it.
MANAGER = JobManager()

__all__ = ["ANONYMOUS", "Busy", "CALLER", "Cancelled", "DeadlineExceeded", "Job", "JobManager", "MANAGER", "wait"]
