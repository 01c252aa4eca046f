"""fleet_sweep's pure parts: the outlier rule, drift, missing nodes, drain list, event and srun parsing,
and the aggregation at 1024 and 4096 nodes (time and memory per node)."""

from __future__ import annotations

import shlex
import time
import tracemalloc

import pytest

from tools.fleet_sweep.aggregate import MIN_PEERS, aggregate, drain_command, unanswered, version_drift
from tools.fleet_sweep.node import check_event
from tools.shared.sidechannel import PREFIX, Reader
from tools.fleet_sweep.sweep import launch_failures
from tools.fleet_sweep.targets import unreachable_reason


def cpu_row(node: str, gflops: float, **versions) -> dict:
    return {"node": node, "check": "cpu_probe", "verdict": "info", "versions": versions,
            "figures": [{"name": "matmul_gflops", "value": gflops, "unit": "GFLOP/s", "gpu": None,
                         "expected": None, "higher_is_better": True}]}


def gpu_row(node: str, values: list[float], expected: float | None = None) -> dict:
    return {"node": node, "check": "matmul_bench", "verdict": "ok",
            "figures": [{"name": "mamf_tflops", "value": v, "unit": "TFLOPS", "gpu": i, "expected": expected,
                         "higher_is_better": True} for i, v in enumerate(values)]}


def planned(rows):
    out = {}
    for r in rows:
        out.setdefault(r["node"], []).append(r["check"])
    return out


def test_a_node_below_the_median_by_more_than_the_margin_is_the_outlier_and_drained():
    rows = [cpu_row(f"n{i}", 90.0 + i) for i in range(7)] + [cpu_row("n7", 40.0)]
    agg = aggregate(rows, [r["node"] for r in rows], planned(rows), {}, margin_pct=20)
    assert [(o["node"], o["against"]) for o in agg["outliers"]] == [("n7", "fleet median")]
    assert agg["outliers"][0]["worse_by_pct"] == pytest.approx(100 * (1 - 40 / 92.5), abs=0.1)  # median of 40, 90..96
    assert [d["node"] for d in agg["drain"]] == ["n7"]
    assert "20% (needs >= 3" in agg["rule"]


def test_within_the_margin_is_not_an_outlier_and_two_nodes_have_no_median_verdict():
    rows = [cpu_row("a", 100.0), cpu_row("b", 100.0), cpu_row("c", 81.0)]
    assert aggregate(rows, ["a", "b", "c"], planned(rows), {}, 20)["outliers"] == []
    two = [cpu_row("a", 100.0), cpu_row("b", 10.0)]
    assert MIN_PEERS == 3 and aggregate(two, ["a", "b"], planned(two), {}, 20)["outliers"] == []


def test_a_gpu_below_its_expected_figure_is_named_even_alone():
    rows = [gpu_row("g1", [700.0, 560.0], expected=745.0)]
    agg = aggregate(rows, ["g1"], planned(rows), {}, 20)
    assert [(o["node"], o["gpu"], o["against"]) for o in agg["outliers"]] == [("g1", 1, "expected")]


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
    agg = aggregate(rows, nodes, planned(rows), {}, 20)
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
        aggregate(rows, nodes, planned(rows), {}, 20)
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


def test_gpu_health_findings_become_sentences_with_their_action():
    from tools.fleet_sweep.checks import _finding_text

    assert _finding_text({"text": "2 uncorrectable ECC errors since the last reset.", "action": "reset_gpu"}) == \
        "2 uncorrectable ECC errors since the last reset. (action: reset_gpu)"
    assert _finding_text("plain sentence") == "plain sentence"


def test_a_node_check_runs_through_the_runner_and_stops_at_the_sweep_deadline(tmp_path, monkeypatch):
    # Issue 24 item 7: node runs take the GPU locks and deadlines like any call. storage_bench alone
    # spends 2 s on random reads; the node's deadline has passed, so it gets the 1 s floor and is killed.
    import psutil

    from tools.engine.runner import DeadlineExceeded
    from tools.fleet_sweep import checks

    monkeypatch.setattr(checks, "deadline", time.monotonic() - 100)
    t0 = time.monotonic()
    with pytest.raises(DeadlineExceeded, match="storage_bench did not finish within its timeout of 1 s"):
        checks.run_tool("storage_bench", path=str(tmp_path), size_mib=64, small_files=200, time_budget_s=30)
    assert time.monotonic() - t0 < 10
    assert not psutil.Process().children(recursive=True)
    row = checks.run_check("storage_bench", lambda: checks.check_storage_bench(str(tmp_path)))
    assert row["verdict"] == "fail" and row["problems"][0].startswith("DeadlineExceeded: storage_bench did not")
