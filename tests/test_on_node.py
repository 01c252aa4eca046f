"""The engine's `node` call option (engine/on_node.py): any one-node subprocess tool run on a named SLURM
node through srun, on the multi-node test cluster (tests/multinode_cluster.py: every node its own
hostname), inside an allocation that holds the node and as a job of its own; refusals named."""

from __future__ import annotations

import os
import time

import pytest
from mcp import Client

from tests.multinode_cluster import multinode_cluster  # noqa: F401  (the fixture)
from tools.engine import store
from tools.engine.mcp_server import build_server, input_schema
from tools.engine.on_node import NODE_ENV, NodeUnavailable, node_command
from tools.engine.registry import registry
from tools.engine.runner import execute
from tools.engine.spec import ToolFailure, takes_node

ENV_REPORT = registry()["env_report"]


def _run(node: str, timeout_s: float = 120):
    return execute(ENV_REPORT, ENV_REPORT.Params(probe_torch=False), timeout_s=timeout_s, node=node)


def _jobs_named(cluster, name: str) -> list[str]:
    out = cluster.cmd("squeue", "-h", "-t", "all", "-n", name, "-o", "%i").stdout
    return out.split()


# ---- without a cluster ---------------------------------------------------------------------------

def test_the_option_is_offered_exactly_to_one_node_subprocess_tools():
    for name, spec in registry().items():
        props = input_schema(spec).get("properties", {})
        assert ("node" in props) == takes_node(spec), name
    assert takes_node(registry()["gpu_health"]) and not takes_node(registry()["collective_bench"])
    assert not takes_node(registry()["memory_estimate"])   # in-process: runs in the server


