"""One execution contract for every call: a deadline, cancellation and progress, in-process or not;
a limit on concurrent runs that never starves job_status; the CLI's --wait-s."""

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

import fault_tools
from tools.engine import jobs
from tools.engine.jobs import Busy, JobManager
from tools.engine.spec import ToolSpec

ROOT = Path(__file__).resolve().parent.parent


def test_cancel_stops_an_in_process_run_within_a_second():
    manager = JobManager()
    job = manager.start(fault_tools.SPINNER, fault_tools.FaultParams(seconds=30))
    time.sleep(0.2)
    t0 = time.monotonic()
    assert job.cancel(wait_s=5) is True
    assert time.monotonic() - t0 < 1.0
    assert job.state == "cancelled"
    with pytest.raises(jobs.Cancelled):
        job.outcome()


def test_an_in_process_run_is_stopped_at_its_deadline():
    manager = JobManager()
    job = manager.start(fault_tools.SPINNER, fault_tools.FaultParams(seconds=30), timeout_s=0.5)
    job.finished.wait(5)
    assert job.state == "failed" and "did not finish within its timeout of 0.5 s" in job.error


def test_a_silent_in_process_run_past_its_deadline_ends_the_wait():
    manager = JobManager()
    job = manager.start(fault_tools.SILENT, fault_tools.FaultParams(seconds=20))
    t0 = time.monotonic()
    with pytest.raises(jobs.ToolFailure, match="timeout of 1 s"):
        jobs.wait(job, wait_s=30)
    assert time.monotonic() - t0 < 1 + jobs.IN_PROCESS_GRACE_S + 1


def test_cancel_of_a_finished_job_says_it_had_ended():
    manager = JobManager()
    job = manager.start(fault_tools.SPINNER, fault_tools.FaultParams(seconds=0))
    job.finished.wait(5)
    assert job.cancel() is False and job.state == "done"


def test_in_process_tools_must_be_short():
    with pytest.raises(ValueError, match="must be short"):
        ToolSpec(name="too_long", summary="s", description="d", Params=fault_tools.FaultParams,
                 Result=fault_tools.FaultResult, run=lambda p, progress: None, runs="in_process", timeout_s=600)


def test_the_run_limit_refuses_with_busy_and_job_status_still_answers(tmp_path):
    from tools.job_status import JobStatusParams
    from tools.job_status import run as job_status

    manager = JobManager(max_runs=1)
    first = manager.start(fault_tools.SLEEPER, fault_tools.FaultParams(pid_file=str(tmp_path / "pids")))
    try:
        with pytest.raises(Busy, match=r"busy: 1 runs are in progress \(1 of this session.*yours: test_sleeper"):
            manager.start(fault_tools.SLEEPER, fault_tools.FaultParams(pid_file=str(tmp_path / "pids2")))
        in_process = manager.start(fault_tools.SPINNER, fault_tools.FaultParams(seconds=0))  # never counted
        assert jobs.wait(in_process, 5).verdict == "ok"
        t0 = time.monotonic()
        job_status(JobStatusParams(), lambda f, m: None)
        assert time.monotonic() - t0 < 1.0
    finally:
        first.cancel()
    assert not (tmp_path / "pids2").exists(), "the refused call started nothing"


def test_cli_wait_s_prints_the_handle_then_the_result(tmp_path):
    script = ("import sys; sys.path.insert(0, 'tests'); import fault_tools; from tools.engine.cli import run_tool_cli; "
              "sys.exit(run_tool_cli(fault_tools.SPINNER, ['--seconds', '1.5', '--wait-s', '0.3', '--json'], prog='x'))")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "MLENG_HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    decoder, text, docs = json.JSONDecoder(), out.stdout.strip(), []
    while text:
        doc, end = decoder.raw_decode(text)
        docs.append(doc)
        text = text[end:].strip()
    handle, final = docs
    assert handle["job"]["state"] == "running" and "still running" in handle["findings"][0]
    assert final["verdict"] == "ok" and final["job"] is None


def _stdio_server(tmp_path, extra_env=None):
    env = {"MLENG_HOME": str(tmp_path), "PATH": os.environ["PATH"], **(extra_env or {})}
    return subprocess.Popen([sys.executable, "server.py"], cwd=ROOT, env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)


def _send(proc, message):
    proc.stdin.write((json.dumps(message) + "\n").encode())
    proc.stdin.flush()


