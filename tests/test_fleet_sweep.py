"""fleet_sweep on the multi-node namespace cluster (scripts/cluster-local.sh, 4 nodes), faults injected
from outside: a killed slurmd, a CPU limit, a node too slow to answer by the deadline; a running job's
nodes get only the checks that do not disturb it; bad input.

CPU-only checks here (this machine has no GPU): env_report, gpu_health (answers "no GPU"), cpu_probe.
"""

from __future__ import annotations

import os
import re
import time

import pytest

from tests.multinode_cluster import multinode_cluster  # noqa: F401  (fixture)
from tools import fleet_sweep as fs
from tools.engine.spec import ToolFailure
from tools.engine.store import query

pytestmark = pytest.mark.slurm

CPU_CHECKS = ["env_report", "gpu_health", "cpu_probe"]


def sweep(progress=None, **params) -> fs.result.FleetSweepResult:
    return fs.SPEC.run(fs.SPEC.Params(**params), progress or (lambda f, m: None))


def leftovers(cluster) -> list[str]:
    """Anything of a sweep still running: node processes other than slurmd or sshd (an SSH step's session
    and remote_step too), steps SLURM still holds."""
    left = []
    for node in cluster.nodes:
        for pid in cluster.node_pids(node):
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if any(mark in cmd for mark in ("fleet_sweep", "slurmstepd", "remote_step", "@notty")):
                left.append(f"{node}: {cmd[:80]}")
    steps = cluster.cmd("squeue", "-h", "-s", "-o", "%i %j").stdout.split("\n")
    return left + [s for s in steps if "mleng-fleet-sweep" in s]


