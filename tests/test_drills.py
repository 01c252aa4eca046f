"""Fault drills (tools/evals/drills): scenarios are honest, grading is strict, stop leaves nothing."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.evals.drills import session as drill_cli
from tools.evals.drills.state import DrillState, state_file, work_dir
from tools.evals.drills.grade import Diagnosis, grade, parse_diagnosis
from tests.multinode_cluster import multinode_cluster  # noqa: F401  (fixture, requested by the cluster test only)
from tools.evals.drills.scenarios import Scenario, TOPICS, Truth, all_scenarios, load_scenario

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("MLENG_HOME", str(tmp_path / "home"))
    yield tmp_path / "home"
    drill_cli.stop()


def test_the_scenarios_cover_the_drill_topics_with_controls():
    scenarios = all_scenarios()
    assert len(scenarios) >= 15
    assert {s.topic for s in scenarios} == set(TOPICS)
    assert sum(s.truth.kind == "none" for s in scenarios) >= 3
    assert len({s.id for s in scenarios}) == len(scenarios)


@pytest.mark.parametrize("change, complaint", [
    ({"message": "Our all-reduce got slow; I bet mln3 is bad. Which node?"}, "names the culprit 'mln3'"),
    ({"message": "Please run fleet_sweep on the partition and tell me the bad node."}, "names the tool"),
    ({"topic": "control"}, "control scenario's truth is 'none'"),
    ({"fault": [{"kind": "rate_limit", "node": "mln7"}]}, "not one of the scenario's nodes"),
    ({"fault": [{"kind": "rate_limit", "node": "mln3", "bogus": 1}]}, "bogus"),
    ({"fault": [{"kind": "kill_sshd", "node": "mln3"}]}, "kill_sshd needs transport = 'ssh'"),
    ({"transport": "ssh", "fault": [{"kind": "kill_slurmd", "node": "mln3"}]}, "without SLURM faults"),
])
def test_a_scenario_that_gives_the_answer_away_or_is_malformed_is_refused(change, complaint):
    data = load_scenario("cl-slow-node").model_dump()
    data.update(change)
    with pytest.raises(ValueError, match=complaint):
        Scenario(**data)


def test_an_ssh_drill_gives_host_names_and_ssh_and_the_baseline_passes_them_as_hosts(home):
    """The SSH twins: no partition, no SLURM_CONF; the tools reach the hosts over ssh from the one call."""
    from tools.evals.drills.baseline import params_for

    scenario = load_scenario("ssh-slow-link")
    context = drill_cli.context_for(scenario, DrillState(scenario=scenario.id, work_dir=str(work_dir())))
    assert context["hosts"] == ["mln1", "mln2", "mln3", "mln4"] and "partition" not in context
    assert context["env"]["MLENG_TRANSPORT"] == "ssh" and "SLURM_CONF" not in context["env"]
    assert params_for("collective_bench", scenario.message, context) == {
        "pattern": "pairwise", "backend": "gloo", "hosts": ["mln1", "mln2", "mln3", "mln4"]}
    assert params_for("fleet_sweep", scenario.message, context)["hosts"] == context["hosts"]
    slurm_twin = load_scenario("cl-slow-link")
    assert "hosts" not in params_for("collective_bench", slurm_twin.message, drill_cli.context_for(
        slurm_twin, DrillState(scenario=slurm_twin.id, work_dir=str(work_dir()))))


def diag(**kw) -> Diagnosis:
    return Diagnosis(**kw)


def test_a_gpu_is_scored_by_its_node_and_bus_id():
    """Issue 34: an agent that named the right node for a GPU fault scored 0 when the message asked 'which machine'."""
    window = load_scenario("pm-t-xid-window")         # truth: gpu "node4 0000:00:08", drain_ok node4
    off_bus = load_scenario("pm-gpu-off-the-bus")     # truth: gpu "gpu-node02" (no bus id given)
    assert grade(window, diag(culprit_kind="gpu", culprit=["node4 GPU 0000:00:08.0 (serial 1652923018111)"],
                              drain=["node4"])).score == 1
    assert grade(window, diag(culprit_kind="gpu", culprit=["node4:00:08"])).score == 1
    assert grade(window, diag(culprit_kind="gpu", culprit=["node4 0000:00:05"])).score == 0     # another GPU
    assert grade(window, diag(culprit_kind="node", culprit=["node4"])).score == 0               # which GPU?
    assert grade(off_bus, diag(culprit_kind="node", culprit=["gpu-node02"], drain=["gpu-node02"])).score == 1
    assert grade(off_bus, diag(culprit_kind="gpu", culprit=["gpu-node02 0000:b7:00"])).score == 1
    assert grade(off_bus, diag(culprit_kind="gpu", culprit=["gpu-node01"])).score == 0


def test_grading_rules():
    slow = load_scenario("cl-slow-node")           # node mln3, drain_ok mln3
    link = load_scenario("cl-slow-link")           # link mln1-mln2, no drain
    control = load_scenario("cl-healthy-which-node")
    assert grade(slow, diag(culprit_kind="node", culprit=["MLN3"], drain=["mln3"])).score == 1
    assert grade(slow, diag(culprit_kind="node", culprit=["mln3", "mln1"])).score == 0.5
    wrong = grade(slow, diag(culprit_kind="node", culprit=["mln3"], drain=["mln3", "mln1"]))
    assert (wrong.score, wrong.false_drain) == (0, ["mln1"])
    assert grade(slow, diag(culprit_kind="inconclusive")).score == 0
    assert grade(link, diag(culprit_kind="link", culprit=["mln2 <-> mln1"])).score == 1
    assert grade(link, diag(culprit_kind="node", culprit=["mln1", "mln2"])).score == 0   # a link named as nodes
    assert grade(link, diag(culprit_kind="link", culprit=["mln1-mln2"], drain=["mln1"])).false_drain == ["mln1"]
    assert grade(control, diag(culprit_kind="none")).score == 1
    assert grade(control, diag(culprit_kind="inconclusive")).score == 0.5
    assert grade(control, diag(culprit_kind="node", culprit=["mln2"])).score == 0
    rank = load_scenario("pm-watchdog-missing-rank")
    assert grade(rank, diag(culprit_kind="rank", culprit=["rank 7"])).score == 1
    setting = load_scenario("pm-socket-fallback")
    assert grade(setting, diag(culprit_kind="setting", culprit=["nccl_ib_disable=1"])).score == 1


def test_two_faults_of_different_kinds_are_graded_together():
    both = load_scenario("cl-link-and-starved-node")   # node mln4 (drain_ok) and link mln1-mln2
    link = {"culprit_kind": "link", "culprit": ["mln2-mln1"]}
    assert grade(both, diag(culprit_kind="node", culprit=["mln4"], drain=["mln4"], also=[link])).score == 1
    assert grade(both, diag(culprit_kind="link", culprit=["mln1-mln2"],
                            also=[{"culprit_kind": "node", "culprit": ["mln4"]}])).score == 1   # either way round
    assert grade(both, diag(culprit_kind="node", culprit=["mln4"], drain=["mln4"])).score == 0.5   # the link missed
    assert grade(both, diag(culprit_kind="node", culprit=["mln4", "mln3"], also=[link])).score == 0.5
    assert grade(both, diag(culprit_kind="node", culprit=["mln1", "mln2"], drain=["mln1"])).false_drain == ["mln1"]
    assert grade(both, diag(culprit_kind="node", culprit=["mln3"])).score == 0
    with pytest.raises(ValueError, match="kinds other than"):
        Truth(kind="node", identity=["mln4"], also=[{"kind": "node", "identity": ["mln3"]}])


def test_a_rank_held_back_by_its_nodes_limit_is_right_named_by_rank_or_by_node():
    throttled = load_scenario("cl-throttled-rank")     # rank 2 on mln3, whose cgroup quota holds it back
    assert grade(throttled, diag(culprit_kind="rank", culprit=["rank 2"])).score == 1
    assert grade(throttled, diag(culprit_kind="node", culprit=["mln3"])).score == 1      # what straggler_find types
    assert grade(throttled, diag(culprit_kind="node", culprit=["mln2"])).score == 0
    assert grade(throttled, diag(culprit_kind="node", culprit=["mln3", "mln1"])).score == 0
    assert grade(load_scenario("cl-busy-neighbour"), diag(culprit_kind="node", culprit=["mln2"])).score == 1
    assert grade(load_scenario("cl-slow-node"), diag(culprit_kind="rank", culprit=["rank 2"])).score == 0
    # A node's tc shaper is a setting of that node: named by the node it is on (model round 11), not by another's.
    slow_node = load_scenario("cl-slow-node")
    assert grade(slow_node, diag(culprit_kind="setting", culprit=["mln3: tc tbf qdisc on eth0 at 50Mbit"])).score == 1
    assert grade(slow_node, diag(culprit_kind="setting", culprit=["mln2: tc tbf qdisc on eth0"])).score == 0
    assert grade(slow_node, diag(culprit_kind="setting", culprit=["NCCL_SOCKET_IFNAME"])).score == 0
    assert grade(slow_node, diag(culprit_kind="setting", culprit=["mln3"])).score == 0               # says no setting
    assert grade(slow_node, diag(culprit_kind="setting", culprit=["NCCL_IB_HCA on mln3"])).score == 0
    assert grade(load_scenario("pm-socket-fallback"), diag(culprit_kind="setting", culprit=["mln3"])).score == 0
    with pytest.raises(ValueError, match="same_as"):
        Truth(kind="rank", identity=["2"], same_as=[{"kind": "rank", "identity": ["3"]}])


@pytest.mark.parametrize("text, complaint", [
    ("not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    ('{"culprit_kind": "server"}', "culprit_kind"),
    ('{"culprit_kind": "node", "culprit": "mln3"}', "culprit"),
])
def test_a_bad_diagnosis_gets_a_clear_error(text, complaint):
    with pytest.raises(ValueError, match=complaint):
        parse_diagnosis(text)


def mleng_drill(*args: str, home: Path, stdin: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "MLENG_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "tools", "drill", *args], cwd=REPO, env=env, input=stdin,
                          capture_output=True, text=True, timeout=120)


def _cluster_names(instance: str) -> subprocess.CompletedProcess:
    code = ("from tools.evals.drills import cluster as c\n"
            "print(c.CLUSTER_DIR, c.SESSION_LOCK, c.BRIDGE, c.address('mln3'), c.PORT_BASE, c.NODE_CGROUPS,"
            " ' '.join(c.in_node('mln3', 'true')))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "MLN_CLUSTER_INSTANCE": instance}, cwd=Path(__file__).parent.parent)


def test_cluster_instance_0_keeps_the_names_and_instance_1_shares_none():
    zero = _cluster_names("0").stdout.split()
    assert zero == ["/tmp/mln-cluster", "/tmp/mln-cluster.session.lock", "mlnbr0", "10.213.0.3", "7817",
                    "/sys/fs/cgroup/cpu/mln", "ip", "netns", "exec", "mln3", "true"]
    one = _cluster_names("1").stdout.split()
    assert one == ["/tmp/i1mln-cluster", "/tmp/i1mln-cluster.session.lock", "mlnbr1", "10.213.1.3", "7827",
                   "/sys/fs/cgroup/cpu/i1mln", "ip", "netns", "exec", "i1mln3", "true"]
    bad = _cluster_names("12")
    assert bad.returncode and "MLN_CLUSTER_INSTANCE must be one digit, 0..9" in bad.stderr and "'12'" in bad.stderr
    script = Path(__file__).parent.parent / "scripts" / "cluster-local.sh"
    refused = subprocess.run(["bash", str(script), "nodes"], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "MLN_CLUSTER_INSTANCE": "x"})
    assert refused.returncode == 2 and "MLN_CLUSTER_INSTANCE must be 0..9, got 'x'" in refused.stderr


def test_stop_refuses_a_drill_started_on_another_cluster_instance(home):
    """Its faults are on that instance's namespaces: stop here would undo nothing of them and drop the state."""
    from tools.evals.drills.cluster import INSTANCE

    other = (INSTANCE + 1) % 10
    DrillState(scenario="cl-slow-node", work_dir=str(work_dir()), instance=other).save()
    with pytest.raises(drill_cli.DrillError, match=f"instance {other} .*MLN_CLUSTER_INSTANCE={other} mleng drill stop"):
        drill_cli.stop()
    assert state_file().is_file()          # kept for the stop on the right instance
    state_file().unlink()


