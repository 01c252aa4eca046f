"""collective_bench over SSH (hosts= without SLURM: shared/launch_ssh.py, node_groups.run_round_ssh).

The plumbing first (no sshd: which hosts, who hosts the store, whose events are believed), then real runs
against one sshd of our own on 127.0.0.1 answering for several names (tests/ssh_helpers.py): gloo ranks
on this machine, one torchrun per name. The namespace-cluster twins (a healthy 4-host pairwise, a slow
link, a dead sshd, the same nodes by srun) are in tests/test_isolation_ssh_cluster.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.ssh_helpers import local_sshd, why_no_sshd
from tools.collective_bench import SPEC
from tools.collective_bench.patterns import pattern_nodes
from tools.engine.spec import ToolFailure
from tools.engine.transport import SSH_CONFIG_ENV, TRANSPORT_ENV, NodeEnd, SshTransport
from tools.shared import sidechannel
from tools.shared.culprits import diagnose
from tools.shared.launch_ssh import _Followed, _outcome, host_command
from tools.shared.torchrun_on_host import with_is_host

SMALL = dict(backend="gloo", nproc_per_node=1, min_bytes="32K", max_bytes="256K", factor=8, iters=3, warmup=1,
             pg_timeout_s=30, plot=False, slow_margin=0.8, slow_latency_factor=12, group_deadline_s=60)
needs_sshd = pytest.mark.skipif(bool(why_no_sshd()), reason=why_no_sshd() or "")


@pytest.fixture
def over_ssh(monkeypatch):
    monkeypatch.setenv(TRANSPORT_ENV, "ssh")
    return lambda config: monkeypatch.setenv(SSH_CONFIG_ENV, str(config))


def event_line(**fields) -> str:
    event = {"ev": "stage", "rank": 0, "local_rank": 0, "world_size": 2, "host": "claimed", "pid": 7,
             "stage": "init", "t": 1.0, **fields}
    return sidechannel.encode(event)[0].decode().rstrip("\n")


# --- the plumbing ----------------------------------------------------------------------------------


def test_hosts_without_node_rank_go_over_ssh_expanded_from_a_node_set(over_ssh):
    params = SPEC.Params(pattern="pairwise", hosts=["gpu-[01-03]", "login1"])
    assert pattern_nodes(params) == (["gpu-01", "gpu-02", "gpu-03", "login1"], "ssh")
    by_hand = SPEC.Params(pattern="pairwise", hosts=["a", "b"], node_rank=0, rdzv_endpoint="a:29400")
    assert pattern_nodes(by_hand)[1] == "agents"   # started by hand on each node: unchanged


@pytest.mark.parametrize("hosts, said", [(["gpu-01"], "need 2 or more hosts"),
                                         (["gpu-[01-01]", "gpu-01"], "need 2 or more hosts"),
                                         (["-oProxyJump", "b"], "is not a plain host name"),
                                         (["n[5-1]"], "runs backwards")])
def test_bad_host_lists_are_refused_naming_the_field(over_ssh, hosts, said):
    with pytest.raises(ToolFailure, match=f"^hosts: .*{said}"):
        pattern_nodes(SPEC.Params(pattern="bisect", hosts=hosts))


def test_with_slurm_here_hosts_go_over_ssh_only_when_asked(monkeypatch, tmp_path):
    conf = tmp_path / "slurm.conf"
    conf.write_text("")
    monkeypatch.delenv(TRANSPORT_ENV, raising=False)
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    (tmp_path / "sinfo").write_text("#!/bin/sh\n")
    (tmp_path / "sinfo").chmod(0o700)
    with pytest.raises(ToolFailure, match="MLENG_TRANSPORT=ssh"):
        pattern_nodes(SPEC.Params(pattern="pairwise", hosts=["n[1-4]"]))
    monkeypatch.setenv(TRANSPORT_ENV, "ssh")
    assert pattern_nodes(SPEC.Params(pattern="pairwise", hosts=["n[1-4]"]))[1] == "ssh"


def test_the_named_rendezvous_host_alone_hosts_the_store():
    argv = host_command("collective_bench.rank", {"ops": ["all_reduce"]}, 1, ["n2", "n1"], "10.0.0.2", 29501, "mleng-x")
    assert argv[argv.index("--") + 1:][:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert argv[argv.index("--") - 1] == "n2" and "--rdzv-endpoint=10.0.0.2:29501" in argv
    torchrun = argv[argv.index("--") + 1:]
    assert "--rdzv-conf=is_host=1" in with_is_host(torchrun, "n2", this_host="n2")
    assert "--rdzv-conf=is_host=0" in with_is_host(torchrun, "n2", this_host="n1")
    assert "--rdzv-conf=is_host=0" in with_is_host(torchrun, "n2", this_host="")   # no MLENG_NODE: never the host


def test_a_host_wrapper_without_torchrun_is_refused():
    proc = subprocess.run([sys.executable, "-m", "tools.shared.torchrun_on_host", "n1", "--", "sh", "-c", "echo hi"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage" in proc.stderr and "hi" not in proc.stdout


def test_events_are_credited_to_the_connection_and_a_rank_cannot_speak_for_two_hosts():
    followed = _Followed(["n1", "n2"], 2, None)
    followed.line("n1", event_line(rank=0, host="n2"))        # says it is n2: filed under n1, its connection
    followed.line("n2", event_line(rank=0))                   # rank 0 again, from another host: refused
    followed.line("n2", event_line(rank=1, ev="data", kind="row", op="all_reduce", bytes=8, busbw_gbps=1.0))
    followed.line("n2", "not an event")
    assert followed.ranks[0].host == "n1" and followed.ranks[1].host == "n2"
    assert followed.home == {0: "n1", 1: "n2"} and len(followed.data) == 1
    outcome = _outcome(followed, {"n1": NodeEnd("n1", "exited", 0), "n2": NodeEnd("n2", "exited", 0)}, ["x"],
                       0.0, False, False, "")
    assert any("rank 0 reported again on n2's connection" in note for note in outcome.skipped_lines)
    assert outcome.output_tail == "n2: not an event" and outcome.launcher == "ssh"


def test_an_unreachable_host_is_the_culprit_in_ssh_words():
    followed = _Followed(["n1", "n2"], 2, None)
    followed.line("n1", event_line(rank=0))
    why = "n2: sshd not answering (ssh: connect to host 10.0.0.2 port 22: Connection refused)"
    followed.ended(NodeEnd("n2", "unreachable", why=why))
    outcome = _outcome(followed, {"n1": NodeEnd("n1", "silent"), "n2": NodeEnd("n2", "unreachable", why=why)},
                       ["x"], 0.0, False, False, "")
    assert outcome.launch_failures == {"n2": why} and outcome.returncode == 255 and not outcome.overran
    _, findings = diagnose(outcome, 30)
    assert findings[0].startswith(f"ssh could not start the ranks on {why}. That host is the culprit")
    assert "srun" not in findings[0]


# --- against a real sshd on 127.0.0.1 --------------------------------------------------------------


@needs_sshd
def test_the_rendezvous_address_is_the_hostname_ssh_is_configured_with(over_ssh):
    with local_sshd(["n1"]) as ssh:
        transport = SshTransport({**os.environ, SSH_CONFIG_ENV: str(ssh.config)})
        assert transport.address("n1") == "127.0.0.1"
        assert transport.address("not-in-the-config") == "not-in-the-config"


@pytest.mark.slow
@needs_sshd
def test_pattern_all_runs_every_hosts_ranks_in_one_call(over_ssh):
    with local_sshd(["n1", "n2"]) as ssh:
        over_ssh(ssh.config)
        result = SPEC.run(SPEC.Params(pattern="all", hosts=["n[1-2]"], **SMALL), lambda f, m: None)
    assert (result.nnodes, result.world_size, result.backend) == (2, 2, "gloo"), result.findings
    assert [r.bytes for r in result.rows] == [32 << 10, 256 << 10] and result.verdict == "info", result.findings


@pytest.mark.slow
@needs_sshd
def test_pairwise_names_a_host_whose_sshd_does_not_answer_and_no_other(over_ssh):
    with local_sshd(["n1", "n2"], dead=["n3"]) as ssh:
        over_ssh(ssh.config)
        result = SPEC.run(SPEC.Params(pattern="pairwise", hosts=["n[1-3]"], **SMALL), lambda f, m: None)
    iso = result.isolation
    assert [(s.kind, s.nodes) for s in iso.suspects] == [("node", ["n3"])], result.findings
    assert "sshd not answering" in iso.suspects[0].evidence and result.verdict == "fail"
    assert [g.status for g in iso.groups if "n3" not in g.nodes] == ["ok"]
    failed = [g for g in iso.groups if "n3" in g.nodes]
    assert len(failed) == 3 and all(g.wall_s < 20 for g in failed), failed   # not held to the group deadline
    assert json.dumps(result.model_dump())   # the answer serialises as the srun path's does


# --- transport rdma over ssh: perftest per pair, each side on its host ------------------------------


@needs_sshd
def test_rdma_over_ssh_asks_every_host_and_names_what_each_lacks(over_ssh):
    """transport=rdma with hosts= asks each host over ssh (this machine has no RDMA device and, unless installed,
    no perftest): every host named with what it lacks, a dead sshd as no answer, nothing measured."""
    import shutil
    from pathlib import Path

    if any(Path("/sys/class/infiniband").glob("*")):
        pytest.skip("this machine has RDMA devices: the hosts would not lack one")
    lacks = "no RDMA device with an ACTIVE port" + ("" if shutil.which("ib_write_bw") and shutil.which("ib_write_lat")
                                                    else ", perftest not present (ib_write_bw / ib_write_lat not on PATH)")
    with local_sshd(["n1", "n2"], dead=["n3"]) as ssh:
        over_ssh(ssh.config)
        with pytest.raises(ToolFailure) as failure:
            SPEC.run(SPEC.Params(pattern="pairwise", transport="rdma", hosts=["n[1-3]"], **SMALL), lambda f, m: None)
    said = str(failure.value)
    assert said.startswith("transport: rdma needs perftest and an ACTIVE RDMA port on every node; "), said
    assert f"n1: {lacks}; n2: {lacks}; n3: no answer (sshd not answering" in said, said


@pytest.mark.slow
@needs_sshd
def test_rdma_over_ssh_runs_each_side_on_its_host_and_a_hung_pair_is_cut_there(monkeypatch):
    """Each side of a pair is the transport's command on its host; at the deadline the local ssh is killed and
    remote_step ends the side on the host: nothing of the pair runs on."""
    import time
    import uuid

    import psutil

    from tools.collective_bench import rdma_rounds
    from tools.shared import perftest

    with local_sshd(["n1", "n2"]) as ssh:
        launch = rdma_rounds.launcher(SshTransport({**os.environ, SSH_CONFIG_ENV: str(ssh.config)}))
        out, _ = launch("n2", ["sh", "-c", "echo reached $MLENG_NODE"]).communicate(timeout=60)
        assert out.strip() == "reached n2"
        mark = f"{300 + uuid.uuid4().int % 1000}.{os.getpid()}"      # each side sleeps this long: findable
        monkeypatch.setattr(perftest, "SERVER_START_S", 0.2)
        monkeypatch.setattr(perftest, "argv", lambda *a, **k: ["sleep", mark])
        (run,) = rdma_rounds.run_round_rdma([[0, 1]], names=["n1", "n2"], devices={"n1": ["d0"], "n2": ["d0"]},
                                            addresses={"n1": "127.0.0.1", "n2": "127.0.0.1"}, deadline_s=8,
                                            launch=launch)
        assert run.status == "hang" and "n1+n2" in run.detail and "hung" in run.detail, run

        def sides() -> list[int]:
            return [p.pid for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", mark]]

        deadline = time.monotonic() + 15
        while sides() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not sides(), "a side of the hung pair still runs on its host"


def test_rdma_started_by_hand_on_each_node_or_with_another_pattern_is_refused_naming_what_runs(over_ssh):
    for params in (dict(pattern="pairwise", hosts=["a", "b"], node_rank=0, rdzv_endpoint="a:29400"),
                   dict(pattern="bisect", hosts=["a", "b"])):
        with pytest.raises(ToolFailure, match="^transport: rdma runs with pattern pairwise, on nodes reached through "
                                              r"SLURM \(an allocation, partition or job_id\) or over ssh"):
            SPEC.run(SPEC.Params(transport="rdma", **params, **SMALL), lambda f, m: None)
