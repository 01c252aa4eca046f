"""Long runs: each subprocess tool call is a job on its own thread, so a call can return a handle.

MCP tasks are not in the SDK. Instead a tool call waits up to its `wait_s` budget; if the run is
still going, the call returns a Result whose `job` field holds the handle, and the run goes on.
`job_status` shows progress and, once done, the result; `job_cancel` kills the run's process tree.
Jobs live in the process that started them (the server); finished results are also in the store.
"""

import threading
import time
import uuid

from tools.harness import Params, Result, ToolFailure, ToolSpec
from tools.runner import Cancelled, execute

MAX_FINISHED_KEPT = 200


class Job:
    def __init__(self, spec: ToolSpec, params: Params, timeout_s: float | None):
        self.id = uuid.uuid4().hex[:12]
        self.spec = spec
        self.params = params
        self.timeout_s = timeout_s
        self.started = time.time()
        self.ended: float | None = None
        self.state = "running"          # running | done | failed | cancelled
        self.fraction = 0.0
        self.message = "starting"
        self.progress_log: list[tuple[float, float, str]] = []   # (elapsed_s, fraction, message)
        self.result: Result | None = None
        self.error: str | None = None
        self.cancel_event = threading.Event()
        self.finished = threading.Event()
        self._thread = threading.Thread(target=self._work, name=f"job-{spec.name}-{self.id}", daemon=True)

    def _progress(self, fraction: float, message: str) -> None:
        # Progress notifications must increase: keep the running maximum.
        self.fraction = max(self.fraction, min(max(fraction, 0.0), 1.0))
        self.message = message
        self.progress_log.append((round(time.time() - self.started, 2), self.fraction, message))
        del self.progress_log[:-50]  # bounded: the last 50 events are enough to see where it is

    def _work(self) -> None:
        try:
            self.result = execute(self.spec, self.params, self._progress, timeout_s=self.timeout_s,
                                  cancel=self.cancel_event, job_id=self.id)
            self.state = "done"
        except Cancelled as e:
            self.state, self.error = "cancelled", str(e)
        except ToolFailure as e:
            self.state, self.error = "failed", str(e)
        except Exception as e:  # a bug in a tool: report it, never take the server down
            self.state, self.error = "failed", f"internal error in {self.spec.name}: {type(e).__name__}: {e}"
        finally:
            self.ended = time.time()
            self.finished.set()

    def elapsed_s(self) -> float:
        return round((self.ended or time.time()) - self.started, 2)

    def cancel(self, wait_s: float = 10.0) -> None:
        self.cancel_event.set()
        self.finished.wait(wait_s)


class JobManager:
    def __init__(self):
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def start(self, spec: ToolSpec, params: Params, timeout_s: float | None = None) -> Job:
        job = Job(spec, params, timeout_s)
        with self._lock:
            self._jobs[job.id] = job
            finished = [j for j in self._jobs.values() if j.finished.is_set()]
            for old in sorted(finished, key=lambda j: j.started)[:-MAX_FINISHED_KEPT]:
                del self._jobs[old.id]
        job._thread.start()
        return job

    def get(self, job_id: str) -> Job | None:
        with self._lock:
            return self._jobs.get(job_id)

    def all(self) -> list[Job]:
        with self._lock:
            return list(self._jobs.values())

    def cancel_all(self) -> None:
        for job in self.all():
            if not job.finished.is_set():
                job.cancel()


# One manager per process: the server's tool calls and the job_status / job_cancel tools share it.
MANAGER = JobManager()