def test_a_local_drill_starts_grades_and_stops_leaving_nothing(home):
    started = mleng_drill("start", "pm-watchdog-missing-rank", "--json", home=home)
    assert started.returncode == 0, started.stderr
    context = json.loads(started.stdout)
    log = home / "drill" / "work" / "torchrun_nccl_watchdog_8ranks.log"
    assert str(log) in context["message"] and log.is_file()
    for path in (home / "drill", log, state_file()):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & 0o077 == 0, f"{path} is {oct(mode)}: drill files are private"
    again = mleng_drill("start", "pm-clean-log", home=home)
    assert again.returncode == 2 and "still set up" in again.stderr
    graded = mleng_drill("grade", "pm-watchdog-missing-rank", "--diagnosis", "-", "--json", home=home,
                         stdin='{"culprit_kind": "rank", "culprit": ["7"], "drain": []}')
    assert json.loads(graded.stdout)["score"] == 1
    for _ in range(2):                                     # idempotent
        stopped = mleng_drill("stop", home=home)
        assert stopped.returncode == 0, stopped.stderr
    assert sorted(p.name for p in (home / "drill").iterdir()) == []


def test_a_start_that_fails_half_way_is_cleaned_up(home, monkeypatch):
    from tools.evals.drills import faults

    scenario = load_scenario("pm-crash-first-rank")
    bad = scenario.model_copy(update={"fault": [*scenario.fault, scenario.fault[0]]})
    calls = []

    def apply(fault, state, sc):
        calls.append(fault.kind)
        if len(calls) == 2:
            raise RuntimeError("injector broke")
        return real_apply(fault, state, sc)

    real_apply = faults.apply
    monkeypatch.setattr(drill_cli, "load_scenario", lambda _id: bad)
    monkeypatch.setattr(drill_cli, "apply", apply)
    with pytest.raises(faults.DrillError, match="injector broke.*cleaned up"):
        drill_cli.start("pm-crash-first-rank", wait_s=1)
    assert DrillState.load() is None
    assert not (home / "drill" / "work").exists()


