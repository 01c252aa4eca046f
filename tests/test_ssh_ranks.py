"""straggler_find and hang_stack_dump for a torchrun job without SLURM: hosts= over ssh, the job named by its
rendezvous id (--rdzv-id) or its launcher's command line (shared/process_targets/runs.py, straggler_find/ssh_job.py,
hang_stack_dump/ssh_hosts.py).

On this machine: the names are checked before anything runs; a real gloo torchrun (2 ranks, --rdzv-id) is found by
its run id and by its launcher, another user's process claiming the run id is refused with a sentence, one in
another network namespace (another host sharing this kernel) is not taken; then both tools over a real sshd of our
own (tests/ssh_helpers.py) credit every rank to the name ssh reached, name a dead host, and name the SIGSTOPped
rank with its host. The 4-node twins (a CPU-capped node, a frozen rank, a healthy control): test_ssh_ranks_cluster.py.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ssh_helpers import free_port, local_sshd, why_no_sshd
from tools import hang_stack_dump as hsd
from tools import straggler_find as sf
from tools.engine.processes import kill_tree, torchrun_command
from tools.engine.spec import ToolFailure
from tools.engine.transport import SSH_CONFIG_ENV
from tools.shared import pyspy
from tools.shared.process_targets import TargetRequest, check_launcher_match, check_run_id, select

REPO = Path(__file__).resolve().parent.parent
RUN_ID = f"sshranks-{os.getpid()}"
QUIET = lambda fraction, message: None  # noqa: E731
# One worker under `-n 2 --dist loadgroup`: split across two, each started its own job and sshd (module fixtures).
pytestmark = pytest.mark.xdist_group("ssh_ranks")


# --- names checked before anything runs ------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "x" * 129, "a b", "$(reboot)", "-rf", "job;id", "none", "ünï"])
def test_bad_run_ids_are_refused_naming_what_is_accepted(text):
    with pytest.raises(ValueError) as e:
        check_run_id(text)
    assert "run_id" in str(e.value) and ("letters, digits, _ . : -" in str(e.value) or "default --rdzv-id" in str(e.value))


@pytest.mark.parametrize("text", ["ab", "x" * 201, "train.py; rm -rf /", "a|b", "`id`", "train.py\n", "   "])
def test_bad_launcher_matches_are_refused_naming_what_is_accepted(text):
    with pytest.raises(ValueError) as e:
        check_launcher_match(text)
    assert "a literal piece, not a regex" in str(e.value)


def test_good_names_pass_unchanged():
    assert check_run_id("job-42_a.b:7") == "job-42_a.b:7"
    assert check_launcher_match("torchrun --rdzv-id=job42 train.py") == "torchrun --rdzv-id=job42 train.py"


def test_straggler_find_params_need_one_way_to_name_the_job():
    assert sf.StragglerFindParams(hosts=["gpu-[01-04]"], run_id="job42").run_id == "job42"
    for kw, said in ((dict(hosts=["a"]), "got neither"),
                     (dict(hosts=["a"], run_id="j", launcher_match="train.py"), "got run_id and launcher_match"),
                     (dict(run_id="job42"), "give hosts too"),
                     (dict(hosts=["a"], run_id="a b"), "letters, digits"),
                     (dict(hosts=["a"], slurm_job_id="12", run_id="j"), "exactly one of")):
        with pytest.raises(ValueError, match=said):
            sf.StragglerFindParams(**kw)


def test_bad_host_names_are_answers_before_ssh_runs():
    for hosts, said in ((["-oProxyCommand=x"], "not a host name"), (["root@gpu1"], "no user@"),
                        (["n[1-100]"], "more than 64")):
        with pytest.raises(ToolFailure, match=said):
            sf.run(sf.StragglerFindParams(hosts=hosts, run_id="job42", window_s=5), QUIET)
        with pytest.raises(ToolFailure, match=said):
            hsd.run(hsd.HangStackDumpParams(hosts=hosts, run_id="job42"), QUIET)


def test_hang_stack_dump_names_the_missing_job_name_and_conflicts():
    with pytest.raises(ToolFailure, match="got neither"):
        hsd.run(hsd.HangStackDumpParams(hosts=["a"]), QUIET)
    with pytest.raises(ToolFailure, match="not both"):
        hsd.run(hsd.HangStackDumpParams(hosts=["a"], run_id="j", slurm_job_id="4"), QUIET)
    with pytest.raises(ToolFailure, match="a literal piece"):
        hsd.run(hsd.HangStackDumpParams(launcher_match="x|y"), QUIET)


# --- a real torchrun on this machine --------------------------------------------------------------


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """torchrun, 2 gloo ranks of bench/straggler_workload.py, rendezvous id RUN_ID; the ranks' pids by rank."""
    try:
        pyspy.py_spy_path()
    except ToolFailure as e:
        pytest.skip(str(e))
    work = tmp_path_factory.mktemp("sshranks")
    # --pace-s/--dim: a live job, not a busy one (its ranks ran flat out through the whole module: two cores' worth on
    # an idle box); ~0.05 s a step asleep in the loader, a ~1 ms computation, the all_reduce as before.
    cmd = torchrun_command("straggler_workload", 2, ["--steps", "1000000", "--pid-dir", str(work), "--pace-s", "0.05",
                                                     "--dim", "128"],
                           rdzv_endpoint=f"127.0.0.1:{free_port()}", rdzv_id=RUN_ID)
    out = open(work / "job.out", "w")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=work,
                            env=dict(os.environ, PYTHONPATH=str(REPO / "bench"), TMPDIR=str(work)))
    try:
        deadline = time.monotonic() + 120
        while (work / "job.out").read_text().count("\nstep ") < 5:
            assert proc.poll() is None and time.monotonic() < deadline, (work / "job.out").read_text()[-1500:]
            time.sleep(0.5)
        yield {"launcher": proc.pid, 0: int((work / "rank0.pid").read_text()), 1: int((work / "rank1.pid").read_text())}
    finally:
        kill_tree(proc.pid)
        proc.wait()
        out.close()


