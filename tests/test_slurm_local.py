"""The SLURM tools against a real local SLURM (scripts/slurm-local.sh via tests/slurm_cluster.py).

Jobs that take time (one killed at its 1-minute limit, ~60-90 s) are submitted once, when the module's
cluster starts, and the tests that need them run last, so the waiting overlaps the other tests.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time

import pytest

from tests.slurm_cluster import slurm_cluster  # noqa: F401  (fixture)
from tools import launch_script, slurm_job_diagnose, slurm_status
from tools.engine.spec import ToolFailure
from tools.engine.runner import execute

pytestmark = pytest.mark.slurm

HAS_TRIAGE = importlib.util.find_spec("tools.log_triage") is not None
HAS_SMOKE = importlib.util.find_spec("tools.dist_smoke_test") is not None

FAIL_SCRIPT = """#!/bin/bash
echo "step 12 loss 2.31"
echo "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB" >&2
exit 3
"""


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory):  # noqa: F811
    """Submit the four diagnosed jobs at once; the 1-minute TIMEOUT one runs while other tests do."""
    work = tmp_path_factory.mktemp("slurm-jobs")
    (work / "fail.sh").write_text(FAIL_SCRIPT)
    ids = {
        "timeout": slurm_cluster.sbatch("--time=1", "-J", "too-long", "--wrap", "sleep 300", cwd=work),
        "ok": slurm_cluster.sbatch("-J", "fine", "--wrap", "echo all good", cwd=work),
        "fail": slurm_cluster.sbatch("-J", "crash", "-o", "crash-%j.log", str(work / "fail.sh"), cwd=work),
        "cancel": slurm_cluster.sbatch("-J", "unwanted", "--wrap", "sleep 300", cwd=work),
        # An array whose task 1 fails, each task with its own log file.
        "array": slurm_cluster.sbatch("-J", "sweep", "--array=0-1", "-o", "sweep-%A_%a.log", "--wrap",
                                      "echo task $SLURM_ARRAY_TASK_ID; exit $SLURM_ARRAY_TASK_ID", cwd=work),
        # A 2-node step in which the task on the second node exits 3.
        "step": slurm_cluster.sbatch("-J", "two-nodes", "-N", "2", "--wrap",
                                     "srun bash -c 'if [ $SLURM_PROCID = 1 ]; then exit 3; fi; sleep 1'", cwd=work),
    }
    return {"dir": work, "ids": ids, "submitted": time.monotonic()}


def diagnose(job_id: str, **kw) -> slurm_job_diagnose.SlurmJobDiagnoseResult:
    spec = slurm_job_diagnose.SPEC
    return execute(spec, spec.Params(job_id=job_id, **kw))


def test_completed_job_is_ok(slurm_cluster, jobs):  # noqa: F811
    assert slurm_cluster.wait_state(jobs["ids"]["ok"]) == "COMPLETED"
    r = diagnose(jobs["ids"]["ok"])
    assert r.verdict == "ok" and r.state == "COMPLETED" and r.exit_code == 0
    assert r.stdout_path and r.stdout_path.endswith(f"slurm-{jobs['ids']['ok']}.out")
    assert "scontrol" in r.sources


def test_exit_3_is_diagnosed_with_step_and_log(slurm_cluster, jobs):  # noqa: F811
    job = jobs["ids"]["fail"]
    assert slurm_cluster.wait_state(job) == "FAILED"
    r = diagnose(job)
    assert r.verdict == "fail" and r.state == "FAILED"
    assert (r.exit_code, r.signal) == (3, 0)
    assert r.reason == "NonZeroExitCode"
    assert r.stdout_path.endswith(f"crash-{job}.log")
    assert any("exited with code 3" in f for f in r.findings)
    if slurm_cluster.accounting:
        assert "sacct" in r.sources
        assert r.failing_step == "batch" and r.failing_node in slurm_cluster.nodes
        assert any(s.step == "batch" and s.exit_code == 3 for s in r.steps)
    if HAS_TRIAGE:  # the CUDA OOM line in the log is named by log_triage
        assert any("memory" in f.lower() for f in r.log_findings), r.log_findings


def test_failing_step_and_node_of_a_two_node_job(slurm_cluster, jobs):  # noqa: F811
    job = jobs["ids"]["step"]
    assert slurm_cluster.wait_state(job) == "FAILED"
    r = diagnose(job)
    assert r.verdict == "fail" and r.exit_code == 3
    assert r.failing_node == "n2"  # srun's own "srun: error: n2: task 1: Exited with exit code 3"
    assert any("srun named the failing node" in f and "n2" in f for f in r.findings)
    if slurm_cluster.accounting:
        assert r.failing_step == "0"  # the srun step, not the batch script around it
        assert any(s.step == "0" and s.exit_code == 3 for s in r.steps)


def test_array_task(slurm_cluster, jobs):  # noqa: F811
    task = f"{jobs['ids']['array']}_1"
    assert slurm_cluster.wait_state(task) == "FAILED"
    r = diagnose(task)
    assert r.state == "FAILED" and r.exit_code == 1 and r.verdict == "fail"
    assert r.stdout_path.endswith(f"sweep-{task}.log")
    assert diagnose(f"{jobs['ids']['array']}_0").verdict == "ok"


def test_cancelled_job(slurm_cluster, jobs):  # noqa: F811
    job = jobs["ids"]["cancel"]
    assert slurm_cluster.wait_state(job, {"RUNNING"}) == "RUNNING"
    slurm_cluster.cmd("scancel", job)
    assert slurm_cluster.wait_state(job) == "CANCELLED"
    r = diagnose(job)
    assert r.verdict == "fail" and r.state == "CANCELLED"
    assert any("cancelled" in f.lower() for f in r.findings)
    assert "knowledge://orchestration/slurm.md" in r.next


def test_drained_node_shows_with_reason_and_who(slurm_cluster):  # noqa: F811
    reason = "mleng test: xid 79 on gpu 0"
    slurm_cluster.cmd("scontrol", "update", "nodename=n2", "state=drain", f"reason={reason}")
    try:
        r = execute(slurm_status.SPEC, slurm_status.SlurmStatusParams(all_users=True))
    finally:
        slurm_cluster.cmd("scontrol", "update", "nodename=n2", "state=resume")
    assert r.verdict == "warn"
    (n2,) = [n for n in r.problem_nodes if n.node == "n2"]
    assert "DRAIN" in n2.state and n2.reason == reason and n2.set_by == "root" and n2.since
    assert not any(n.node == "n1" for n in r.problem_nodes)
    debug = next(p for p in r.partitions if p.name == "debug")
    assert debug.nodes_total == 2 and debug.nodes_unavailable == 1 and debug.default
    assert any("n2" in f and reason in f for f in r.findings)
    assert "gpu_health" in r.next


def test_pending_reasons_and_gpus_in_use(slurm_cluster, tmp_path):  # noqa: F811
    holder = slurm_cluster.sbatch("-p", "gpu", "--gres=gpu:1", "-J", "gpu-holder", "--wrap", "sleep 60",
                                  cwd=tmp_path)
    after = slurm_cluster.sbatch("-J", "waits", f"--dependency=afterok:{holder}", "--wrap", "true", cwd=tmp_path)
    huge = slurm_cluster.sbatch("-J", "too-big", "-N", "3", "--wrap", "true", cwd=tmp_path)
    try:
        assert slurm_cluster.wait_state(holder, {"RUNNING"}) == "RUNNING"
        time.sleep(1)  # let the scheduler set the reasons
        r = execute(slurm_status.SPEC, slurm_status.SlurmStatusParams())
        by_id = {j.job_id: j for j in r.jobs}
        assert by_id[after].state == "PENDING" and by_id[after].reason == "Dependency"
        assert "another job" in by_id[after].reason_explained
        assert by_id[huge].reason == "PartitionNodeLimit" and "never start" in by_id[huge].reason_explained
        assert r.verdict == "warn"  # a job that can never start is worth a warning
        gpu = next(p for p in r.partitions if p.name == "gpu")
        assert gpu.gpus_total == 2 and gpu.gpus_used == 1 and gpu.gpus_free == 1
        pending = [j.state for j in r.jobs]
        assert pending.index("RUNNING") > pending.index("PENDING")  # pending first
        only_gpu = execute(slurm_status.SPEC, slurm_status.SlurmStatusParams(partition="gpu"))
        assert [p.name for p in only_gpu.partitions] == ["gpu"] and [j.job_id for j in only_gpu.jobs] == [holder]
        with pytest.raises(ToolFailure, match="partitions here: debug, gpu"):
            execute(slurm_status.SPEC, slurm_status.SlurmStatusParams(partition="nope"))
    finally:
        slurm_cluster.cmd("scancel", holder, after, huge)


def test_text_fallback_reads_the_same_nodes(slurm_cluster):  # noqa: F811
    from tools.shared import slurm as _slurm

    from_json = slurm_status.nodes_from_json(_slurm.json_or_none(["sinfo"]))
    from_text = slurm_status.nodes_from_scontrol(_slurm.run_cmd(["scontrol", "show", "node", "-d", "-o"]))
    key = lambda n: (n["name"], n["gpus"], sorted(n["partitions"]))  # noqa: E731
    assert sorted(map(key, from_json)) == sorted(map(key, from_text)) == [
        ("n1", 1, ["debug", "gpu"]), ("n2", 1, ["debug", "gpu"])]


RANK_PROGRAM = """
import os, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(4) * (dist.get_rank() + 1)
dist.all_reduce(t)
world = dist.get_world_size()
assert t[0].item() == world * (world + 1) / 2
print(f"rank {dist.get_rank()} of {world} node {os.environ['SLURM_PROCID']} sum {t[0].item():.0f} OK", flush=True)
dist.destroy_process_group()
"""


def test_launch_script_command_runs_one_torchrun_per_node(slurm_cluster, tmp_path):  # noqa: F811
    (tmp_path / "ranks.py").write_text(RANK_PROGRAM)
    p = launch_script.LaunchScriptParams(
        command="ranks.py", nnodes=2, gpus_per_node=0, nproc_per_node=1, time_limit="5", job_name="cmd2",
        workdir=str(tmp_path), rdzv_port=29531, env={"NCCL_DEBUG": "WARN"}, submit=True)
    r = execute(launch_script.SPEC, p)
    assert r.submitted and r.job_id
    assert slurm_cluster.wait_state(r.job_id, timeout_s=120) == "COMPLETED", \
        (tmp_path / "logs" / f"cmd2-{r.job_id}.out").read_text()
    node_logs = sorted((tmp_path / "logs").glob(f"cmd2-{r.job_id}-node*.out"))
    assert [f.name for f in node_logs] == [f"cmd2-{r.job_id}-node0.out", f"cmd2-{r.job_id}-node1.out"]
    text = "".join(f.read_text() for f in node_logs)
    assert text.count("sum 3 OK") == 2 and "node 0" in text and "node 1" in text  # each task its own PROCID
    rank_logs = list((tmp_path / "logs" / r.job_id).rglob("stdout.log"))
    assert len(rank_logs) == 2  # one per rank, from torchrun --log-dir
    assert diagnose(r.job_id).verdict == "ok"


@pytest.mark.skipif(not HAS_SMOKE, reason="tools.dist_smoke_test has not landed yet")
def test_launch_script_runs_dist_smoke_test_across_two_tasks(slurm_cluster, tmp_path):  # noqa: F811
    p = launch_script.LaunchScriptParams(
        tool="dist_smoke_test", tool_args=["--backend", "gloo", "--pg-timeout-s", "30"], nnodes=2,
        gpus_per_node=0, nproc_per_node=1, time_limit="5", job_name="smoke2", workdir=str(tmp_path), submit=True)
    r = execute(launch_script.SPEC, p)
    assert r.submitted
    state = slurm_cluster.wait_state(r.job_id, timeout_s=150)
    out = tmp_path / "logs" / f"smoke2-{r.job_id}.json"
    log = (tmp_path / "logs" / f"smoke2-{r.job_id}.out").read_text()
    assert state == "COMPLETED", log[-3000:]
    report = json.loads(out.read_text())
    assert report["verdict"] == "ok", report
    assert report["world_size"] == 2 and report["ranks_ok"] == 2 and report["nnodes"] == 2
    assert all(rank["status"] == "done" for rank in report["ranks"])


def test_srun_torchrun_into_a_running_jobs_allocation(slurm_cluster, tmp_path):  # noqa: F811
    """What the distributed tools do when 'given' an allocation: one torchrun per node of a running job."""
    import subprocess

    from tools.shared import slurm as _slurm

    holder = slurm_cluster.sbatch("-N", "2", "-J", "training", "--wrap", "sleep 120", cwd=tmp_path)
    try:
        assert slurm_cluster.wait_state(holder, {"RUNNING"}) == "RUNNING"
        (tmp_path / "whoami.py").write_text(RANK_PROGRAM)
        cmd = _slurm.srun_torchrun_command(["whoami"], nnodes=2, nproc_per_node=1, rdzv_port=29533, job_id=holder)
        assert f"--jobid={holder}" in cmd and "--overlap" in cmd
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=90, cwd=tmp_path,
                             env={**os.environ, "PYTHONPATH": str(tmp_path)})
        per_node = _slurm.split_labelled_output(out.stdout)
        assert sorted(per_node) == [0, 1], out.stderr[-2000:]
        assert all("sum 3 OK" in text for text in per_node.values())
    finally:
        slurm_cluster.cmd("scancel", holder)


def test_diagnose_from_log_files_alone(slurm_cluster, jobs, monkeypatch):  # noqa: F811
    """What a user gets once slurmctld has forgotten the job and there is no accounting."""
    job = jobs["ids"]["fail"]
    assert slurm_cluster.wait_state(job) == "FAILED"
    def no_accounting(job_id, not_seen):
        not_seen.append("accounting (slurmdbd) is off here")
        return None, [], None

    monkeypatch.setattr(slurm_job_diagnose, "from_scontrol", lambda job_id: None)
    monkeypatch.setattr(slurm_job_diagnose, "from_sacct", no_accounting)
    r = slurm_job_diagnose.run(slurm_job_diagnose.SlurmJobDiagnoseParams(
        job_id=job, log_paths=[str(jobs["dir"] / f"crash-{job}.log")]), lambda f, m: None)
    assert r.sources == ["log files"] and r.state is None
    assert any("state unknown" in f for f in r.findings)
    if HAS_TRIAGE:  # the log's CUDA OOM line decides the verdict
        assert r.verdict == "fail" and any("memory" in f.lower() for f in r.log_findings)
    assert any("no longer remembers" in s for s in r.not_seen)
    assert any("accounting" in s for s in r.not_seen)


def test_timeout_job_is_diagnosed(slurm_cluster, jobs):  # noqa: F811
    """Runs last: the job was submitted at session start and SLURM ends it 60-90 s after it started."""
    job = jobs["ids"]["timeout"]
    assert slurm_cluster.wait_state(job, timeout_s=150) == "TIMEOUT"
    r = diagnose(job)
    assert r.verdict == "fail" and r.state == "TIMEOUT"
    assert r.time_limit_s == 60 and r.elapsed_s >= 60
    assert any("time limit" in f for f in r.findings)
    assert "knowledge://training/checkpoints.md" in r.next
    if slurm_cluster.accounting:
        from tools.shared import slurm as _slurm

        # The job-completion log (what sacct -c reads without slurmdbd) agrees.
        text = _slurm.run_cmd(["sacct", "-c", "-P", "-n", "-j", job, "-o",
                               ",".join(slurm_job_diagnose.SACCT_FIELDS_MIN)])
        info, _ = slurm_job_diagnose.parse_sacct(text, slurm_job_diagnose.SACCT_FIELDS_MIN, job)
        assert info["state"] == "TIMEOUT" and info["time_limit_s"] == 60
    # From the log file alone, SLURM's own "DUE TO TIME LIMIT" line still gives the cause.
    state, _, evidence = slurm_job_diagnose.scan_slurm_lines([slurm_job_diagnose.Path(r.stdout_path)])
    assert state == "TIMEOUT" and "TIME LIMIT" in evidence
