"""fleet_sweep's pure parts: the one rule applied across nodes (busy, groups, expected gates, re-runs,
inconclusive), drift, missing nodes, drain list, event and srun parsing, and the aggregation at 1024
and 4096 nodes (time and memory per node)."""

from __future__ import annotations

import shlex
import time
import tracemalloc

import pytest

from tools.fleet_sweep.aggregate import MIN_PEERS, aggregate, drain_command, unanswered, version_drift
from tools.fleet_sweep.node import check_event
from tools.fleet_sweep.report import findings_for
from tools.shared.sidechannel import PREFIX, Reader
from tools.engine.srun import launch_failures
from tools.shared.slurm import unreachable_reason


def cpu_row(node: str, gflops: float, busy: str = "", **versions) -> dict:
    return {"node": node, "check": "cpu_probe", "verdict": "info", "versions": versions,
            "busy": {"busy": bool(busy), "why": busy, "holders": [{"pid": 42, "name": "hog", "user": "bob"}] if busy else []},
            "figures": [{"name": "matmul_gflops", "value": gflops, "unit": "GFLOP/s", "better": "higher", "gpu": None,
                         "expected": None, "group": "Xeon x2"}]}


def gpu_row(node: str, values: list[float], expected: float | None = None, model: str = "NVIDIA H200",
            busy: str = "") -> dict:
    return {"node": node, "check": "matmul_bench", "verdict": "ok", "busy": {"busy": bool(busy), "why": busy, "holders": []},
            "figures": [{"name": "mamf_tflops", "value": v, "unit": "TFLOPS", "better": "higher", "gpu": i,
                         "expected": expected, "group": model} for i, v in enumerate(values)]}


def planned(rows):
    out = {}
    for r in rows:
        out.setdefault(r["node"], []).append(r["check"])
    return out


def test_a_node_below_the_median_is_a_suspect_and_drained_only_when_its_rerun_repeats():
    rows = [cpu_row(f"n{i}", 90.0 + i) for i in range(7)] + [cpu_row("n7", 40.0)]
    nodes = [r["node"] for r in rows]
    first = aggregate(rows, nodes, planned(rows), {})
    assert [(o["node"], o["against"], o["status"]) for o in first["outliers"]] == [("n7", "fleet median", "unconfirmed")]
    assert first["outliers"][0]["worse_by_pct"] == pytest.approx(100 * (1 - 40 / 92.5), abs=0.1)  # median of 40, 90..96
    assert first["outliers"][0]["threshold_pct"] == 15.0   # matmul_gflops' margin in verdict_rules.toml
    assert first["drain"] == []                             # not re-run: not drained
    confirmed = aggregate(rows, nodes, planned(rows), {}, confirm_rows=[cpu_row("n7", 45.0)])
    assert [d["node"] for d in confirmed["drain"]] == ["n7"] and confirmed["outliers"][0]["confirm_value"] == 45.0
    assert "re-run: 45 GFLOP/s" in confirmed["drain"][0]["reasons"][0]
    flaky = aggregate(rows, nodes, planned(rows), {}, confirm_rows=[cpu_row("n7", 91.0)])
    assert flaky["outliers"][0]["status"] == "not repeated" and flaky["drain"] == []
    busy_rerun = aggregate(rows, nodes, planned(rows), {}, confirm_rows=[cpu_row("n7", 30.0, busy="2 of 2 cores used")])
    assert busy_rerun["outliers"][0]["status"] == "unconfirmed" and busy_rerun["drain"] == []


def test_within_the_threshold_is_not_an_outlier_and_two_nodes_have_no_median_verdict():
    rows = [cpu_row("a", 100.0), cpu_row("b", 100.0), cpu_row("c", 88.0)]
    assert aggregate(rows, ["a", "b", "c"], planned(rows), {})["outliers"] == []       # 12% < max(15%, 3 x 5%)
    assert aggregate(rows, ["a", "b", "c"], planned(rows), {}, margin_pct=25)["outliers"] == []
    rows[2] = cpu_row("c", 80.0)
    assert aggregate(rows, ["a", "b", "c"], planned(rows), {})["outliers"][0]["node"] == "c"
    assert aggregate(rows, ["a", "b", "c"], planned(rows), {}, margin_pct=25)["outliers"] == []
    two = [cpu_row("a", 100.0), cpu_row("b", 10.0)]
    assert MIN_PEERS == 3 and aggregate(two, ["a", "b"], planned(two), {})["outliers"] == []