def _read_until(proc, want_id, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            return None
        msg = json.loads(line)
        if msg.get("id") == want_id:
            return msg
    return None


def test_sigterm_ends_a_stdio_server_with_a_call_in_flight(tmp_path):
    """Issue: a stdio server that had served a call never exited on SIGTERM, and the call got no answer."""
    proc = _stdio_server(tmp_path)
    try:
        _send(proc, {"jsonrpc": "2.0", "id": 0, "method": "initialize",
                     "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": {"name": "t", "version": "1"}}})
        assert _read_until(proc, 0, 60) is not None
        _send(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        _send(proc, {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                     "params": {"name": "accelerator_specs", "arguments": {"names": ["h100"]}}})
        assert _read_until(proc, 1, 60)["result"]["isError"] is False
        _send(proc, {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                     "params": {"name": "storage_bench", "arguments": {
                         "path": str(tmp_path), "wait_s": 600, "size_mib": 4, "random_read_s": 600,
                         "small_files": 0, "time_budget_s": 3600}}})
        time.sleep(1.5)  # the storage run is in flight
        children = psutil.Process(proc.pid).children(recursive=True)
        t0 = time.monotonic()
        proc.terminate()
        answer = _read_until(proc, 2, 10)
        proc.wait(10)
        assert time.monotonic() - t0 < 2.5
        assert answer is not None and answer["result"]["isError"] is True
        time.sleep(0.5)
        assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_one_caller_of_a_shared_server_cannot_hold_every_run_slot(tmp_path):
    """Review 2026-12-02 R16: an HTTP session starting long runs with wait_s 0 took all MLENG_MAX_RUNS slots
    and every other session got 'busy'. One caller now holds at most max_runs - 1."""
    manager = JobManager(max_runs=2)
    mine = manager.start(fault_tools.SLEEPER, fault_tools.FaultParams(pid_file=str(tmp_path / "a")), owner="session:a")
    theirs = None
    try:
        with pytest.raises(Busy, match=r"the most one caller of a shared server may hold \(1 of MLENG_MAX_RUNS=2\)"):
            manager.start(fault_tools.SLEEPER, fault_tools.FaultParams(pid_file=str(tmp_path / "b")), owner="session:a")
        theirs = manager.start(fault_tools.SLEEPER, fault_tools.FaultParams(pid_file=str(tmp_path / "c")),
                               owner="session:b")
    finally:
        for job in (mine, theirs):
            if job is not None:
                job.cancel()
    assert not (tmp_path / "b").exists(), "the refused call started nothing"


def test_the_one_client_of_stdio_or_the_cli_may_use_every_slot(tmp_path):
    manager = JobManager(max_runs=2)
    jobs_ = [manager.start(fault_tools.SLEEPER, fault_tools.FaultParams(pid_file=str(tmp_path / f"p{k}")))
             for k in range(2)]
    for job in jobs_:
        job.cancel()


def test_job_status_waits_for_the_end_and_a_cancelled_wait_stops():
    # Round 6: agents polled job_status six times for one pairwise run; it could not wait. It waits up to wait_s,
    # answers when the job ends, and a cancelled job_status call stops waiting at its next progress report.
    from tools.job_status import JobStatusParams
    from tools.job_status import run as job_status

    job = jobs.MANAGER.start(fault_tools.SPINNER, fault_tools.FaultParams(seconds=1.5))
    try:
        t0 = time.monotonic()
        out = job_status(JobStatusParams(job_id=job.id, wait_s=0.3), lambda f, m: None)
        assert out.jobs[0].state == "running" and 0.25 < time.monotonic() - t0 < 1.0, out.findings
        assert "wait_s=25 waits up to 25 s for the end" in out.findings[0]
        # The handle a long call answers with says the same cap: a long run takes several job_status calls.
        assert f"job_status(job_id='{job.id}', wait_s=25): one call waits up to 25 s" in job.handle().findings[0]
        out = job_status(JobStatusParams(job_id=job.id, wait_s=20), lambda f, m: None)
        assert out.jobs[0].state == "done" and out.result is not None and time.monotonic() - t0 < 5, out.findings
        assert job_status(JobStatusParams(job_id=job.id), lambda f, m: None).jobs[0].state == "done"   # at once
    finally:
        job.cancel()

    def cancelled(fraction, message):
        raise jobs.Cancelled("job_status was cancelled.")

    job = jobs.MANAGER.start(fault_tools.SPINNER, fault_tools.FaultParams(seconds=10))
    try:
        t0 = time.monotonic()
        with pytest.raises(jobs.Cancelled):
            job_status(JobStatusParams(job_id=job.id, wait_s=20), cancelled)
        assert time.monotonic() - t0 < 1.0 and job.state == "running"     # the waited-on job goes on
    finally:
        job.cancel()
    with pytest.raises(ValueError, match="wait_s"):
        JobStatusParams(job_id="x", wait_s=60)