def test_unknown_scenarios_and_gpu_scenarios_without_a_gpu_are_refused(home):
    unknown = mleng_drill("start", "no-such-drill", home=home)
    assert unknown.returncode == 2 and "no scenario 'no-such-drill'" in unknown.stderr
    hostile = mleng_drill("start", "../etc/passwd", home=home)
    assert hostile.returncode == 2 and "not a scenario name" in hostile.stderr
    if not subprocess.run(["sh", "-c", "command -v nvidia-smi"], capture_output=True).returncode == 0:
        gpu = mleng_drill("start", "gpu-cotenant", home=home)
        assert gpu.returncode == 2 and "needs an NVIDIA GPU" in gpu.stderr
        assert DrillState.load() is None


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # inspect's retry helper uses an old tenacity argument
def test_the_inspect_drill_task_runs_tools_for_real_and_grades_offline(tmp_path, home):
    """A mock model that calls log_triage on the path in the message, then answers from its result."""
    pytest.importorskip("inspect_ai")
    import re

    from inspect_ai import eval as inspect_eval
    from inspect_ai.model import ModelOutput, ModelUsage, get_model

    from tools.evals.drill_task import fault_drills

    seen = {}

    def choose(messages, tools, tool_choice, config):
        last = messages[-1]
        if last.role == "user":
            seen["message"] = last.text
            path = re.search(r"(/\S+\.log)", last.text).group(1)
            out = ModelOutput.for_tool_call("mockllm/model", "log_triage", {"paths": [path]})
        else:
            seen["tool_result"] = last.text
            rank = re.search(r"First failure: .*? on rank (\d+)", last.text).group(1)
            out = ModelOutput.from_content("mockllm/model", "The first failure is on rank %s.\n"
                                           '{"culprit_kind": "rank", "culprit": ["%s"], "drain": []}' % (rank, rank))
        out.usage = ModelUsage(input_tokens=100, output_tokens=10, total_tokens=110)
        return out

    log = inspect_eval(fault_drills(scenarios="pm-crash-first-rank"), model=get_model("mockllm/model", custom_outputs=choose),
                       log_dir=str(tmp_path / "logs"), display="none", max_samples=1)[0]
    assert log.status == "success", log.error
    assert str(home / "drill" / "work" / "gloo_crash.log") in seen["message"]
    assert "ValueError" in seen["tool_result"]                      # the tool really ran on the drill's file
    metrics = {name: m.value for name, m in log.results.scores[0].metrics.items()}
    assert metrics == pytest.approx({"culprit_accuracy": 1.0, "exact": 1.0, "false_drain_rate": 0.0, "tool_calls": 1.0})
    assert DrillState.load() is None and not (home / "drill" / "work").exists()   # cleanup ran