def test_a_gpu_below_its_expected_figure_is_named_even_alone():
    rows = [gpu_row("g1", [740.0, 660.0], expected=745.0)]
    agg = aggregate(rows, ["g1"], planned(rows), {})
    assert [(o["node"], o["gpu"], o["against"]) for o in agg["outliers"]] == [("g1", 1, "expected")]


def test_busy_figures_are_reported_not_judged_and_never_drained():
    # the H200 case of issue 24: one GPU shared with another process reads 57% low
    rows = [gpu_row(f"g{i}", [800.0 + i]) for i in range(4)] + [gpu_row("g4", [338.0], busy="GPU 0 99% utilised")]
    agg = aggregate(rows, [r["node"] for r in rows], planned(rows), {}, confirm_rows=rows)
    assert agg["outliers"] == [] and agg["drain"] == []
    assert [r["node"] for r in agg["busy"]] == ["g4"]
    stats = agg["stats"][("matmul_bench.mamf_tflops", "NVIDIA H200")]
    assert stats["count"] == 4 and stats["busy_excluded"] == 1 and stats["median"] == pytest.approx(801.5)
    failed_busy = {**gpu_row("g5", [300.0], busy="GPU 0 99% utilised"), "verdict": "fail", "problems": ["slow"]}
    agg = aggregate(rows + [failed_busy], [], planned(rows), {})
    assert agg["failed"] == [] and agg["drain"] == []


def test_a_uniformly_degraded_fleet_is_one_finding_not_every_node():
    rows = [gpu_row(f"g{i}", [680.0 + i, 681.0], expected=745.0) for i in range(6)]   # every GPU ~9% below 745
    agg = aggregate(rows, [r["node"] for r in rows], planned(rows), {}, confirm_rows=rows)
    assert [(g["figure"], g["group"]) for g in agg["fleet_below_expected"]] == [("matmul_bench.mamf_tflops", "NVIDIA H200")]
    assert agg["fleet_below_expected"][0]["worse_by_pct"] == pytest.approx(100 * (1 - 681.0 / 745), abs=0.2)
    assert agg["outliers"] == [] and agg["drain"] == []
    healthy = [gpu_row(f"g{i}", [740.0 + i, 741.0], expected=745.0) for i in range(6)]
    assert aggregate(healthy, [], planned(healthy), {})["fleet_below_expected"] == []


def test_mixed_fleet_is_compared_within_each_gpu_model():
    rows = [gpu_row(f"h{i}", [800.0 + i] * 2, model="NVIDIA H200") for i in range(4)]
    rows += [gpu_row(f"a{i}", [270.0 + i] * 2, model="NVIDIA A100") for i in range(4)]
    agg = aggregate(rows, [r["node"] for r in rows], planned(rows), {}, confirm_rows=rows)
    assert agg["outliers"] == [] and agg["drain"] == []   # one median over both would make every A100 an outlier
    assert {g for _, g in agg["stats"]} == {"NVIDIA H200", "NVIDIA A100"}
    slow = rows + [gpu_row("a9", [200.0, 271.0], model="NVIDIA A100")]
    agg = aggregate(slow, [], planned(slow), {}, confirm_rows=slow)
    assert [(o["node"], o["gpu"], o["group"]) for o in agg["outliers"]] == [("a9", 0, "NVIDIA A100")]


def test_healthy_figures_spread_too_widely_are_inconclusive_with_no_culprit():
    values = [100, 60, 140, 75, 125, 90, 110, 40]
    rows = [cpu_row(f"n{i}", v) for i, v in enumerate(values)]
    agg = aggregate(rows, [r["node"] for r in rows], planned(rows), {}, confirm_rows=rows)
    stats = agg["stats"][("cpu_probe.matmul_gflops", "Xeon x2")]
    assert stats["inconclusive"] and stats["spread"] > 0.2
    assert agg["outliers"] == [] and agg["drain"] == []


def limited(row: dict, share: float) -> dict:
    return {**row, "own_cpu_limit_bound": share,
            "problems": [f"this node's own CPU limit (cgroup quota) bound in {share:.0%} of scheduler periods while it measured"]}


