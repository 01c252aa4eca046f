"""fleet_sweep on this machine alone (hosts=["localhost"]): no SLURM needed, the node process runs
here. The path the GPU box takes (tests/gpu/test_fleet_sweep_gpu.py); and bad host input."""

from __future__ import annotations

import os
import socket

import pytest

from tools import fleet_sweep as fs
from tools.engine.spec import ToolFailure
from tools.engine.store import query


@pytest.mark.slow
def test_this_machine_is_swept_without_slurm(monkeypatch):
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")
    result = fs.SPEC.run(fs.SPEC.Params(hosts=["localhost"], checks=["gpu_health", "cpu_probe"], deadline_s=120),
                         lambda f, m: None)
    assert result.target == "local (1 nodes)" and result.nodes_complete == 1, result.findings
    assert [r.check for r in result.rows] == ["cpu_probe", "gpu_health"]
    probe = next(r for r in result.rows if r.check == "cpu_probe")
    assert probe.figures["matmul_gflops"] > 0.5 and probe.figures["copy_gbps"] > 0.05
    assert not result.outliers and not result.drain  # one node: no median to fall below
    stored = query(tool="gpu_health")
    assert [r["host"] for r in stored] == [socket.gethostname()]


def test_other_hosts_outside_slurm_go_over_ssh_and_bad_names_are_refused(monkeypatch):
    from tools.fleet_sweep.targets import resolve

    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    target = resolve(fs.SPEC.Params(hosts=["gpu-[01-02]"]), dict(os.environ))
    assert (target.kind, target.nodes) == ("ssh", ["gpu-01", "gpu-02"])
    with pytest.raises(ToolFailure, match=r"^hosts: 'root@gpu-01' is not a host name"):
        fs.SPEC.run(fs.SPEC.Params(hosts=["root@gpu-01"], checks=["gpu_health"]), lambda f, m: None)


@pytest.mark.slow
def test_a_suspect_is_re_run_on_its_node_and_only_its_checks(monkeypatch):
    """The confirming step runs for real (hosts=["localhost"]): this machine's cpu_probe figure made far
    lower than three peers' makes it the suspect; the re-run measures it again, alone."""
    import socket as _socket

    from tools.fleet_sweep import confirm_suspects
    from tools.fleet_sweep.sweep import Collected
    from tools.fleet_sweep.targets import Target

    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")
    me = _socket.gethostname()

    def row(node, gflops):
        return {"node": node, "check": "cpu_probe", "verdict": "info", "busy": {"busy": False},
                "figures": [{"name": "matmul_gflops", "value": gflops, "unit": "GFLOP/s", "better": "higher",
                             "gpu": None, "expected": None, "group": "x"}]}

    got = Collected(rows={(n, "cpu_probe"): row(n, v) for n, v in [("p1", 1e6), ("p2", 1e6), ("p3", 1e6), (me, 1.0)]},
                    planned={n: ["cpu_probe"] for n in ("p1", "p2", "p3", me)})
    params = fs.SPEC.Params(hosts=["localhost"], checks=["env_report", "cpu_probe"], deadline_s=120)
    job = {"checks": ["env_report", "cpu_probe"], "storage_path": None, "deadline_s": 120}
    steps = []
    again = confirm_suspects(params, Target("local", [me], [], local=True), got, job, 120, lambda f, m: steps.append(m))
    assert steps == [f"re-running cpu_probe on 1 suspect node(s): {me}"]
    assert list(again.rows) == [(me, "cpu_probe")]            # only the suspect's own check
    assert again.rows[(me, "cpu_probe")]["figures"][0]["value"] > 1.0
    assert confirm_suspects(params, Target("local", [me], [], local=True), got, job, 5, lambda f, m: None) is None