@pytest.mark.slow
def test_the_baseline_agent_solves_every_local_ci_drill(home):
    """End to end through the real server: routing, the tools, reading their answers, grading, stop."""
    from tools.evals.drills.baseline import run_scenario

    local = [s for s in all_scenarios() if s.ci and s.place == "local"]
    assert len(local) >= 8
    attempts = [run_scenario(s.id) for s in local]
    failed = {a.scenario: (a.reason, [c.tool for c in a.calls]) for a in attempts if a.score != 1.0}
    assert not failed, failed
    assert all(len(a.calls) <= 3 for a in attempts), {a.scenario: len(a.calls) for a in attempts}
    assert DrillState.load() is None


@pytest.mark.slurm
def test_cluster_faults_are_injected_and_stop_takes_every_one_out(home, monkeypatch, multinode_cluster):  # noqa: F811
    """On the namespace cluster lent by the test session (it holds the lock): a rate limit, a CPU quota and a
    killed slurmd go in, and `stop` leaves no qdisc, no quota, no dead daemon and no drill state."""
    from tests.multinode_cluster import CLUSTER_DIR

    cluster = multinode_cluster
    monkeypatch.setenv("MLN_CLUSTER_SESSION", "held")         # the session's lock lends its cluster to the drill
    scenario = load_scenario("cl-slow-node")
    many = scenario.model_copy(update={"fault": [*scenario.fault,
                                                 *load_scenario("cl-cpu-starved").fault,
                                                 *[f for f in load_scenario("cl-busy-neighbour").fault
                                                   if f.kind == "cpu_hog"],
                                                 *load_scenario("cl-dead-slurmd").fault]})
    monkeypatch.setattr(drill_cli, "load_scenario", lambda _id: many)
    drill_cli.start("cl-slow-node", wait_s=1)
    try:
        assert "tbf" in cluster.on_node("mln3", "tc", "qdisc", "show", "dev", "eth0").stdout
        quota = (cluster.cgroups / "mln4" / "cpu.cfs_quota_us").read_text().strip()
        assert quota == "20000"
        hog = DrillState.load().steps[-2].pid.pid                 # cl-busy-neighbour's loops on mln2
        nobody = f"Uid:\t{pwd.getpwnam('nobody').pw_uid}\t"
        loops = {p for p in _pids_in(cluster.cgroups / "mln2")
                 if nobody in Path(f"/proc/{p}/status").read_text()}
        assert hog in loops and len(loops) == 3                  # the leader and its 2 loops, as user nobody
        assert os.stat(f"/proc/{hog}/ns/net").st_ino == os.stat(f"/run/netns/{cluster.netns('mln2')}").st_ino
        assert DrillState.load().steps[-1].fault.kind == "kill_slurmd"
    finally:
        assert drill_cli.stop() == []
    assert not {p for p in loops if _alive(p)}
    assert "tbf" not in cluster.on_node("mln3", "tc", "qdisc", "show", "dev", "eth0").stdout
    assert (cluster.cgroups / "mln4" / "cpu.cfs_quota_us").read_text().strip() == "-1"
    assert os.path.exists(f"/proc/{cluster.slurmd_pid('mln2')}")  # healed: a new slurmd answers
    assert DrillState.load() is None and Path(CLUSTER_DIR).is_dir()  # the lent cluster keeps running