def test_a_node_throttled_by_its_own_quota_is_drained_even_when_the_figures_are_inconclusive():
    """Namespace cluster under load: healthy probes 48-74 GFLOP/s (spread 29%: inconclusive), mln3 at 16 with
    its own 20% quota binding in 100% of periods. The kernel's counters name it where the median cannot."""
    rows = [cpu_row("mln1", 48.5), cpu_row("mln2", 74.0), limited(cpu_row("mln3", 16.1), 1.0), cpu_row("mln4", 60.5)]
    agg = aggregate(rows, [r["node"] for r in rows], planned(rows), {}, confirm_rows=rows)
    assert agg["stats"][("cpu_probe.matmul_gflops", "Xeon x2")]["inconclusive"]
    assert [d["node"] for d in agg["drain"]] == ["mln3"]
    assert "own CPU limit (cgroup quota) bound in 100%" in agg["drain"][0]["reasons"][0]
    # a quota that hardly bound is stated on the row, not a drain reason
    rows[2] = limited(cpu_row("mln3", 16.1), 0.12)
    assert aggregate(rows, [r["node"] for r in rows], planned(rows), {}, confirm_rows=rows)["drain"] == []


def test_a_quota_on_most_nodes_is_the_fleets_configuration_not_a_culprit():
    rows = [limited(cpu_row(f"n{i}", 50.0 + i), 0.9) for i in range(3)] + [cpu_row("n3", 52.0)]
    agg = aggregate(rows, [r["node"] for r in rows], planned(rows), {}, confirm_rows=rows)
    assert agg["drain"] == [] and agg["cpu_limited_fleet"] == ["n0", "n1", "n2"]


def test_a_failed_check_without_problems_still_says_why():
    from tools.fleet_sweep.checks import run_check

    def silent():
        return {"tool": "x", "params": {}, "result": {"verdict": "fail"}, "problems": []}

    def raises():
        raise RuntimeError()

    assert "without saying why" in run_check("memory_bandwidth_bench", silent)["problems"][0]
    assert run_check("matmul_bench", raises)["problems"] == ["RuntimeError (no message)"]


def test_version_drift_names_the_odd_node_and_unset_variables():
    drift = version_drift({"a": {"nccl": "2.21.5", "NCCL_IB_HCA": "mlx5"}, "b": {"nccl": "2.21.5", "NCCL_IB_HCA": "mlx5"},
                           "c": {"nccl": "2.20.3"}})
    by_field = {d["field"]: d for d in drift}
    assert by_field["nccl"]["odd_nodes"] == ["c"] and by_field["nccl"]["values"]["2.20.3"] == ["c"]
    assert by_field["NCCL_IB_HCA"]["values"]["(unset)"] == ["c"]
    assert version_drift({"a": {"torch": "2.13"}, "b": {"torch": "2.13"}}) == []


def test_unanswered_nodes_partial_answers_and_known_reasons():
    rows = [cpu_row("a", 1.0), {**cpu_row("b", 1.0)}]
    plan = {"a": ["cpu_probe"], "b": ["cpu_probe", "env_report"]}
    missing = unanswered(rows, ["a", "b", "c", "d"], plan, {"d": "srun could not start its task: refused"})
    assert "a" not in missing
    assert missing["b"].startswith("answered 1 of 2 checks") and "env_report" in missing["b"]
    assert missing["c"] == "no answer within the deadline"
    assert missing["d"] == "srun could not start its task: refused"


def test_drain_command_is_one_quoted_scontrol_line_never_run():
    cmd = drain_command("mln2", "did not answer: no answer within the deadline")
    assert shlex.split(cmd) == ["scontrol", "update", "nodename=mln2", "state=drain",
                                "reason=fleet_sweep: did not answer: no answer within the deadline"]


def test_events_parse_from_labelled_srun_output_and_garbage_is_skipped():
    reader = Reader(check_event, labelled=True)
    event = reader.parse("3: " + PREFIX + '{"kind": "done", "node": "n1"}')
    assert (event.task, event.data) == (3, {"kind": "done", "node": "n1"})
    assert reader.parse("plain output") is None and reader.parse("0: plain output") is None
    assert reader.parse("0: " + PREFIX + "{not json") is None
    assert reader.parse("0: " + PREFIX + '["kind"]') is None
    assert reader.parse(PREFIX + '{"kind": "done", "node": "n1"}') is None   # no label: no task, no node
    assert sum(reader.skipped.values()) == 3


def test_launch_failures_come_from_srun_stderr():
    # As srun 22.05.8 printed it on the namespace cluster after mln2's slurmd was killed.
    stderr = ("srun: error: Task launch for StepId=1.0 failed on node mln2: Communication connection failure\n"
              "srun: error: Application launch failed: Communication connection failure\nsrun: Job step aborted\n")
    assert launch_failures(stderr) == {"mln2": "Communication connection failure"}


