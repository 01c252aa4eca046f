"""straggler_find and hang_stack_dump over ssh on the 4-node namespace cluster, for a torchrun job launched over ssh
(no SLURM in the path): the SSH twins of tests/test_straggler_find_cluster.py and the frozen-rank drill.

The job: bench/straggler_workload.py (gloo), one torchrun per node started with `ssh mlnK torchrun --node-rank K-1
--rdzv-id RUN ...` (scripts/cluster-local.sh sshd: one sshd per node, in the node's namespaces and cpu cgroup, so the
job on mlnK runs in mlnK's cgroup). Faults injected from outside: mln3's cgroup capped at 5% of a CPU (rank 2 is the
straggler, named with its host); rank 1 on mln2 stopped with SIGSTOP (hang_stack_dump names it and its host); the
healthy job (no straggler, no frozen rank). Every rank's host is the name ssh reached, never the node's own word.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.multinode_cluster import REPO, multinode_cluster  # noqa: F401  (fixture)
from tests.test_straggler_find_cluster import ours_left
from tools import hang_stack_dump as hsd
from tools import straggler_find as sf
from tools.engine.transport import SSH_CONFIG_ENV, SshTransport

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]
WORKLOAD = REPO / "bench" / "straggler_workload.py"
QUIET = lambda fraction, message: None  # noqa: E731


@pytest.fixture(scope="module")
def ssh_cluster(multinode_cluster):  # noqa: F811
    from tests.ssh_helpers import why_no_sshd

    if why_no_sshd():
        pytest.skip(why_no_sshd())
    multinode_cluster.script("sshd")
    return multinode_cluster


@pytest.fixture
def cluster(ssh_cluster, monkeypatch):
    from tools.evals.drills.cluster import CLUSTER_DIR

    monkeypatch.setenv(SSH_CONFIG_ENV, f"{CLUSTER_DIR}/ssh/config")
    yield ssh_cluster
    ssh_cluster.heal()


class SshJob:
    """torchrun on every node over ssh (static rendezvous: rank K-1 on mlnK), rendezvous id `run_id`."""

    def __init__(self, cluster, work: Path, run_id: str, *args: str, port: int = 29571):
        self.work, self.run_id, self.nodes = work, run_id, cluster.nodes
        work.chmod(0o755)
        self.ssh, self.outs = [], []
        transport = SshTransport()
        for k, node in enumerate(cluster.nodes):
            # TMPDIR: torchrun's torchelastic_* folder, which a stopped torchrun leaves behind, goes to the test's
            argv = ["env", f"TMPDIR={work}", sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(cluster.nodes)}",
                    "--nproc-per-node=1", f"--node-rank={k}", f"--master-addr={cluster.address(cluster.nodes[0])}",
                    f"--master-port={port}", f"--rdzv-id={run_id}", "--monitor-interval=0.5", str(WORKLOAD),
                    "--steps", "1000000", "--pid-dir", str(work), *args]
            out = open(work / f"{node}.out", "w")
            self.outs.append(out)
            # Each ssh runs torchrun under remote_step: when this ssh ends, the node's torchrun is stopped too.
            self.ssh.append(subprocess.Popen(transport.command(node, argv), stdout=out, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, start_new_session=True))
        self.wait_steps(10, 180)

    def steps(self) -> int:
        return sum((self.work / f"{n}.out").read_text(errors="replace").count("\nstep ") for n in self.nodes)

    def wait_steps(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.steps() < count:
            dead = [n for n, p in zip(self.nodes, self.ssh) if p.poll() is not None]
            assert not dead and time.monotonic() < deadline, (dead, {
                n: (self.work / f"{n}.out").read_text(errors="replace")[-800:] for n in self.nodes})
            time.sleep(0.5)

    def pid(self, rank: int) -> int:
        return int((self.work / f"rank{rank}.pid").read_text())

    def stop(self) -> None:
        for p in self.ssh:
            os.killpg(p.pid, signal.SIGTERM)
        for p in self.ssh:
            p.wait(30)
        for out in self.outs:
            out.close()
        deadline = time.monotonic() + 60           # remote_step stops torchrun, torchrun its worker
        while self._ranks_alive() and time.monotonic() < deadline:
            time.sleep(0.5)
        left = self._ranks_alive()
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        assert not left, f"ranks outlived their ssh: {left}"

    def _ranks_alive(self) -> list[int]:
        alive = []
        for r in range(len(self.nodes)):
            try:
                pid = self.pid(r)
                if WORKLOAD.name.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    alive.append(pid)
            except (OSError, ValueError):
                continue
        return alive


def _seen(result) -> list:
    """Per rank: waiting share per third, samples per third, CPU-s/s, run-queue wait s/s, others runnable."""
    return [(r.rank, r.host, [round(p.get("collective", 0), 2) for p in r.part_fractions], r.part_samples,
             r.cpu_fraction, r.runqueue_wait_fraction, r.others_runnable) for r in result.ranks]


def test_cpu_limited_node_is_named_with_its_host_over_ssh(cluster, tmp_path):
    job = SshJob(cluster, tmp_path, "sshranks-cpu")
    try:
        cluster.cpu_limit("mln3", 5)      # as the SLURM twin: 5% of a CPU for everything on mln3
        job.wait_steps(job.steps() + 3, 120)
        result = sf.run(sf.StragglerFindParams(hosts=["mln[1-4]"], run_id="sshranks-cpu", window_s=10, rate_hz=10),
                        QUIET)
        job.wait_steps(job.steps() + 1, 120)           # untouched: still stepping
    finally:
        job.stop()
    assert sorted(n.host for n in result.nodes) == cluster.nodes
    assert sorted((r.rank, r.host) for r in result.ranks) == [(k, f"mln{k + 1}") for k in range(4)]
    assert result.verdict == "warn" and len(result.stragglers) == 1, (result.findings, _seen(result))
    s = result.stragglers[0]
    assert (s.host, s.rank, s.reason) == ("mln3", 2, "cpu"), result.findings
    assert not ours_left(cluster)


def test_stopped_rank_is_named_with_its_host_over_ssh(cluster, tmp_path):
    job = SshJob(cluster, tmp_path, "sshranks-frozen", "--dim", "128", "--matmuls", "2")
    try:
        victim = job.pid(1)
        assert victim in cluster.node_pids("mln2")       # static rendezvous: rank 1 runs on mln2
        os.kill(victim, signal.SIGSTOP)
        time.sleep(2)                                    # the others reach the all_reduce rank 1 does not
        result = hsd.run(hsd.HangStackDumpParams(hosts=["mln[1-4]"], run_id="sshranks-frozen"), QUIET)
        os.kill(victim, signal.SIGCONT)
    finally:
        job.stop()
    assert result.launcher == "ssh" and result.frozen_ranks == [1], result.findings
    assert result.culprit is not None and (result.culprit.rank, result.culprit.node) == (1, "mln2"), result.culprit
    assert result.findings[0].startswith("rank 1 on mln2:") and "stopped" in result.findings[0], result.findings
    ranks = {(p.rank, p.host) for p in result.processes if p.role == "rank"}
    assert ranks == {(k, f"mln{k + 1}") for k in range(4)}, ranks
    assert not result.silent_nodes and not ours_left(cluster)


def test_healthy_job_over_ssh_has_no_culprit(cluster, tmp_path):
    job = SshJob(cluster, tmp_path, "sshranks-ok")
    try:
        result = sf.run(sf.StragglerFindParams(hosts=["mln[1-4]"], launcher_match="rdzv-id=sshranks-ok",
                                               window_s=10, rate_hz=10), QUIET)
        dumped = hsd.run(hsd.HangStackDumpParams(hosts=["mln[1-4]"], run_id="sshranks-ok"), QUIET)
        job.wait_steps(job.steps() + 3, 120)
    finally:
        job.stop()
    assert len(result.ranks) == 4 and result.stragglers == [], (result.findings, _seen(result))
    assert result.verdict in ("ok", "info") and result.spread_pct is not None
    assert dumped.frozen_ranks == [] and dumped.silent_nodes == [] and dumped.hosts == cluster.nodes, dumped.findings
    assert not ours_left(cluster)
