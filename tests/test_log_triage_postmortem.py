"""log_triage's headline on real post-mortem logs (tests/fixtures/logs/public/SOURCE.md): the first finding names
the culprit by its kind (a GPU by host + bus id + serial, a node, a rank), weighs events by the job's failure
window, tells the victim of an IB error from the host whose port failed, and does not headline an echo."""

from pathlib import Path

import pytest

from tools.shared.triage.core import triage_paths, triage_text

LOGS = Path(__file__).parent / "fixtures" / "logs"
PUBLIC = LOGS / "public"


def test_the_gpu_event_at_the_crash_is_the_headline_not_the_older_application_xids():
    r = triage_paths([str(PUBLIC / "xid_window")])
    assert r.first_failure.signature == "xid" and r.first_failure.details["xid"] == "94"
    assert r.culprit_kind == "gpu"
    assert (r.culprit.node, r.culprit.gpu_bus, r.culprit.gpu_serial) == ("node4", "0000:00:08", "1652923018111")
    head = r.findings[0]
    assert "node4 GPU 0000:00:08 (serial 1652923018111)" in head and "Xid (PCI:0000:00:05)" not in head
    assert "before the job's first death" in r.findings[1]
    # the rank's own "uncorrectable ECC error" is that GPU's: reset it, on the node the action names
    assert r.first_failure.action == "reset_gpu" and "Action: reset_gpu on node4 GPU 0000:00:08 (serial 1652923018111)." in head
    assert r.action == "reset_gpu" and r.action_on == ["node4"]
    # the application Xid 43 two weeks earlier is still reported, with its host, below the headline
    assert any(f.startswith("XID 43 on node4") for f in r.findings[2:])


def test_without_the_job_output_there_is_no_window_and_no_false_gpu_culprit():
    r = triage_paths([str(PUBLIC / "xid_window" / "dmesg-node4.log")])
    assert r.first_failure.details["xid"] == "43" and r.first_failure.action == "none"
    assert r.culprit is None    # an application fault names no GPU to drain


def test_ib_port_error_names_the_host_whose_port_failed_not_the_victim():
    r = triage_paths([str(PUBLIC / "ib_port_error_4nodes.log")])
    # the log prefix elides the host ('...-48'); the victim's completion error spells it in full: name it so
    assert r.culprit_kind == "node" and r.culprit.node == "node48"
    head = r.findings[0]
    assert "Culprit (node): node48." in head and "...-51 printed the completion errors: the victim" in head
    assert "the port failed on node48 (printed as ...-48)" in head and "peer node48" in head
    # its port failed under the job's traffic: out of the scheduler until the link is fixed, not "monitor"
    assert "Action: drain_node on node48." in head
    assert (r.first_failure.action, r.action, r.action_on) == ("drain_node", "drain_node", ["node48"])


def test_a_port_error_that_broke_no_traffic_is_watched_not_drained():
    r = triage_text("node3:4411:4500 [0] transport/net_ib.cc:104 NCCL WARN NET/IB : Got async event : port error\n")
    assert r.action == "monitor" and r.action_on == ["node3"] and "drain" not in " ".join(r.findings)


def test_host_oom_during_checkpoint_save_names_the_node_that_ran_out():
    r = triage_paths([str(PUBLIC / "olmo_ckpt_host_oom.log")])
    assert r.culprit_kind == "node" and r.culprit.node == "nid006190"
    assert "Culprit (node): nid006190" in r.findings[0] and "nid005143" not in r.findings[0]
    meaning = next(h.meaning for h in r.signatures if h.id == "srun_task_oom")
    assert "checkpoint" in meaning and "--mem" in meaning


def test_sigabrt_after_a_watchdog_timeout_is_an_echo_not_the_failure():
    r = triage_paths([str(PUBLIC / "watchdog_terminate_rank3.log")])
    assert r.first_failure.signature == "nccl_watchdog_timeout" and r.first_failure.role == "cascade"
    assert r.culprit is None and "C++ exception" not in r.findings[0]
    hit = next(h for h in r.signatures if h.id == "cpp_terminate")
    assert hit.details["after"].startswith("a watchdog timeout")


def test_healthy_and_noisy_logs_name_no_culprit():
    assert triage_paths([str(LOGS / "clean_training.log")]).culprit is None
    noisy = triage_text("Dec  2 11:38:47 worker4 kernel: NVRM: loading NVIDIA UNIX x86_64 Kernel Module 535\n"
                        "worker4:1:2 [0] NCCL INFO Bootstrap : Using bond0:10.0.0.4<0>\nstep 10 loss 2.1\n")
    assert noisy.culprit is None and noisy.verdict == "ok"


def test_saved_py_spy_dumps_are_sent_to_the_stack_reader_not_called_healthy():
    r = triage_paths([str(Path(__file__).parent / "fixtures" / "pyspy" / "json")])
    assert r.verdict == "info" and r.next == ["hang_stack_dump"] and r.findings[0].startswith("These are saved py-spy")


def test_every_drain_names_the_node():
    r = triage_paths([str(LOGS / "slurm_xid")])
    assert r.action == "drain_node" and r.action_on == ["gpu-node02"]
    assert "Action: drain_node on gpu-node02 GPU 0000:b7:00 (GPU-3c5f1a2e" in r.findings[0]