@pytest.mark.parametrize("state,reachable", [("idle", True), ("mixed", True), ("allocated", True),
                                              ("down*", False), ("idle*", False), ("drained", False),
                                              ("draining", False), ("down", False)])
def test_slurm_states_that_cannot_take_a_task(state, reachable):
    assert (unreachable_reason(state) is None) == reachable


def fleet(n_nodes: int, bad: str) -> list[dict]:
    rows = []
    for i in range(n_nodes):
        node = f"gpu-{i:05d}"
        rows.append(gpu_row(node, [720.0 + (i % 7)] * 7 + [400.0 if node == bad else 721.0], expected=745.0))
        rows.append(cpu_row(node, 90.0 + i % 5, nccl="2.21.5" if node != bad else "2.20.3"))
    return rows


@pytest.mark.parametrize("n_nodes", [1024, 4096])
def test_aggregation_at_scale_names_the_one_bad_gpu(n_nodes):
    bad = f"gpu-{n_nodes // 3:05d}"
    rows = fleet(n_nodes, bad)
    nodes = [f"gpu-{i:05d}" for i in range(n_nodes)]
    t0 = time.perf_counter()
    agg = aggregate(rows, nodes, planned(rows), {}, confirm_rows=rows)
    elapsed = time.perf_counter() - t0
    assert [(o["node"], o["gpu"]) for o in agg["outliers"] if o["against"] == "fleet median"] == [(bad, 7)]
    assert [d["node"] for d in agg["drain"]] == [bad]
    assert agg["drift"][0]["odd_nodes"] == [bad] and not agg["missing"]
    assert elapsed < 0.003 * n_nodes  # linear: ~ms per node at most, even on a loaded 2-core machine


def test_aggregation_memory_per_node_stays_constant():
    per_node = {}
    for n in (1024, 4096):
        rows = fleet(n, "gpu-00001")
        nodes = [f"gpu-{i:05d}" for i in range(n)]
        tracemalloc.start()
        aggregate(rows, nodes, planned(rows), {})
        per_node[n] = tracemalloc.get_traced_memory()[1] / n
        tracemalloc.stop()
    assert per_node[4096] < 1.5 * per_node[1024], per_node


def test_long_events_go_out_in_parts_and_come_back_whole_even_interleaved():
    from tools.shared.sidechannel import encode

    big = {"kind": "row", "node": "n1", "check": "env_report", "verdict": "ok",
           "result": {"env": {f"K{i}": "v" * 50 for i in range(200)}}}
    other = {"kind": "row", "node": "n2", "check": "env_report", "verdict": "ok", "result": {"x": "y" * 3000}}
    lines = [f"0: {line.decode().rstrip()}" for line in encode(big)] + [f"1: {line.decode().rstrip()}" for line in encode(other)]
    assert len(lines) > 10 and all(len(line) < 1000 for line in lines)  # srun cuts lines at 1 kB
    half = len(lines) // 3
    mixed = lines[half:] + lines[:half]  # parts of the two events interleaved, out of order
    reader = Reader(check_event, labelled=True)
    got = [e for e in map(reader.parse, mixed) if e]
    assert sorted((e.task, e.data["node"], e.data["result"]) for e in got) == [
        (0, "n1", big["result"]), (1, "n2", other["result"])]
    assert not reader.skipped


def test_a_node_check_runs_through_the_runner_and_stops_at_the_sweep_deadline(tmp_path, monkeypatch):
    # Issue 24 item 7: node runs take the GPU locks and deadlines like any call. storage_bench alone
    # spends 2 s on random reads; the node's deadline has passed, so it gets the 1 s floor and is killed.
    import psutil

    from tools.engine.runner import DeadlineExceeded
    from tools.fleet_sweep import checks

    monkeypatch.setattr(checks, "deadline", time.monotonic() - 100)
    # Only what this run started counts: an earlier test in this session may have left a child of its
    # own here by design (multiprocessing's resource tracker, started once per process by an in-process
    # parallel log scan, lives as long as pytest does).
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="storage_bench did not finish within its timeout of 1 s"):
        checks.run_tool("storage_bench", path=str(tmp_path), size_mib=64, small_files=200, time_budget_s=30)
    assert time.monotonic() - t0 < 10
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not left, left
    row = checks.run_check("storage_bench", checks.tool_check("storage_bench", path=str(tmp_path), size_mib=64,
                                                              small_files=200, time_budget_s=30))
    assert row["verdict"] == "fail" and row["problems"][0].startswith("DeadlineExceeded: storage_bench did not")


