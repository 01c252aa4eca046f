"""shared/allocation.py without a cluster: what a failed salloc says (SLURM's client commands stood in for)."""

import subprocess

import pytest

from tools.engine.spec import ToolFailure
from tools.shared import allocation, slurm

SINFO = "mln1 idle\nmln2 idle\nmln3 idle\nmln4 idle\nmln5 idle\nmln6 down*\nmln7 idle\nmln8 drained\n"


def _sinfo(argv, timeout_s=30, check=True):
    if argv[0] == "sinfo" and "%N %T" in argv:
        return SINFO
    if argv[0] == "sinfo":
        return "(null)\n"          # %G: no GPUs
    return ""


def test_a_failed_salloc_names_the_partitions_nodes_out_of_service(monkeypatch):
    """Model round 6 (cl-link-down): an 8-node bisect answered only "salloc said 'Connection timed out'"; the
    partition's DOWN node, the whole answer, was left for the agent to find with slurm_status."""
    monkeypatch.setattr(slurm, "run_cmd", _sinfo)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(
        a[0], 1, "", "salloc: error: Job submit/allocate failed: Connection timed out\n"))
    with pytest.raises(ToolFailure) as failed:
        allocation.request("debug", 6, None, 600)
    said = str(failed.value)
    assert "salloc said 'salloc: error: Job submit/allocate failed: Connection timed out'" in said
    assert "out of service in SLURM: mln6 (down*); mln8 (drained)" in said, said


def test_no_node_out_of_service_adds_nothing(monkeypatch):
    monkeypatch.setattr(slurm, "run_cmd", lambda argv, timeout_s=30, check=True: "mln1 idle\nmln2 mixed\n")
    assert allocation.out_of_service("debug") == ""

    def broken(argv, timeout_s=30, check=True):
        raise slurm.SlurmError("`sinfo` gave no answer in 30 s")

    monkeypatch.setattr(slurm, "run_cmd", broken)
    assert allocation.out_of_service("debug") == ""     # the salloc failure is still said, without this part


def test_more_nodes_than_slurm_can_start_tasks_on_is_refused_before_salloc(monkeypatch):
    """Model round 8 (cl-link-down): an 8-node bisect waited salloc's 120 s for a partition with one node not
    responding, then failed. Asking for more nodes than SLURM can start tasks on, or for such a node by name, is
    refused at once, naming them; salloc is never run."""
    monkeypatch.setattr(slurm, "run_cmd", _sinfo)
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: ran.append(a) or subprocess.CompletedProcess(a[0], 1, "", ""))
    with pytest.raises(ToolFailure) as failed:
        allocation.request("debug", 8, None, 600)
    said = str(failed.value)
    assert said.startswith("nnodes: 8 node(s) of 'debug' cannot be had now: SLURM can start tasks on 6 of its 8")
    assert "out of service in SLURM: mln6 (down*); mln8 (drained)" in said and "nnodes=6" in said, said
    with pytest.raises(ToolFailure, match=r"^nodes: SLURM will start no task on mln6 now"):
        allocation.request("debug", None, ["mln5", "mln6"], 600)
    assert not ran