def _pids_in(cgroup: Path) -> set[int]:
    return {int(x) for x in (cgroup / "cgroup.procs").read_text().split()}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _alive(pid: int) -> bool:
    """Running, not a zombie (the leader is our child here, and nobody reaps it while the test runs)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone(pids: set[int], timeout_s: float = 10) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture
def hog_place():
    """A cpu cgroup (v1) and a network namespace of our own, as cluster-local.sh gives each node; removed after."""
    if os.geteuid() != 0 or not Path("/sys/fs/cgroup/cpu/cgroup.procs").is_file() or not shutil.which("ip"):
        pytest.skip("needs root, the cgroup v1 cpu controller and iproute2 (as the namespace cluster does)")
    name = f"mleng-test-hog-{secrets.token_hex(4)}"
    cgroup = Path("/sys/fs/cgroup/cpu") / name
    cgroup.mkdir()
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield cgroup, Path("/run/netns") / name
    finally:
        for pid in _pids_in(cgroup):
            os.kill(pid, signal.SIGKILL)
        _gone(_pids_in(cgroup))
        cgroup.rmdir()
        subprocess.run(["ip", "netns", "del", name], check=True)


def test_a_cpu_hog_is_another_users_busy_loops_on_the_node_and_undo_ends_them(home, hog_place):
    """The CPU-contention drill's co-tenant: busy loops owned by another user in the node's cgroup and network
    namespace, no quota; `stop` (undo) ends every loop, and a leader killed alone takes its loops with it."""
    from tools.evals.drills.faults import start_cpu_hog, undo
    from tools.evals.drills.scenarios import CpuHog
    from tools.evals.drills.state import Step, work_dir

    cgroup, netns = hog_place
    stamps = []
    start_cpu_hog(cgroup / "tasks", netns, 2, "nobody", record=stamps.append)
    leader = stamps[0].pid
    pids = _pids_in(cgroup)
    loops = pids - {leader}
    assert leader in pids and len(loops) == 2
    for pid in pids:
        assert f"Uid:\t{pwd.getpwnam('nobody').pw_uid}\t" in Path(f"/proc/{pid}/status").read_text()
        assert os.stat(f"/proc/{pid}/ns/net").st_ino == os.stat(netns).st_ino
    assert (cgroup / "cpu.cfs_quota_us").read_text().strip() == "-1"      # contention, not a cap
    deadline = time.monotonic() + 10
    while min(_cpu_s(p) for p in loops) < 0.2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert min(_cpu_s(p) for p in loops) >= 0.2, "the loops do not run"
    state = DrillState(scenario="cl-busy-neighbour", work_dir=str(work_dir()))
    assert undo(Step(fault=CpuHog(kind="cpu_hog", node="mln2"), pid=stamps[0]), state) == []
    assert _gone(pids) and not {p for p in _pids_in(cgroup) if _alive(p)}

    stamps.clear()
    start_cpu_hog(cgroup / "tasks", netns, 1, "nobody", record=stamps.append)
    pids = _pids_in(cgroup)
    os.kill(stamps[0].pid, signal.SIGKILL)            # the leader alone (a drill stopped half way)
    assert _gone(pids), "a loop outlived its leader"


def test_the_small_stragglers_stall_follows_its_own_step_time():
    """cl-small-straggler: the slow rank sleeps a fraction of its recent step time (its sleep not counted), so it
    stays ~15% slower when the shared host's load moves the step; what a short sleep overruns is paid back."""
    import argparse
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("straggler_workload", REPO / "bench" / "straggler_workload.py")
    workload = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workload)
    small = workload.LoaderStall(3, argparse.Namespace(slow_loader_rank=3, loader_sleep_s=0.2, loader_sleep_fraction=0.15))
    for _ in range(4):
        small.step_done(0.010)
    assert small.per_step_s() == 0.0                                  # too few steps to know the pace yet
    small.step_done(0.010)
    assert small.per_step_s() == pytest.approx(0.0015)                 # 15% of a 10 ms step
    t0, slept, owed_in_all_s, last_overrun_s = time.perf_counter(), 0.0, 0.0, 0.0
    tiny = argparse.Namespace(dim=4)
    for step in range(200):                                            # ~1.5 ms owed a step: sleeps of >= 2 ms
        t1, owed_before_s, owed_now_s = time.perf_counter(), small.owed_s, small.per_step_s()
        owed_in_all_s += owed_now_s
        workload.load_batch(step, 3, small, tiny, torch)
        if small.slept_s:
            last_overrun_s = small.slept_s - (owed_before_s + owed_now_s)  # what this sleep lasted past its due
        slept += small.slept_s
        small.step_done(0.010 + time.perf_counter() - t1)              # the step's time, its sleep included
    # Overruns paid back: all slept is all owed (~200 x 1.5 ms: the step times include the loader's own work) less
    # the debt still open, and that debt is under one threshold, or minus the last sleep's own overrun (no step
    # came after it to pay it back). A loaded host stretches that one sleep (0.3045 s slept in all once, at load
    # ~10): it is the bound, not a fixed 3 ms.
    assert owed_in_all_s == pytest.approx(0.300, rel=0.10)
    assert slept == pytest.approx(owed_in_all_s - small.owed_s, abs=1e-9)
    assert -last_overrun_s - 1e-9 <= small.owed_s < workload.LoaderStall.MIN_SLEEP_S
    assert time.perf_counter() - t0 < 1.0
    for _ in range(20):
        small.step_done(0.020)                                         # the host got busier: 20 ms steps
    assert small.per_step_s() == pytest.approx(0.003)
    assert workload.LoaderStall(2, argparse.Namespace(slow_loader_rank=3, loader_sleep_s=0.2,
                                                      loader_sleep_fraction=0.15)).per_step_s() == 0.0
    fixed = workload.LoaderStall(2, argparse.Namespace(slow_loader_rank=2, loader_sleep_s=0.5, loader_sleep_fraction=0.0))
    assert fixed.per_step_s() == 0.5
    job = load_scenario("cl-small-straggler").fault[0]
    assert (job.slow_rank, job.loader_sleep_fraction) == (3, 0.15)