def wait_clean(cluster, timeout_s: float = 30) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while (left := leftovers(cluster)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def test_four_nodes_answer_every_check_rows_stream_and_are_stored(multinode_cluster):  # noqa: F811
    messages = []
    result = sweep(lambda f, m: messages.append((time.monotonic(), m)), partition="debug", nodes=4,
                   checks=CPU_CHECKS, deadline_s=240)
    assert result.nodes_total == 4 and result.nodes_complete == 4, result.findings
    assert sorted({r.node for r in result.rows}) == multinode_cluster.nodes and len(result.rows) == 12
    assert {m.figure for m in result.medians} == {"cpu_probe.matmul_gflops", "cpu_probe.copy_gbps"}
    row_messages = [m for _, m in messages if re.match(r"mln\d: \w+ ", m)]
    assert len(row_messages) == 12  # one progress line per node and check, as each arrived
    stored = query(tool="env_report")
    assert sorted(r["host"] for r in stored) == multinode_cluster.nodes  # each node's own hostname
    assert all(r.result_id for r in result.rows)
    assert {d.field for d in result.drift} <= {"python"} or not result.drift  # one venv: no drift
    assert result.plot_png and os.path.getsize(result.plot_png) > 10_000, result.findings  # "No plot: ..." says why
    assert wait_clean(multinode_cluster) == []


def test_a_killed_slurmd_is_named_and_the_other_rows_are_complete(multinode_cluster):  # noqa: F811
    multinode_cluster.kill_slurmd("mln2")
    try:
        result = sweep(partition="debug", nodes=4, checks=["gpu_health", "env_report"], deadline_s=180)
    finally:
        multinode_cluster.heal("mln2")
    missing = {m.node: m.reason for m in result.not_answering}
    assert list(missing) == ["mln2"], result.findings
    assert "could not start" in missing["mln2"] or "deadline" in missing["mln2"] or "SLURM reports" in missing["mln2"]
    assert sorted({r.node for r in result.rows}) == ["mln1", "mln3", "mln4"]
    assert len([r for r in result.rows if r.node != "mln2"]) == 6
    assert result.verdict == "fail" and [d.node for d in result.drain] == ["mln2"], result.findings
    assert result.drain[0].command.startswith("scontrol update nodename=mln2 state=drain reason=")
    assert wait_clean(multinode_cluster) == []


def test_a_cpu_limited_node_is_the_outlier(multinode_cluster):  # noqa: F811
    # Four nodes share this machine's 2 cores (and other users' work), so healthy nodes' probes vary by
    # tens of percent here (29% seen: "inconclusive" for the median); the 20% quota caps mln3 at a fifth of
    # a core, and the kernel's counters of mln3's cgroup say the quota bound: that names mln3 whatever the
    # spread. Under heavy load every process gets less than a fifth of a core and the quota never binds
    # (then mln3 is busy like its peers): up to three sweeps, and a skip that gives the counts.
    multinode_cluster.cpu_limit("mln3", 20)
    seen = []
    try:
        for _ in range(3):
            periods0, throttled0 = multinode_cluster.cpu_throttled("mln3")
            result = sweep(partition="debug", nodes=4, checks=["cpu_probe"], deadline_s=240, margin_pct=35)
            periods, throttled = multinode_cluster.cpu_throttled("mln3")
            gflops = {r.node: r.figures["matmul_gflops"] for r in result.rows}
            bound = (throttled - throttled0) / max(1, periods - periods0)
            busy_nodes = [b.node for b in result.busy]
            seen.append((gflops, f"limit bound in {bound:.0%} of periods", f"busy {busy_nodes}"))
            assert result.nodes_complete == 4, result.findings
            # The quota is said whether or not it bound (round 9: under a hog it never did, and went unseen).
            quota = [d for d in result.inventory_drift if d.field == "cpu_quota"]
            assert quota and quota[0].odd_nodes == ["mln3"] and "0.2 CPU" in quota[0].values, result.findings
            # and where it is set, and when (model round 11: "no tool row shows its source")
            assert any(f"Set at: mln3: /{multinode_cluster.cgroups.name}/mln3: cpu.cfs_quota_us 20000 / "
                       "cpu.cfs_period_us 100000, written " in f for f in result.findings), result.findings
            if bound >= 0.5:
                break
    finally:
        multinode_cluster.heal("mln3")
    if bound < 0.5:
        pytest.skip(f"the 20% CPU limit hardly bound: the host was busier than the cap (load "
                    f"{os.getloadavg()[0]:.1f} on 2 cores): {seen}")
    assert {d.node for d in result.drain} == {"mln3"}, (seen, result.findings)
    reasons = " ".join(result.drain[0].reasons)
    assert "own CPU limit (cgroup quota) bound in" in reasons, (seen, result.findings)
    # where the quota is set and what it allows: what an admin undoes
    assert (f"0.2 CPU allowed by cgroup /{multinode_cluster.cgroups.name}/mln3: cpu.cfs_quota_us 20000 / "
            "cpu.cfs_period_us 100000, written ") in reasons, reasons
    assert "mln3" not in busy_nodes, (seen, result.findings)
    assert min(gflops, key=gflops.get) == "mln3"


def test_healthy_nodes_with_a_cpu_hog_outside_them_are_never_drained(multinode_cluster):  # noqa: F811
    # One busy-looping process in the head namespace (outside every node) for two sweeps: figures on a
    # loaded host spread or come back busy; the answer may be inconclusive, never a culprit.
    import subprocess
    import sys

    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        results = [sweep(partition="debug", nodes=4, checks=["cpu_probe"], deadline_s=240) for _ in range(2)]
    finally:
        hog.kill()
        hog.wait()
    for result in results:
        assert result.nodes_complete == 4, result.findings
        assert result.drain == [] and result.verdict != "fail", result.findings
        assert not [o for o in result.outliers if o.status == "confirmed"], result.findings
        assert not [d for d in result.inventory_drift if d.field == "cpu_quota"], result.findings


def test_a_node_too_slow_to_answer_is_cut_at_the_deadline_and_nothing_is_left(multinode_cluster):  # noqa: F811
    # 1% of a CPU: importing torch for cpu_probe (~3 CPU-seconds) would take minutes there.
    multinode_cluster.cpu_limit("mln4", 1)
    try:
        t0 = time.monotonic()
        result = sweep(partition="debug", nodes=4, checks=["gpu_health", "cpu_probe"], deadline_s=45)
        wall = time.monotonic() - t0
        left = wait_clean(multinode_cluster, timeout_s=60)
    finally:
        multinode_cluster.heal("mln4")
    assert [m.node for m in result.not_answering] == ["mln4"], result.findings
    assert "deadline" in result.not_answering[0].reason
    assert sorted(r.node for r in result.rows if r.node != "mln4") == ["mln1", "mln1", "mln2", "mln2", "mln3", "mln3"]
    assert "mln4" in [d.node for d in result.drain]
    assert wall < 45 + 25  # the deadline, plus srun's own teardown (KillWait 5 s) and margin
    assert left == []


def test_a_running_job_and_the_allocation_are_targets(multinode_cluster, tmp_path, monkeypatch):  # noqa: F811
    job = multinode_cluster.cmd("sbatch", "--parsable", "-N2", f"--chdir={tmp_path}", "--wrap", "sleep 300").stdout.strip()
    try:
        for _ in range(60):
            if "RUNNING" in multinode_cluster.cmd("scontrol", "show", "job", "-o", job).stdout:
                break
            time.sleep(0.5)
        by_job = sweep(job_id=job, deadline_s=120)
        nodes = sorted({r.node for r in by_job.rows})
        assert by_job.target == "job (2 nodes)" and len(nodes) == 2 and by_job.nodes_complete == 2
        from tools.fleet_sweep.checks import NON_INVASIVE

        assert {r.check for r in by_job.rows} == set(NON_INVASIVE)   # no benchmark beside the job
        assert not set(NON_INVASIVE) & {"cpu_probe", "matmul_bench", "memory_bandwidth_bench", "p2p_bandwidth"}
        assert by_job.findings[0].startswith(f"Beside running job {job}: only {', '.join(NON_INVASIVE)}")
        with pytest.raises(ToolFailure, match=r"^checks: cpu_probe would measure the resources job"):
            sweep(job_id=job, checks=["cpu_probe"])
        monkeypatch.setenv("SLURM_JOB_ID", job)
        monkeypatch.setenv("SLURM_JOB_NODELIST", ",".join(nodes))
        inside = sweep(checks=["gpu_health"], deadline_s=120)
        beside = sweep(job_id=job, checks=["cpu_probe"], benchmarks_beside_job=True, deadline_s=120)
        assert sorted(r.node for r in beside.rows) == nodes and not beside.findings[0].startswith("Beside")
        assert inside.target == "allocation (2 nodes)" and sorted({r.node for r in inside.rows}) == nodes
    finally:
        multinode_cluster.cmd("scancel", job, check=False)


def test_a_host_list_of_slurm_nodes_is_swept_in_a_job_of_its_own(multinode_cluster):  # noqa: F811
    result = sweep(hosts=["mln[1-2]", "mln4"], checks=["gpu_health"], deadline_s=120)
    assert result.target == "hosts (3 nodes)" and sorted(r.node for r in result.rows) == ["mln1", "mln2", "mln4"]
    assert wait_clean(multinode_cluster) == []


@pytest.mark.parametrize("params,field", [
    ({"hosts": ["mln1", "nosuchnode"]}, "hosts: unknown node(s) nosuchnode"),
    ({"hosts": []}, "hosts: the host list is empty"),
    ({"job_id": "999999"}, "job_id:"),
    ({"partition": "nosuch"}, "partition: unknown or empty partition 'nosuch'"),
    ({"partition": "debug", "nodes": 9}, "nodes: partition 'debug' has 4 reachable node(s)"),
])
def test_bad_input_names_the_field(multinode_cluster, params, field):  # noqa: F811
    with pytest.raises(ToolFailure) as err:
        sweep(checks=["gpu_health"], **params)
    assert field in str(err.value)


def test_a_finished_job_is_refused_naming_job_id(multinode_cluster, tmp_path):  # noqa: F811
    job = multinode_cluster.cmd("sbatch", "--parsable", f"--chdir={tmp_path}", "--wrap", "true").stdout.strip()
    for _ in range(60):
        if "COMPLETED" in multinode_cluster.cmd("scontrol", "show", "job", "-o", job).stdout:
            break
        time.sleep(0.5)
    with pytest.raises(ToolFailure, match=r"job_id: job \d+ is COMPLETED, not RUNNING"):
        sweep(job_id=job, checks=["gpu_health"])
