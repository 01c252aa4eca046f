"""dist_smoke_test: culprit naming (pure) and real gloo runs with injected faults (2 and 4 ranks)."""

import os
import time
from unittest import mock

import psutil
import pytest

from tools.shared.culprits import diagnose
from tools import dist_smoke_test
from tools.shared.launch import LaunchOutcome, RankState, launch_ranks, rank_reader, torchrun_exitcodes
from tools.dist_smoke_test import SPEC, DistSmokeTestParams, version_mismatches


def _outcome(*states, data=(), stalled=False):
    return LaunchOutcome(command=["x"], world_size=len(states), ranks={s.rank: s for s in states},
                         data=list(data), returncode=1, stalled=stalled, overran=False, elapsed_s=1.0,
                         stderr_tail="", output_tail="")


def test_crashed_rank_is_named_not_the_ranks_torchrun_killed_afterwards():
    crashed = RankState(0 + 1, host="n2", pid=11, status="vanished", stage="init", stages_seen=2,
                        stage_entered_t=100.0, end_t=100.1, exitcode=3)
    killed = RankState(0, host="n1", pid=10, status="terminated", stage="init", stages_seen=2,
                       stage_entered_t=100.0, end_t=100.3)
    culprits, findings = diagnose(_outcome(killed, crashed), timeout_s=10)
    assert culprits == [1]
    assert "rank 1 (n2" in findings[0] and "exit code 3" in findings[0] and "init" in findings[0]
    assert "not the cause: rank 0" in findings[-1]


def test_rank_behind_a_timed_out_peer_is_the_culprit():
    waiter = RankState(0, host="a", status="error", stage="all_reduce", stages_seen=5, stage_entered_t=10.0,
                       end_t=20.0, error="Timed out waiting 10000ms for recv operation to complete")
    slow = RankState(1, host="b", status="terminated", stage="shape_check", stages_seen=4,
                     stage_entered_t=9.9, end_t=20.1)
    culprits, findings = diagnose(_outcome(waiter, slow), timeout_s=10)
    assert culprits == [1]
    assert "stopped at stage shape_check and never reached all_reduce" in findings[0]


def test_a_rank_that_never_reported_is_named_when_the_run_stalls():
    waiting = RankState(0, host="a", status="stuck", stage="init", stages_seen=2, stage_entered_t=0, end_t=30)
    silent = RankState(1)
    culprits, findings = diagnose(_outcome(waiting, silent, stalled=True), timeout_s=10)
    assert culprits == [1] and "never reported anything" in findings[0]


def test_all_ranks_stuck_in_one_stage_blames_the_path_not_a_rank():
    a = RankState(0, status="stuck", stage="all_reduce", stages_seen=5, stage_entered_t=0, end_t=30)
    b = RankState(1, status="stuck", stage="all_reduce", stages_seen=5, stage_entered_t=0, end_t=30)
    culprits, findings = diagnose(_outcome(a, b, stalled=True), timeout_s=10)
    assert culprits == [] and "same stage (all_reduce)" in findings[0]


def test_version_mismatch_names_the_odd_host():
    versions = {0: {"torch": "2.4.0", "nccl": "2.21.5"}, 1: {"torch": "2.4.0", "nccl": "2.21.5"},
                2: {"torch": "2.3.1", "nccl": "2.21.5"}}
    found = version_mismatches(versions, {0: "a", 1: "a", 2: "b"})
    assert found == ["torch differs across ranks: 2.4.0 on 2 ranks (0, 1) on a; 2.3.1 on rank 2 on b."]


def test_event_and_torchrun_summary_parsing():
    parse_event = rank_reader()
    assert parse_event('3: @@mleng {"ev": "stage", "rank": 3, "stage": "init"}')["rank"] == 3
    assert parse_event("plain output") is None
    assert parse_event('@@mleng {"ev": "stage", "rank": -1}') is None
    summary = ("  rank      : 1 (local_rank: 1)\n  exitcode  : 3 (pid: 9687)\n"
               "  rank      : 0 (local_rank: 0)\n  exitcode  : -15 (pid: 9686)  (SIGTERM)\n")
    assert torchrun_exitcodes(summary) == {1: 3, 0: -15}


# ------------------------------------------------------------------ real runs (gloo, torchrun)