def test_the_baseline_follows_a_job_handle_to_the_answer(home, monkeypatch):
    """A run longer than the call's wait answers with a job handle (the cluster drills' pairwise runs do): the
    agent follows it with job_status instead of reading the handle as an answer that settles nothing."""
    from tools.evals.drills import baseline

    real = baseline.params_for
    monkeypatch.setattr(baseline, "params_for", lambda *a: {**real(*a), "wait_s": 0} if real(*a) is not None else None)
    monkeypatch.setattr(baseline, "FOLLOW_EVERY_S", 0.2)
    attempt = baseline.run_scenario("pm-crash-first-rank")
    assert attempt.score == 1, (attempt.reason, attempt.calls)
    assert [c.tool for c in attempt.calls] == ["log_triage"] and attempt.calls[0].polls >= 1


def test_the_baseline_repeats_an_inconclusive_call_once_and_then_says_inconclusive(home, monkeypatch):
    """The rule of evals/README.md: "inconclusive" is answered by the same call once more (whose answer then
    counts); a second "inconclusive" is the diagnosis (with both answers' evidence), and a later "nothing wrong" from another
    check does not clear it."""
    from tools.evals.drills import baseline

    real, seen = baseline.read_answer, []

    def noisy_first(tool, answer, context):          # the first answer is too noisy to judge
        seen.append(tool)
        if len(seen) == 1:
            return baseline.Diagnosis(culprit_kind="inconclusive", evidence="spread 40%")
        return real(tool, answer, context)

    monkeypatch.setattr(baseline, "read_answer", noisy_first)
    settled = baseline.run_scenario("pm-crash-first-rank")
    assert (settled.score, [c.tool for c in settled.calls]) == (1, ["log_triage", "log_triage"])
    seen.clear()
    cleared = baseline.run_scenario("pm-clean-log")          # the repeat's "nothing wrong" is the answer
    assert (cleared.score, [c.tool for c in cleared.calls]) == (1, ["log_triage", "log_triage"])

    monkeypatch.setattr(baseline, "read_answer", lambda tool, answer, context: baseline.Diagnosis(
        culprit_kind="inconclusive" if tool == "log_triage" else "none", evidence=f"{tool} spread 40%"))
    unsettled = baseline.run_scenario("pm-clean-log")
    tools = [c.tool for c in unsettled.calls]
    assert tools[:2] == ["log_triage", "log_triage"] and unsettled.diagnosis["culprit_kind"] == "inconclusive"
    assert unsettled.score == 0.5 and "log_triage spread 40%" in unsettled.diagnosis["evidence"]