def test_with_no_slurm_configuration_the_answer_says_so_and_what_to_do(tmp_path, monkeypatch):
    """srun installed but no slurm.conf and no configless server (a laptop, a login node of another cluster): the
    real model got srun's DNS SRV lines; the answer says what is missing and the three ways on."""
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("srun", "scontrol", "sinfo", "squeue"):
        (fake / name).write_text("#!/bin/sh\necho 'srun: error: fetch_config: DNS SRV lookup failed' >&2\n"
                                 "echo 'srun: fatal: Could not establish a configuration source' >&2\nexit 1\n")
        (fake / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    for var in ("SLURM_JOB_ID", "SLURM_NODELIST", "SLURM_JOB_NODELIST", "MLENG_TRANSPORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ToolFailure) as caught:
        _run("gpu-node05", timeout_s=60)
    said = str(caught.value)
    assert "there is no SLURM configuration on this machine" in said and "MLENG_TRANSPORT=ssh" in said
    assert "SLURM_CONF" in said and "DNS SRV" not in said


def test_a_name_that_is_not_a_node_never_reaches_argv():
    for bad in ("-w", "a b", "x;rm -rf /", "", "n" * 300):
        with pytest.raises(NodeUnavailable, match="not a node name"):
            node_command(bad, ["true"], 60, "mleng-x", env={"PATH": "/usr/bin:/bin"})


@pytest.mark.slow
def test_outside_an_allocation_a_job_of_its_own_limited_to_the_timeout(monkeypatch):
    import tools.engine.on_node as on_node

    monkeypatch.setattr(on_node, "_node_in_slurm", lambda node, env: ("gpu", "idle"))
    monkeypatch.setattr(on_node.shutil, "which", lambda name: "/usr/bin/" + name)
    argv, env = node_command("gpu-017", ["python", "-m", "x"], 150, "mleng-gpu_health",
                             env={"PATH": "/bin", "SLURM_CONF": "/etc/slurm.conf", "SLURM_JOB_ID": "7",
                                  "SLURM_JOB_NODELIST": "other-[1-2]"})
    assert argv[:6] == ["srun", "--nodes=1", "--ntasks=1", "--nodelist=gpu-017", "--kill-on-bad-exit=1", "--quiet"]
    assert "--time=4" in argv and "--partition=gpu" in argv and "--overlap" not in argv
    assert argv[-3:] == ["python", "-m", "x"]
    assert "SLURM_JOB_ID" not in env and env["SLURM_CONF"] == "/etc/slurm.conf" and env[NODE_ENV] == "gpu-017"


@pytest.mark.anyio
async def test_a_tool_that_spans_nodes_refuses_the_option_by_name():
    async with Client(build_server()) as c:
        r = await c.call_tool("dist_smoke_test", {"node": "mln2"})
        inproc = await c.call_tool("accelerator_specs", {"node": "mln2"})
    assert r.is_error and "unknown argument" in r.content[0].text and "node" in r.content[0].text
    assert inproc.is_error and "node" in inproc.content[0].text


@pytest.fixture
def anyio_backend():
    return "asyncio"


# ---- on the namespace cluster --------------------------------------------------------------------

@pytest.mark.slurm
def test_each_named_node_answers_for_itself_in_a_job_of_its_own(multinode_cluster, mleng_home):  # noqa: F811
    before = set(_jobs_named(multinode_cluster, "mleng-env_report"))
    for node in ("mln3", "mln2", "mln3"):   # repeated, and two nodes: no answer from the wrong node
        result = _run(node)
        assert result.verdict in ("ok", "warn", "info"), result.findings
        assert f"Ran on node {node} (host {node}) through srun." in result.findings
        row = store.query(tool="env_report", limit=1)[0]
        assert row["host"] == node, row["host"]     # stored under the node's host, not this machine's
    assert len(set(_jobs_named(multinode_cluster, "mleng-env_report")) - before) == 3


@pytest.mark.slurm
def test_inside_an_allocation_the_step_joins_it(multinode_cluster, monkeypatch, mleng_home):  # noqa: F811
    # --exclusive: no job of our own could start on mln4 while this one holds it, so an answer from mln4
    # within the timeout can only have come from a step inside this allocation
    job = multinode_cluster.cmd("sbatch", "--parsable", "-N1", "--exclusive", "-w", "mln4", "-J", "mln-holder",
                                "--wrap", "sleep 120").stdout.strip()
    try:
        deadline = time.monotonic() + 60
        while "RUNNING" not in multinode_cluster.cmd("squeue", "-h", "-j", job, "-o", "%T").stdout:
            assert time.monotonic() < deadline, "the holder job did not start"
            time.sleep(0.5)
        monkeypatch.setenv("SLURM_JOB_ID", job)
        monkeypatch.setenv("SLURM_JOB_NODELIST", "mln4")
        before = set(_jobs_named(multinode_cluster, "mleng-env_report"))
        result = _run("mln4", timeout_s=60)
        assert "Ran on node mln4 (host mln4) through srun." in result.findings
        assert set(_jobs_named(multinode_cluster, "mleng-env_report")) == before   # no job of its own
    finally:
        multinode_cluster.cmd("scancel", job, check=False)


@pytest.mark.slurm
def test_an_unknown_node_is_a_clear_failure_and_nothing_is_left(multinode_cluster):  # noqa: F811
    started = time.monotonic()
    with pytest.raises(ToolFailure, match="on node mln9 did not answer"):
        _run("mln9", timeout_s=60)
    assert time.monotonic() - started < 45
    assert _jobs_named(multinode_cluster, "mleng-env_report") == [] or all(
        s.strip() != "RUNNING" for s in multinode_cluster.cmd("squeue", "-h", "-n", "mleng-env_report", "-o", "%T").stdout.splitlines())


def test_one_placement_choice_for_every_srun_caller():
    # The allocation-or-own-job choice made once (engine/placement.py) for node=, fleet_sweep and collective_bench.
    from tools.engine.placement import inside_allocation, inside_job, own_job
    from tools.shared.allocation import gpu_count

    assert inside_allocation().srun_args == ("--overlap",) and inside_job("42").srun_args == ("--jobid=42", "--overlap")
    mine = own_job("gpu", 130, "mleng-x")
    assert mine.srun_args == ("--partition=gpu", "--job-name=mleng-x", "--time=4")   # 130 s -> 3 min + 1
    env = {"SLURM_JOB_ID": "7", "SLURM_CONF": "/etc/slurm.conf", "PATH": "/bin"}
    assert mine.env(env) == {"SLURM_CONF": "/etc/slurm.conf", "PATH": "/bin"} and inside_job("7").env(env) == env
    assert [gpu_count(g) for g in ("gpu:8", "gpu:h100:8(S:0-1)", "cpu=64,gres/gpu=16", "(null)")] == [8, 8, 16, 0]


def test_a_node_slurm_starts_no_task_on_is_refused_at_once_naming_its_state(monkeypatch):
    """Model round 8 (cl-link-down): nic_health node=mln6 waited its whole 90 s timeout for a node SLURM had as
    idle* (not responding) and said only that it did not finish. The state is said at once; srun never runs."""
    import tools.engine.on_node as on_node

    monkeypatch.setattr(on_node.shutil, "which", lambda name: "/usr/bin/" + name)
    for state, said in (("idle*", "SLURM reports the node idle* (not responding to slurmctld)"),
                        ("down*", "SLURM reports the node down* (not responding to slurmctld)"), ("drained", "SLURM reports the node drained")):
        monkeypatch.setattr(on_node, "_node_in_slurm", lambda node, env, state=state: ("debug", state))
        with pytest.raises(NodeUnavailable) as caught:
            node_command("mln6", ["true"], 90, "mleng-nic_health", env={"PATH": "/bin"})
        assert str(caught.value).startswith(f"node: {said}; srun cannot start a task there"), caught.value
        assert ("slurm_status dials its slurmd" in str(caught.value)) == ("*" in state), caught.value