@pytest.fixture(autouse=True)
def run_tag(monkeypatch):
    """A tag every process of this test inherits, so the leftover check sees only our processes (other
    test runs may be starting ranks on this machine at the same time)."""
    tag = f"{os.getpid()}-{time.monotonic_ns()}"
    monkeypatch.setenv("MLENG_TEST_TAG", tag)
    return tag


def _no_rank_processes_left():
    time.sleep(0.3)
    tag, left = os.environ["MLENG_TEST_TAG"], []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if ".rank " not in cmd and "torch.distributed.run" not in cmd:
            continue
        try:
            if p.environ().get("MLENG_TEST_TAG") == tag:
                left.append((p.pid, cmd[:120]))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return left


def _run(**kw):
    """(result, seconds from the last stage any rank entered to the end of the run).

    The tool promises that a hang is named within the process-group timeout plus a few seconds of the
    ranks starting to wait: by the ranks' own timeout, not by the launcher's stall detector (timeout + 10 s
    without a report) or its deadline. Starting torchrun and importing torch in every rank come before
    that and take whatever the machine's load makes them, so the clock starts at the last stage report the
    launcher received (the events it hands the tool as they arrive), not at the call.
    """
    stage_seen = [time.monotonic()]

    def launch_and_watch(*args, on_event=None, **kwargs):
        def watch(event):
            if event["ev"] == "stage":
                stage_seen.append(time.monotonic())
            if on_event:
                on_event(event)
        return launch_ranks(*args, on_event=watch, **kwargs)

    with mock.patch.object(dist_smoke_test, "launch_ranks", launch_and_watch):
        result = SPEC.run(DistSmokeTestParams(backend="gloo", **kw), lambda f, m: None)
    return result, time.monotonic() - stage_seen[-1]


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [2, 4])
def test_all_ranks_ok(nproc):
    result, _ = _run(nproc_per_node=nproc, numel=4096, alloc_mib=1)
    assert result.verdict == "ok", result.findings
    assert result.ranks_ok == result.world_size == nproc
    assert [r.status for r in result.ranks] == ["done"] * nproc
    assert all("all_reduce" in r.seconds for r in result.ranks)
    assert result.nccl_env == {} and not any("NCCL settings" in f for f in result.findings)  # none were set
    assert not _no_rank_processes_left()


@pytest.mark.parametrize("fault, stage", [("exit_in_init", "init"),
                                          ("sleep_before_all_reduce", "shape_check"),
                                          ("wrong_size", "shape_check")])
@pytest.mark.slow
def test_injected_fault_is_named_with_rank_and_stage(fault, stage):
    timeout = 5
    result, waited = _run(nproc_per_node=2, pg_timeout_s=timeout, numel=4096, alloc_mib=1,
                          inject_fault=fault, fault_rank=1)
    assert result.verdict == "fail"
    assert result.culprit_ranks == [1], result.findings
    culprit_line = next(f for f in result.findings if f.startswith("rank 1 "))
    assert stage in culprit_line
    assert not any("No rank reported progress" in f for f in result.findings), result.findings  # not the stall path
    assert waited < timeout + 5, f"named {waited:.1f} s after the last stage began; {result.findings}"
    assert not _no_rank_processes_left()


@pytest.mark.slow
def test_four_ranks_one_hangs_the_others_wait_and_only_it_is_named():
    result, waited = _run(nproc_per_node=4, pg_timeout_s=5, numel=4096, alloc_mib=1,
                          inject_fault="sleep_before_all_reduce", fault_rank=2)
    assert result.culprit_ranks == [2], result.findings
    assert not any("No rank reported progress" in f for f in result.findings), result.findings  # not the stall path
    assert waited < 5 + 5, f"named {waited:.1f} s after the last stage began; {result.findings}"
    assert not _no_rank_processes_left()