@pytest.mark.parametrize("change, kind", [
    ({}, "none"),                                                                   # re-run cleared the outlier
    ({"busy": [{"node": "mln1", "check": "cpu_probe"}]}, "inconclusive"),          # a node not judged
    ({"outliers": [{"node": "mln1", "status": "unconfirmed"}]}, "inconclusive"),   # a suspect never re-run
    ({"medians": [{"figure": "cpu_probe.matmul_gflops", "inconclusive": True}]}, "inconclusive"),
])
def test_the_baseline_reads_a_fleet_sweep_warning_that_clears_every_node_as_none(change, kind):
    """As seen on cl-healthy-which-node: 'warn' only because an outlier's re-run came back within the rule."""
    from tools.evals.drills.baseline import read_answer

    answer = {"verdict": "warn", "rows": [{"node": f"mln{k}"} for k in range(1, 5)], "busy": [], "drain": [],
              "outliers": [{"node": "mln1", "status": "not repeated"}], "medians": [{"inconclusive": False}],
              **change}
    assert read_answer("fleet_sweep", answer, {}).culprit_kind == kind


def test_a_culprit_named_by_an_alias_the_log_itself_gives_is_the_culprit():
    """pm-t-ib-port-culprit: the log's prefix shortens the host to '...-48', its peer field spells 'node48'. A real
    model named and drained node48 (right) and scored 0 for a false drain before the truth listed the alias."""
    from tools.evals.drills.scenarios import load_scenario

    scenario = load_scenario("pm-t-ib-port-culprit")
    right = grade(scenario, Diagnosis(culprit_kind="node", culprit=["node48"], drain=["node48"],
                                      action="drain node48, then check its HCA port"))
    assert (right.score, right.false_drain) == (1.0, [])
    wrong = grade(scenario, Diagnosis(culprit_kind="node", culprit=["node51"], drain=["node51"]))
    assert wrong.score == 0 and wrong.false_drain == ["node51"]