def test_a_node_check_waits_for_a_gpu_lock_only_until_its_deadline(tmp_path, monkeypatch, mleng_home):
    # Another mleng run holds GPU 0 here: the node's check waits for it (no two benchmarks on one
    # GPU), and gives up with a reason when the node's time is over, instead of hanging to the cut.
    import fcntl
    import socket

    from tools.engine.runner import Cancelled
    from tools.fleet_sweep import checks

    lock_dir = mleng_home / "locks" / socket.gethostname()
    lock_dir.mkdir(parents=True)
    with open(lock_dir / "gpu0.lock", "a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        monkeypatch.setattr(checks, "deadline", time.monotonic() + 2)
        t0 = time.monotonic()
        with pytest.raises(Cancelled, match="memory_bandwidth_bench stopped after 2 s, the time this node had left: "
                                            "cancelled while waiting for a GPU lock"):
            checks.run_tool("memory_bandwidth_bench", device=0)
        assert 2 <= time.monotonic() - t0 < 6


def test_events_are_credited_to_the_node_srun_placed_their_task_on():
    # srun -v --label, as SLURM 22.05.8 printed it on the namespace cluster; the task's output may
    # come before srun's "launching" line reaches us (two pipes), so early lines wait for it. The lines go
    # through the srun transport's crediting and the sweep's per-node readers, as in a real step.
    from tools.engine.srun import SrunLines, labelled, srun_said
    from tools.fleet_sweep.sweep import Collected, Follower, NodeLines, take_ends
    from tools.shared.sidechannel import encode

    def out(task: int, event: dict) -> list[str]:
        return [f"{task}: {line.decode().rstrip()}" for line in encode(event)]

    def row(node: str, check: str = "cpu_probe", **extra) -> dict:
        return {"kind": "row", "node": node, "check": check, "verdict": "info", **extra}

    got, seen = Collected(), []
    nodes = ["mln1", "mln2", "mln4"]
    per_node = NodeLines(Follower(got, nodes, ["env_report", "cpu_probe"], seen.append), nodes)
    lines = SrunLines(nodes, per_node)
    stdout = (out(2, {"kind": "hello", "node": "mln4", "checks": ["cpu_probe"]})           # before srun's word
              + out(0, {"kind": "hello", "node": "mln1", "checks": ["cpu_probe"]})
              + out(2, row("mln2", "gpu_health", problems=["48 ECC errors"]))              # forged for mln2
              + out(2, row("ghost-01"))                                                    # outside the target
              + out(2, row("mln4", provenance={"host": "victim-host"}))
              + out(2, row("mln4"))                                                        # a second copy
              + out(2, row("mln4", "env_report"))                                          # not in its hello
              + out(1, {"kind": "hello", "node": "mln2", "checks": ["cpu_probe", "rm"]})   # not asked for
              + out(0, row("mln1")) + out(0, {"kind": "done", "node": "mln1"}))
    stderr = ["srun: launching StepId=7.0 on host mln1, 1 tasks: 0", "srun: launching StepId=7.0 on host mln2, 1 tasks: 1",
              "srun: launching StepId=7.0 on host mln4, 1 tasks: 2", "srun: error: mln2: task 1: Killed",
              "srun: launch/slurm: _task_finish: mln1: task 0: Completed"]
    for line in stdout[:1] + stderr[:1] + stdout[1:] + stderr[1:]:
        lines.take(srun_said(line) if line.startswith("srun:") else labelled(line))
    lines.unplaced()
    take_ends(got, lines.ends(nodes, finished=True))
    per_node.count_refused(got)
    assert sorted(got.rows) == [("mln1", "cpu_probe"), ("mln4", "cpu_probe")]
    assert got.rows[("mln4", "cpu_probe")]["provenance"]["host"] == "mln4" and len(seen) == 2
    assert got.planned == {"mln1": ["cpu_probe"], "mln4": ["cpu_probe"]} and got.done == {"mln1"}
    assert got.ended == {"mln2": "Killed"} and not got.timed_out and not lines.refused
    assert dict(got.refused) == {
        ("mln4", "the event names another node ('mln2')"): 1, ("mln4", "the event names another node ('ghost-01')"): 1,
        ("mln4", "a second row for cpu_probe"): 1, ("mln4", "a row for a check it did not plan ('env_report')"): 1,
        ("mln2", "checks not asked for: ['rm']"): 1}


def test_a_node_cut_at_the_deadline_or_not_started_is_told_apart_from_one_that_ended():
    from tools.engine.transport import NodeEnd
    from tools.fleet_sweep.sweep import Collected, take_ends

    got = Collected(done={"n4"})
    take_ends(got, {"n1": NodeEnd("n1", "unreachable", why="n1: sshd not answering (Connection refused)"),
                    "n2": NodeEnd("n2", "silent"), "n3": NodeEnd("n3", "exited", -9),
                    "n4": NodeEnd("n4", "exited", 1), "n5": NodeEnd("n5", "exited", None, said="Out Of Memory"),
                    "n6": NodeEnd("n6", "exited", 0, said="Completed")})
    assert got.failed_launch == {"n1": "sshd not answering (Connection refused)"} and got.timed_out
    assert got.ended == {"n3": "Killed", "n5": "Out Of Memory"}   # n4 said it was done before exiting 1


def frozen_slurmd_sweep(relaunched: bool, mln2_fails: bool = False):
    """The issue-35 drill: 4 nodes, mln3's slurmd frozen, deadline_s=60. srun aborted attempt 1 when mln3's
    launch timed out 21 s in; the relaunch on mln1, mln2, mln4 had 39 s and the deadline ended it with
    mln1 at 2 of 3 checks, mln2 at 1, mln4 at none (a loaded 2-core host)."""
    from tools import fleet_sweep as fs
    from tools.fleet_sweep.report import build_result
    from tools.fleet_sweep.sweep import Collected, Relaunch
    from tools.fleet_sweep.targets import Target

    checks = ["env_report", "gpu_health", "cpu_probe"]
    got = Collected(attempts=2 if relaunched else 1, timed_out=True, set_aside=4 if relaunched else 0)
    got.failed_launch = {"mln3": "Socket timed out on send/recv operation"}
    got.relaunch = Relaunch(dict(got.failed_launch), 21.0, 60.0) if relaunched else None
    got.planned = {n: checks for n in ("mln1", "mln2", "mln4")}
    answered = {"mln1": ["env_report", "gpu_health"], "mln2": ["env_report"]}
    for node, done in answered.items():
        for check in done:
            bad = mln2_fails and node == "mln2"
            got.rows[(node, check)] = {"node": node, "check": check, "verdict": "fail" if bad else "info",
                                       "problems": ["GPU 0: 48 uncorrectable ECC errors"] if bad else [],
                                       "started": 0.0, "ended": 1.0}
    params = fs.SPEC.Params(partition="debug", nodes=4, deadline_s=60, plot=False)
    target = Target("partition", ["mln1", "mln2", "mln3", "mln4"], ["--partition=debug", "--time=2"])
    return build_result(params, target, got, {}, 60.4)


def test_after_a_frozen_slurmd_the_relaunch_cut_by_the_deadline_drains_only_the_frozen_node():
    result = frozen_slurmd_sweep(relaunched=True)
    assert [d.node for d in result.drain] == ["mln3"], result.findings
    assert [m.node for m in result.not_answering] == ["mln3"]
    assert "srun could not start its task: Socket timed out" in result.not_answering[0].reason
    why = {m.node: m.reason for m in result.not_judged}
    assert sorted(why) == ["mln1", "mln2", "mln4"], result.findings
    assert why["mln1"].startswith("answered 2 of 3 checks") and why["mln4"].startswith("no answer")
    assert all("mln3 refused its task" in w and "21 s into the 60 s deadline" in w and "left the relaunch 39 s" in w
               and "no check of its own failed" in w for w in why.values()), why
    said = [f for f in result.findings if f.startswith("NOT JUDGED (not drained): 3 node(s)")]
    assert len(said) == 1 and "mln1: answered 2 of 3 checks" in said[0] and "mln4: no answer" in said[0], said
    assert "hosts=['mln1', 'mln2', 'mln4']" in said[0]
    assert result.verdict == "fail" and result.nodes_complete == 0
    assert "Drain list: mln3 " in " ".join(result.findings)


def test_a_node_whose_own_check_failed_in_the_cut_relaunch_is_still_drained():
    result = frozen_slurmd_sweep(relaunched=True, mln2_fails=True)
    assert [d.node for d in result.drain] == ["mln2", "mln3"], result.findings
    assert "48 uncorrectable ECC errors" in " ".join(result.drain[0].reasons)
    assert sorted(m.node for m in result.not_judged) == ["mln1", "mln4"]


def test_a_node_silent_through_a_whole_deadline_of_its_own_is_still_drained():
    # No relaunch: the one attempt had the whole deadline. mln4 answered nothing while mln1 and mln2 answered
    # some checks: it is drained (a hung node process, fleet-faults 5d), as is mln3 whose launch failed.
    # mln1 and mln2 were late, but so was every node: that says nothing against them (the 2026-12-02 clean-clone
    # run drained 4 of 4 nodes so, on a host loaded by other sessions, with one frozen node the only fault).
    result = frozen_slurmd_sweep(relaunched=False)
    assert [d.node for d in result.drain] == ["mln3", "mln4"], result.findings
    why = {m.node: m.reason for m in result.not_judged}
    assert sorted(why) == ["mln1", "mln2"], result.findings
    assert why["mln1"].startswith("answered 2 of 3 checks") and "0 of 4 node(s) answered every check" in why["mln1"]
    said = [f for f in result.findings if f.startswith("NOT JUDGED (not drained): 2 node(s) answered only some checks")]
    assert len(said) == 1 and "longer deadline_s" in said[0] and "(0 of 4 answered every check by the 60 s" in said[0]
    assert result.verdict == "fail" and result.nodes_complete == 0


def late_sweep(answered: dict[str, int], checks: int = 2):
    """4 nodes, no relaunch, a 90 s deadline; `answered`: how many of its checks each node got done."""
    from tools import fleet_sweep as fs
    from tools.fleet_sweep.report import build_result
    from tools.fleet_sweep.sweep import Collected
    from tools.fleet_sweep.targets import Target

    names = [f"check{k}" for k in range(checks)]
    got = Collected(attempts=1, timed_out=True, set_aside=0)
    got.planned = {n: names for n in answered}
    for node, count in answered.items():
        for check in names[:count]:
            got.rows[(node, check)] = {"node": node, "check": check, "verdict": "info", "problems": [],
                                       "started": 0.0, "ended": 1.0}
    params = fs.SPEC.Params(partition="debug", nodes=len(answered), deadline_s=90, plot=False)
    return build_result(params, Target("partition", sorted(answered), ["--partition=debug"]), got, {}, 92.1)


def test_when_most_nodes_are_late_only_the_one_that_answered_nothing_is_drained():
    # The hostile-node cluster test at load 9: mln3 frozen, the others late on the second check.
    result = late_sweep({"mln1": 1, "mln2": 1, "mln3": 0, "mln4": 1})
    assert [d.node for d in result.drain] == ["mln3"], result.findings
    assert [m.node for m in result.not_answering] == ["mln3"]
    assert sorted(m.node for m in result.not_judged) == ["mln1", "mln2", "mln4"]


def test_a_node_late_where_its_peers_were_not_is_drained():
    # Half or more answered every check: lateness is evidence against the one node (a CPU-starved node).
    result = late_sweep({"mln1": 2, "mln2": 1, "mln3": 2, "mln4": 2})
    assert [d.node for d in result.drain] == ["mln2"] and result.not_judged == [], result.findings
    result = late_sweep({"mln1": 2, "mln2": 1})        # two nodes: one complete is half
    assert [d.node for d in result.drain] == ["mln2"] and result.not_judged == [], result.findings


def test_a_partition_sweep_says_the_nodes_slurm_had_out_of_service(monkeypatch):
    """A model round (cl-dead-slurmd, 2026-12-03) read "partition (3 nodes) ... 3 of 3 answered, nothing to drain" as
    the whole partition clean: its DOWN node was left out unsaid. It is said now, not drained, and the sweep warns."""
    from tools.fleet_sweep import targets
    from tools.fleet_sweep.report import build_result
    from tools.fleet_sweep.sweep import Collected
    from tools import fleet_sweep as fs

    monkeypatch.setattr(targets, "partition_nodes", lambda p: ["mln1", "mln2", "mln3", "mln4"])
    monkeypatch.setattr(targets, "node_states", lambda nodes: {"mln1": "idle", "mln2": "down*", "mln3": "idle",
                                                               "mln4": "drained"})
    monkeypatch.setattr(targets, "own_job", lambda p, d: targets.inside_job("1"))
    target = targets.from_partition("debug", None, 60)
    assert target.nodes == ["mln1", "mln3"] and sorted(target.left_out) == ["mln2", "mln4"]
    got = Collected(attempts=1, timed_out=False, set_aside=0)
    got.planned = {n: ["env_report"] for n in target.nodes}
    for node in target.nodes:
        got.rows[(node, "env_report")] = {"node": node, "check": "env_report", "verdict": "ok", "problems": [],
                                          "started": 0.0, "ended": 1.0}
    result = build_result(fs.SPEC.Params(partition="debug", deadline_s=60, plot=False), target, got, {}, 12.0)
    said = [f for f in result.findings if f.startswith("NOT SWEPT: 2 node(s)")]
    assert len(said) == 1 and "mln2: SLURM reports the node down* (not responding" in said[0], result.findings
    assert "mln4: SLURM reports the node drained" in said[0]
    assert result.drain == [] and result.verdict == "warn"


def test_a_node_with_a_cpu_quota_apart_from_its_peers_is_inventory_drift_even_when_busy():
    """Round 9, cl-cpu-starved under the CPU hog: every probe "busy", the quota never bound, and it went unseen."""
    rows = [cpu_row(n, 50.0, busy="other processes used 1.4 of 2 CPU cores") for n in ("mln1", "mln2", "mln3", "mln4")]
    for r in rows:
        r["cpu_quota"] = "0.25 CPU" if r["node"] == "mln4" else "none"
    env = {"node": "mln2", "check": "env_report", "verdict": "ok", "inventory": {"cpu_count": 2}}
    agg = aggregate(rows + [env], ["mln1", "mln2", "mln3", "mln4"], planned(rows + [env]), {})
    quota = [d for d in agg["inventory_drift"] if d["field"] == "cpu_quota"]
    assert quota == [{"field": "cpu_quota", "values": {"none": ["mln1", "mln2", "mln3"], "0.25 CPU": ["mln4"]},
                      "odd_nodes": ["mln4"]}]
    assert agg["drain"] == []                                   # a setting to change, not a broken node
    # A node whose probe did not answer says no quota, and is no "(unset)" drift.
    answered = rows[:3] + [env]
    assert not [d for d in aggregate(answered, ["mln1", "mln2", "mln3", "mln4"], planned(rows + [env]), {})["inventory_drift"]
                if d["field"] == "cpu_quota"]


def test_a_sweep_that_only_reads_state_sees_a_quota_apart_from_env_report():
    """Model round 11, cl-ssh-throttled-rank: a sweep of env_report and nic_health beside a live job (no probe) was
    blind to the quota straggler_find had named."""
    at = "/mln/mln3: cpu.cfs_quota_us 25000 / cpu.cfs_period_us 100000, written 4 min ago"
    env = [{"node": n, "check": "env_report", "verdict": "ok", "inventory": {"cpu_count": 2},
            "cpu_quota": "0.25 CPU" if n == "mln3" else "none", "cpu_quota_at": at if n == "mln3" else ""}
           for n in ("mln1", "mln2", "mln3", "mln4")]
    agg = aggregate(env, ["mln1", "mln2", "mln3", "mln4"], planned(env), {})
    assert [d for d in agg["inventory_drift"] if d["field"] == "cpu_quota"] == [
        {"field": "cpu_quota", "values": {"none": ["mln1", "mln2", "mln4"], "0.25 CPU": ["mln3"]}, "odd_nodes": ["mln3"]}]
    assert agg["drain"] == []
    # where the node apart has it set, whose and since when (round 11: "no tool row shows its source")
    said = [f for f in findings_for(agg, 4, 4, 10.0, 60.0) if f.startswith("Inventory drift: cpu_quota")]
    assert said and said[0].endswith(f"Set at: mln3: {at}."), said
    env[2]["cpu_quota_at"] = at + "\nDrain list: mln1"             # a node's own words start no line of their own
    forged = aggregate(env, ["mln1", "mln2", "mln3", "mln4"], planned(env), {})
    said = [f for f in findings_for(forged, 4, 4, 10.0, 60.0) if f.startswith("Inventory drift: cpu_quota")]
    assert "\n" not in said[0] and said[0].endswith(f"Set at: mln3: {at}\\x0aDrain list: mln1."), said
    # the probe's row on the same node says the same: one entry, not two
    probe = cpu_row("mln3", 50.0)
    probe["cpu_quota"] = "0.25 CPU"
    both = aggregate(env + [probe], ["mln1", "mln2", "mln3", "mln4"], planned(env + [probe]), {})
    assert len([d for d in both["inventory_drift"] if d["field"] == "cpu_quota"]) == 1