def test_many_nodes_outside_slurm_prints_the_per_node_command(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    result = SPEC.run(DistSmokeTestParams(nnodes=2, nproc_per_node=8), lambda f, m: None)
    assert result.verdict == "info"
    assert len(result.per_node_commands) == 2
    assert "--nnodes 2 --nproc-per-node 8 --rdzv-endpoint" in result.per_node_commands[0]


@pytest.mark.slow
def test_two_nodes_started_by_hand_each_report_their_own_ranks():
    import json
    import socket
    import subprocess
    import sys

    from tools.engine.data import IMPORT_ROOT as REPO_ROOT

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "tools.dist_smoke_test", "--json", "--nnodes", "2", "--nproc-per-node", "1",
           "--backend", "gloo", "--rdzv-endpoint", f"127.0.0.1:{port}", "--pg-timeout-s", "20", "--alloc-mib", "1"]
    nodes = [subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    results = [json.loads(p.communicate(timeout=90)[0]) for p in nodes]
    assert sorted(r["ranks"][0]["rank"] for r in results) == [0, 1]
    assert all(r["verdict"] == "ok" and r["world_size"] == 2 and len(r["ranks"]) == 1 for r in results)
    assert all(any("of 2; the other nodes report on their own" in f for f in r["findings"]) for r in results)


def test_rank_count_follows_cuda_visible_devices(monkeypatch):
    from tools.shared.launch import layout, visible_gpus

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,5")
    assert visible_gpus() == 3 and layout(None, 1) == (3, 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert visible_gpus() == 0 and layout(None, 1) == (2, 1)  # no GPUs: 2 gloo ranks
    assert layout(4, 3) == (4, 3)


def test_launcher_stops_a_silent_run_and_names_the_rank_that_stalled(tmp_path):
    import sys

    from tools.shared.launch import launch_ranks

    # Two fake "ranks" in one process tree: rank 0 reaches stage 2 and waits, rank 1 stops at stage 1.
    script = tmp_path / "ranks.py"
    script.write_text(
        "import json, os, subprocess, sys, time\n"
        "def emit(rank, ev, stage):\n"
        "    line = '@@mleng ' + json.dumps({'ev': ev, 'rank': rank, 'world_size': 2, 'host': 'h',\n"
        "        'pid': os.getpid(), 'stage': stage, 't': time.time()}) + '\\n'\n"
        "    os.write(1, line.encode())\n"
        "if len(sys.argv) == 1:\n"
        "    child = subprocess.Popen([sys.executable, __file__, 'child'], start_new_session=True)\n"
        "    emit(0, 'start', 'start'); emit(0, 'stage', 'init'); emit(0, 'stage', 'all_reduce')\n"
        "    time.sleep(600)\n"
        "else:\n"
        "    emit(1, 'start', 'start'); emit(1, 'stage', 'init')\n"
        "    time.sleep(600)\n")
    t0 = time.monotonic()
    outcome = launch_ranks([sys.executable, str(script)], 2, timeout_s=1, stall_s=2, deadline_s=60)
    assert outcome.stalled and time.monotonic() - t0 < 10
    culprits, findings = diagnose(outcome, timeout_s=1)
    assert culprits == [1] and "stopped at stage init and never reached all_reduce" in findings[0]
    assert not _no_rank_processes_left() and not [
        p for p in psutil.process_iter(["cmdline"]) if str(script) in " ".join(p.info["cmdline"] or [])]


def test_a_launcher_that_fails_before_any_rank_is_reported_with_its_own_words():
    import sys

    from tools.shared.launch import launch_ranks

    outcome = launch_ranks([sys.executable, "-c", "import sys; sys.exit('torchrun: error: bad --rdzv-endpoint')"],
                           2, timeout_s=5, stall_s=10, deadline_s=20)
    culprits, findings = diagnose(outcome, timeout_s=5)
    assert culprits == [] and "failed before any rank ran" in findings[0]
    assert "bad --rdzv-endpoint" in findings[0]


def test_inside_slurm_ranks_per_node_follow_the_allocation_not_the_login_node(monkeypatch):
    from tools.shared.launch import layout, slurm_gpus_per_node

    assert slurm_gpus_per_node({"SLURM_GPUS_PER_NODE": "h100:8"}) == 8
    assert slurm_gpus_per_node({"SLURM_GPUS_ON_NODE": "4"}) == 4
    assert slurm_gpus_per_node({"SLURM_JOB_GPUS": "0,1"}) == 2 and slurm_gpus_per_node({}) == 0
    for key in ("SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu-[01-04]")
    monkeypatch.setenv("SLURM_GPUS_PER_NODE", "8")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert layout(None, None) == (8, 4)