def _twelve_ranks_one_oom() -> str:
    """3 nodes x 4 ranks in torchrun's line formats (as tests/fixtures/logs/torchrun_oom_rank3.log): rank 11 hits a
    CUDA OOM at 14:20:43, its torchrun SIGTERMs ranks 8-10; ranks 0-7 go on until their watchdog fires 10 min later."""
    lines = [f"[rank{r}]:[I1129 14:20:{40 + s}.000000 {51000 + r} train.py:211] step {40 + s} loss 3.0"
             for s in range(3) for r in range(12)]
    lines += ["[rank11]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total "
              "capacity of 79.19 GiB of which 1.10 GiB is free."]
    lines += [f"[rank{r}]:[I1129 14:{m}:10.000000 {51000 + r} train.py:199] waiting on step 43"
              for m in (22, 25, 28) for r in range(8)]
    lines += [f"[rank{r}]:[E1129 14:30:43.000000 {51000 + r} ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught "
              "collective operation timeout: WorkNCCL(SeqNum=880, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, "
              "Timeout(ms)=600000) ran for 600078 milliseconds before timing out." for r in range(8)]
    lines += ["torch.distributed.elastic.multiprocessing.errors.ChildFailedError:",
              "============================================================", "train.py FAILED",
              "------------------------------------------------------------", "Failures:"] + [f"[{i}]:\n  time      : 2026-11-29_14:20:44\n  host      : node3\n  rank      : {r} "
                              f"(local_rank: {r - 8})\n  exitcode  : -15 (pid: {51000 + r})" for i, r in
                              enumerate(range(8, 11), 1)]
    lines += ["------------------------------------------------------------",
              "Root Cause (first observed failure):", "[0]:", "  time      : 2026-11-29_14:20:43",
              "  host      : node3", "  rank      : 11 (local_rank: 3)", "  exitcode  : 1 (pid: 51011)",
              "============================================================"]
    return "\n".join(lines) + "\n"


def test_ranks_their_torchrun_stopped_after_an_oom_are_not_called_stuck():
    r = triage_text(_twelve_ranks_one_oom())
    assert r.first_failure.signature == "cuda_oom" and r.culprit.rank == 11
    assert not any("stopped writing first" in f or "likely stuck" in f for f in r.findings), r.findings
    assert not set(r.suspect_ranks) & set(range(8, 11))


def test_a_completion_error_names_the_peer_host_through_nccls_own_address_lines():
    """Bootstrap lines as in NVIDIA/nccl-tests#244 (hosts ranokau, lascar); the completion error is composed in
    NCCL's format: ranokau is the victim, the peer address it names is lascar's, and no port error was logged."""
    log = ("ranokau:398189:398189 [0] NCCL INFO Bootstrap : Using enp45s0f0:146.155.155.83<0>\n"
           "lascar:73214:73214 [0] NCCL INFO Bootstrap : Using enp45s0f0:146.155.155.84<0>\n"
           "ranokau:398189:398231 [0] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer "
           "146.155.155.84<49391> with status=12 opcode=0 len=0 vendor err 129 (Recv) localGid ::ffff:146.155.155.83\n")
    r = triage_text(log)
    assert r.culprit_kind == "node" and r.culprit.node == "lascar"
    assert "ranokau printed the completion errors: the victim, waiting on peer lascar" in r.findings[0]


@pytest.mark.parametrize("fixture,rank", [("torchrun_nccl_watchdog_8ranks.log", 7), ("gloo_hang.log", 1)])
def test_when_the_log_holds_only_echoes_the_silent_rank_leads_the_answer(fixture, rank):
    """A real model played these drills (2026-12-02) and found the headline on the waiting rank 0, the culprit three
    findings down: the rank that said nothing is now the first finding and the typed culprit."""
    result = triage_paths([str(Path(__file__).parent.parent / "evals" / "scenarios" / "fixtures" / fixture)])
    assert result.findings[0].startswith(f"Suspect: rank {rank}."), result.findings[:2]
    assert result.findings[1].startswith("First failure (a consequence, on a waiting rank)")
    assert (result.culprit.kind, result.culprit.rank) == ("rank", rank)


def test_a_suspect_rank_is_named_with_the_gpu_it_said_it_drives():
    """The real model opened the logs to find rank 7's GPU (PyTorch's 'using GPU 7 to perform barrier') and rank
    5's device (NCCL's init line 'rank 5 nranks 8 cudaDev 5 nvmlDev 5 busId ab000')."""
    fixtures = Path(__file__).parent.parent / "evals" / "scenarios" / "fixtures"
    r = triage_paths([str(fixtures / "torchrun_nccl_watchdog_8ranks.log")])
    assert r.culprit.rank == 7 and "rank 7 (GPU 7) reports no error of its own" in r.findings[0]
    r = triage_paths([str(fixtures / "init_hang_rank5.log")])
    assert "Culprit (rank): rank 5 on gpu-node05 (GPU 5, bus ab000)." in r.findings[0]


def test_a_subgroups_rank_numbers_are_not_taken_for_global_ranks():
    from tools.shared.log_hosts import rank_devices
    block = ("h1:1:2 [3] NCCL INFO ncclCommInitRank comm 0x1 rank 0 nranks 2 cudaDev 3 nvmlDev 3 busId 5000 - Init\n"
             "h1:1:2 [3] NCCL INFO ncclCommInitRank comm 0x2 rank 3 nranks 8 cudaDev 3 nvmlDev 3 busId 5000 - Init\n"
             "[rank5]:[W1129 09:58:01.1 44 ProcessGroupNCCL.cpp:1] [PG ID 2 PG GUID 3 Rank 0]  using GPU 5 to perform\n")
    assert rank_devices(block) == {3: ("h1", "3", "5000")}