def test_the_baseline_reads_a_slow_node_and_a_slow_link_from_one_pairwise_answer():
    from tools.evals.drills.baseline import read_answer

    answer = {"verdict": "fail", "isolation": {"suspects": [
        {"kind": "link", "nodes": ["mln1", "mln2"], "evidence": "slow twice"},
        {"kind": "node", "nodes": ["mln4"], "evidence": "slow with 3 of 3 partners"}]}}
    read = read_answer("collective_bench", answer, {})
    assert (read.culprit_kind, read.culprit, read.drain) == ("node", ["mln4"], ["mln4"])
    assert [(a.culprit_kind, a.culprit) for a in read.also] == [("link", ["mln1-mln2"])]
    assert grade(load_scenario("cl-link-and-starved-node"), read).score == 1
    assert grade(load_scenario("cl-slow-node"), read_answer("collective_bench", {"verdict": "fail", "isolation": {
        "suspects": [{"kind": "node", "nodes": ["mln3"]}]}}, {})).score == 1


def test_nodes_fleet_sweep_judged_alone_are_measured_in_pairs_before_the_answer():
    """cl-link-and-starved-node (2026-12-02 16:09): fleet_sweep drained mln4 (its own CPU quota) and the baseline
    answered with that alone, 0.5: fleet_sweep judges each node on its own and cannot see the slow mln1-mln2 link.
    Its answer points on to collective_bench; pairwise's nodes and links are added to the drained node."""
    from tools.evals.drills.baseline import nodes_judged_alone, read_answer, with_pairs

    sweep = {"verdict": "fail", "drain": [{"node": "mln4", "reasons": ["cpu_probe failed"]}],
             "next": ["results_history", "gpu_health", "collective_bench"]}
    alone = read_answer("fleet_sweep", sweep, {})
    assert nodes_judged_alone("fleet_sweep", sweep, alone)
    assert not nodes_judged_alone("fleet_sweep", {**sweep, "not_answering": [{"node": "mln2"}]}, alone)  # a dead node
    assert not nodes_judged_alone("fleet_sweep", {**sweep, "next": []}, alone)
    pairs = read_answer("collective_bench", {"verdict": "fail", "isolation": {"suspects": [
        {"kind": "link", "nodes": ["mln1", "mln2"], "evidence": "slow twice"},
        {"kind": "node", "nodes": ["mln4"], "evidence": "slow with 3 of 3 partners"}]}}, {})
    both = with_pairs(alone, pairs)
    scenario = load_scenario("cl-link-and-starved-node")
    assert grade(scenario, alone).score == 0.5 and grade(scenario, both).score == 1
    assert (both.culprit, both.drain) == (["mln4"], ["mln4"])
    assert with_pairs(alone, Diagnosis(culprit_kind="inconclusive")) is alone
    assert with_pairs(alone, None) is alone
    # cl-slow-link (16:26): fleet_sweep "ok" on quiet nodes was read as "none"; pairwise names the link.
    clean = {"verdict": "ok", "rows": [{"node": "mln1"}], "next": ["collective_bench"]}
    none = read_answer("fleet_sweep", clean, {})
    assert none.culprit_kind == "none" and nodes_judged_alone("fleet_sweep", clean, none)
    link = read_answer("collective_bench", {"verdict": "fail", "isolation": {"suspects": [
        {"kind": "link", "nodes": ["mln1", "mln2"], "evidence": "slow twice"}]}}, {})
    assert grade(load_scenario("cl-slow-link"), with_pairs(none, link)).score == 1
    assert with_pairs(none, read_answer("collective_bench", {"verdict": "ok", "isolation": {"suspects": []}}, {})) is none


def test_the_readme_counts_the_scenarios_there_are():
    # The first-run review found the counts in evals/README.md stale (issue 37): they are checked against the loader.
    import re
    from pathlib import Path

    from tools.evals.drills.scenarios import all_scenarios

    text = (Path(__file__).resolve().parent.parent / "evals" / "README.md").read_text()
    said = re.search(r"(\d+) scenarios: post-mortem.*?and (\d+) \"nothing is wrong\" controls", text, re.S)
    scenarios = all_scenarios()
    assert said, "evals/README.md no longer says how many scenarios and controls there are"
    assert (int(said.group(1)), int(said.group(2))) == (len(scenarios), sum(s.truth.kind == "none" for s in scenarios))
