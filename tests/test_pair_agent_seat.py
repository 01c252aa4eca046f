"""collective_bench pattern=pairwise / bisect from the agent's seat (issue 35): through the real MCP server,
outside any allocation, with partition (a job of our own, cancelled at the end) or job_id (a running job's
nodes); the answer is a job handle that job_status follows to the full report. Namespace cluster, 4 nodes,
gloo on CPU at small sizes."""

from __future__ import annotations

import time

import anyio
import pytest
from mcp import Client

from tests.multinode_cluster import multinode_cluster  # noqa: F401  (fixture)
from tools.engine.mcp_server import build_server

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1200)]

SMALL = {"backend": "gloo", "nproc_per_node": 1, "min_bytes": "32K", "max_bytes": "256K", "factor": 8, "iters": 3,
         "warmup": 1, "pg_timeout_s": 30, "plot": False, "slow_margin": 0.8, "slow_latency_factor": 12}


def follow(**arguments) -> tuple[dict, dict]:
    """(the first answer, job_status's last answer) of one call with a 5 s wait."""
    async def go():
        async with Client(build_server()) as client:
            first = await client.call_tool("collective_bench", {**SMALL, **arguments, "wait_s": 5})
            assert not first.is_error, first.content[0].text
            handle = (first.structured_content.get("job") or {}).get("job_id")
            status = first.structured_content
            for _ in range(200):
                if not handle:
                    break
                status = (await client.call_tool("job_status", {"job_id": handle})).structured_content
                if status["jobs"][0]["state"] != "running":
                    break
                await anyio.sleep(3)
            return first.structured_content, status
    return anyio.run(go)


def our_jobs(cluster) -> list[str]:
    return [line for line in cluster.cmd("squeue", "-h", "-o", "%i %j").stdout.splitlines() if "mleng-" in line]


# Followed through job_status, the report once read isolation.nodes == ['mln1'] (CI, issue 35): the isolation report
# sits inside the result, where the model view cut lists to their first item (tests/test_answer_record.py).
def test_pairwise_with_a_partition_allocates_answers_a_handle_and_job_status_gives_the_report(multinode_cluster,  # noqa: F811
                                                                                                monkeypatch):
    for key in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(key, raising=False)
    multinode_cluster.heal()   # all four idle: a node an earlier module froze can come back DOWN
    first, status = follow(pattern="pairwise", partition="debug", nnodes=4, group_deadline_s=150)
    assert first["job"]["state"] == "running", first
    assert status["jobs"][0]["state"] == "done", status
    report = status["result"]
    assert report["isolation"]["nodes"] == multinode_cluster.nodes and report["isolation"]["rounds"] >= 3
    assert report["verdict"] in ("ok", "warn"), report["findings"]   # healthy: nothing named
    assert not report["isolation"]["suspects"], report["findings"]
    assert any(f.startswith("Ran in SLURM job ") and "a job of our own, cancelled at the end" in f
               for f in report["findings"]), report["findings"]
    for _ in range(20):
        if not our_jobs(multinode_cluster):
            break
        time.sleep(0.5)
    assert our_jobs(multinode_cluster) == []


def test_bisect_in_a_running_jobs_allocation_and_its_job_is_left_running(multinode_cluster, tmp_path):  # noqa: F811
    job = multinode_cluster.cmd("sbatch", "--parsable", "-N4", f"--chdir={tmp_path}", "--job-name=holder",
                                "--wrap", "sleep 600").stdout.strip()
    try:
        for _ in range(60):
            if "RUNNING" in multinode_cluster.cmd("scontrol", "show", "job", "-o", job).stdout:
                break
            time.sleep(0.5)
        _, status = follow(pattern="bisect", job_id=job, group_deadline_s=150)
        report = status["result"]
        assert report["isolation"]["pattern"] == "bisect" and not report["isolation"]["suspects"], report["findings"]
        assert any(f.startswith(f"Ran in SLURM job {job} (beside that job's own steps)") for f in report["findings"])
        assert "RUNNING" in multinode_cluster.cmd("scontrol", "show", "job", "-o", job).stdout
    finally:
        multinode_cluster.cmd("scancel", job, check=False)


def test_a_cancelled_call_cancels_the_job_it_allocated(multinode_cluster, monkeypatch):  # noqa: F811
    for key in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(key, raising=False)

    async def go():
        async with Client(build_server()) as client:
            first = await client.call_tool("collective_bench", {**SMALL, "pattern": "pairwise", "partition": "debug",
                                                                "nnodes": 4, "wait_s": 5})
            for _ in range(60):
                if our_jobs(multinode_cluster):
                    break
                await anyio.sleep(0.5)
            held = our_jobs(multinode_cluster)
            await client.call_tool("job_cancel", {"job_id": first.structured_content["job"]["job_id"]})
            return held

    held = anyio.run(go)
    assert held, "the call never allocated a job"
    for _ in range(40):
        if not our_jobs(multinode_cluster):
            break
        time.sleep(0.5)
    assert our_jobs(multinode_cluster) == [], held
