"""fleet_sweep on this machine alone (hosts=["localhost"]): no SLURM needed, the node process runs
here. The path the GPU box takes (tests/gpu/test_fleet_sweep_gpu.py); and bad host input."""

from __future__ import annotations

import socket

import pytest

from tools import fleet_sweep as fs
from tools.engine.spec import ToolFailure
from tools.engine.store import query


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


def test_other_hosts_outside_slurm_are_refused_naming_hosts(monkeypatch):
    monkeypatch.setenv("SLURM_CONF", "/nonexistent/slurm.conf")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(ToolFailure, match=r'^hosts: outside SLURM only this machine can be swept'):
        fs.SPEC.run(fs.SPEC.Params(hosts=["gpu-01", "gpu-02"], checks=["gpu_health"]), lambda f, m: None)