def _claimant(prefix: list[str], rank: int) -> subprocess.Popen:
    """A Python process that says it is rank `rank` of RUN_ID (its environment), started under `prefix`."""
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin") or sys.executable
    return subprocess.Popen([*prefix, "env", f"TORCHELASTIC_RUN_ID={RUN_ID}", f"RANK={rank}", python, "-c",
                             "import time; time.sleep(120)"], start_new_session=True)


def _end(proc: subprocess.Popen) -> None:
    """The claimant's whole session: runuser and unshare leave their child running when they are killed."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _ranks(pids: list[int], job: dict) -> set[int]:
    return {r for r in (0, 1) if job[r] in pids}


@pytest.mark.slow
def test_the_run_id_finds_both_ranks_and_refuses_another_users_claim(job):
    if os.geteuid() != 0:
        pytest.skip("starting a process as another user needs root")
    other = _claimant(["runuser", "-u", "nobody", "--"], 5)
    try:
        time.sleep(0.5)
        found = select(TargetRequest(run_id=RUN_ID))
    finally:
        _end(other)
    assert _ranks(found.pids, job) == {0, 1} and job["launcher"] not in found.pids
    assert not set(found.pids) - {job[0], job[1]} - set(_children(job)), found.pids   # ranks (and their children) only
    [refusal] = found.refused
    assert f"claims rank 5 of torchrun run {RUN_ID} but belongs to uid 65534 (nobody), not to you, uid 0 (root)" in refusal


def _children(job) -> list[int]:
    import psutil

    return [c.pid for r in (0, 1) for c in psutil.Process(job[r]).children(recursive=True)]


def test_a_claim_from_another_network_namespace_is_another_host(job):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("a network namespace of its own needs root and unshare")
    elsewhere = _claimant(["unshare", "--net", "--"], 7)
    try:
        time.sleep(0.5)
        found = select(TargetRequest(run_id=RUN_ID))
    finally:
        _end(elsewhere)
    assert elsewhere.pid not in found.pids and _ranks(found.pids, job) == {0, 1} and not found.refused


def test_the_launchers_command_line_finds_its_ranks(job):
    found = select(TargetRequest(launcher_match=f"rdzv-id={RUN_ID}"))
    assert _ranks(found.pids, job) == {0, 1} and job["launcher"] not in found.pids, found
    assert select(TargetRequest(launcher_match="no-such-launcher-anywhere")).pids == []


# --- over a real sshd ---------------------------------------------------------------------------


@pytest.fixture
def sshd(monkeypatch):
    if why_no_sshd():
        pytest.skip(why_no_sshd())
    with local_sshd(["n1"], dead=["n9"]) as ssh:
        monkeypatch.setenv(SSH_CONFIG_ENV, str(ssh.config))
        yield ssh


@pytest.mark.slow
def test_straggler_find_over_ssh_credits_ranks_to_the_host_ssh_reached(job, sshd):
    other = _claimant(["runuser", "-u", "nobody", "--"], 5)
    try:
        result = sf.run(sf.StragglerFindParams(hosts=["n1", "n9"], run_id=RUN_ID, window_s=6, rate_hz=10), QUIET)
    finally:
        _end(other)
    assert sorted((r.rank, r.host, r.pid) for r in result.ranks) == [(0, "n1", job[0]), (1, "n1", job[1])]
    assert [n.host for n in result.nodes] == ["n1"] and all(r.samples > 0 for r in result.ranks), result.findings
    assert any(f.startswith("n9: no report: sshd not answering") for f in result.findings), result.findings
    [left_out] = [f for f in result.findings if "left out, not sampled" in f]
    assert "first: n1: pid" in left_out and "claims rank 5 of torchrun run" in left_out and "(nobody)" in left_out


def test_a_run_id_with_no_process_on_the_hosts_is_a_clear_answer(job, sshd):
    with pytest.raises(ToolFailure, match="n1: no process of the job found on this node"):
        sf.run(sf.StragglerFindParams(hosts=["n1"], run_id="no-such-run", window_s=5), QUIET)
    with pytest.raises(ToolFailure, match="n1: none of the job's processes found there"):
        hsd.run(hsd.HangStackDumpParams(hosts=["n1"], run_id="no-such-run"), QUIET)


@pytest.mark.slow
def test_hang_stack_dump_over_ssh_names_the_stopped_rank_and_its_host(job, sshd):
    os.kill(job[1], signal.SIGSTOP)
    try:
        time.sleep(1.0)                       # rank 0 enters the all_reduce rank 1 will not join
        result = hsd.run(hsd.HangStackDumpParams(hosts=["n1", "n9"], launcher_match=f"--rdzv-id={RUN_ID}"), QUIET)
    finally:
        os.kill(job[1], signal.SIGCONT)
    assert result.launcher == "ssh" and result.frozen_ranks == [1], result.findings
    assert result.culprit is None and result.silent_nodes == ["n9"]     # a silent host: no single culprit
    assert result.findings[0].startswith("rank 1 on n1: pid") and "stopped" in result.findings[0], result.findings
    assert "No report from n9" in result.findings[1] and "sshd not answering" in result.findings[1]
    assert {p.host for p in result.processes} == {"n1"} and {p.rank for p in result.processes if p.role == "rank"} == {0, 1}


def test_when_no_host_answers_no_host_is_called_the_place_to_look(sshd):
    """Model round 11: every node silent, and the headline said "that node is where to look first" of all of them."""
    result = hsd.run(hsd.HangStackDumpParams(hosts=["n9"], run_id=RUN_ID), QUIET)
    assert result.findings[0].startswith("No report from any of the job's nodes (n9): n9: no report: sshd not "
                                         "answering"), result.findings
    assert "where to look first" not in result.findings[0] and "dump one rank with pids and node" in result.findings[0]
    assert result.silent_nodes == ["n9"] and result.odd_nodes == [] and result.culprit is None


def test_hang_stack_dump_over_ssh_healthy_run_has_no_culprit(job, sshd):
    result = hsd.run(hsd.HangStackDumpParams(hosts=["n1"], run_id=RUN_ID), QUIET)
    assert result.frozen_ranks == [] and result.silent_nodes == [] and result.hosts == ["n1"], result.findings
    assert sorted(p.rank for p in result.processes if p.role == "rank") == [0, 1]
    assert not result.left_out


# --- the SSH drills' twins: what the scripted baseline is told and calls ------------------------------


def test_ssh_drills_tell_the_baseline_no_slurm_and_it_calls_hosts_with_the_run_id():
    from tools.evals.drills.baseline import params_for
    from tools.evals.drills.scenarios import load_scenario
    from tools.evals.drills.session import context_for
    from tools.evals.drills.state import DrillState, work_dir

    for scenario_id in ("cl-ssh-frozen-rank", "cl-ssh-throttled-rank"):
        scenario = load_scenario(scenario_id)
        context = context_for(scenario, DrillState(scenario=scenario.id, work_dir=str(work_dir())))
        assert "partition" not in context and "job_id" not in context and "SLURM_CONF" not in context["env"]
        assert context["env"]["MLENG_TRANSPORT"] == "ssh" and context["env"][SSH_CONFIG_ENV].endswith("/ssh/config")
        for tool in ("straggler_find", "hang_stack_dump"):
            assert params_for(tool, scenario.message, context) == {"hosts": ["mln1", "mln2", "mln3", "mln4"],
                                                                   "run_id": "drill-ssh-train"}
        assert params_for("collective_bench", scenario.message, context) is None    # no allocation to run in
        assert params_for("fleet_sweep", scenario.message, context) is None
