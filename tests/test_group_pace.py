"""bisect's pace (collective_bench/group_pace.py): a second measurement that has measured nothing at 3 x the time a
comparable healthy group of the run took is stopped and counted as hung; a search group, a group that measured
anything, or one with no comparable healthy group yet, waits its deadline. No cluster: the rounds run through node_groups.run_round with
a stand-in launcher (healthy groups end in a fraction of a second; a group holding both ends of a dropped link
never measures a size and ends only when `cut` says so or its deadline passes)."""

import time
import types

import pytest

from tools.collective_bench import patterns
from tools.collective_bench.group_pace import GroupPace
from tools.collective_bench.isolation import bisect
from tools.collective_bench.node_groups import GroupRun, run_round
from tools.shared.launch import LaunchOutcome

NAMES = [f"mln{k}" for k in range(1, 9)]
ROW = {"kind": "row", "op": "all_reduce", "bytes": 32768, "busbw_gbps": 0.05, "time_us": 100.0}
DEADLINE_S = 4.0


def outcome(nodes, elapsed_s, *, rows=(), cut="", overran=False) -> LaunchOutcome:
    return LaunchOutcome(command=["srun"], world_size=len(nodes), ranks={}, data=list(rows), returncode=0,
                         stalled=False, overran=overran, elapsed_s=elapsed_s, stderr_tail="", output_tail="", cut=cut)


def stand_in(bad: set[str], healthy_s: float = 0.15):
    """launch(k, nodes, on_event, cut): a group holding all of `bad` never measures; others finish at once."""
    def launch(k, nodes, on_event, cut):
        t0 = time.monotonic()
        if not bad <= set(nodes):
            time.sleep(healthy_s)
            on_event(ROW)
            return outcome(nodes, time.monotonic() - t0, rows=[ROW])
        while (elapsed := time.monotonic() - t0) < DEADLINE_S:
            said = cut(elapsed) if cut else None
            if said:
                return outcome(nodes, elapsed, cut=said)
            time.sleep(0.02)
        return outcome(nodes, elapsed, overran=True)
    return launch


def rounds_of(launch, pace):
    return lambda groups: run_round(groups, NAMES, launch, pg_timeout_s=30, pace=pace)


@pytest.mark.slow
def test_a_dropped_links_second_measurement_is_stopped_not_waited_to_its_deadline():
    pace = GroupPace()
    report = bisect(NAMES, rounds_of(stand_in({"mln3", "mln8"}), pace), pace=pace)
    assert [(s.kind, s.nodes) for s in report.suspects] == [("link", ["mln3", "mln8"])]
    failing = [g for g in report.groups if g.status != "ok"]
    # the search rounds wait their deadline (a stop there would steer the search: test_group_pace_noise.py) ...
    assert all("did not finish" in g.detail for g in failing[:-1]), failing
    # ... the second measurement of the link is stopped at 3 x the slowest healthy group
    assert failing[-1].nodes == ["mln3", "mln8"] and "cut for pace" in failing[-1].detail
    assert failing[-1].wall_s < DEADLINE_S / 2, failing[-1]


@pytest.mark.slow
def test_without_a_pace_every_failing_round_waits_its_deadline():
    """The stand-in is fair: the same fault without a pace costs one deadline per failing round."""
    report = bisect(NAMES, rounds_of(stand_in({"mln3", "mln8"}), None))
    assert [(s.kind, s.nodes) for s in report.suspects] == [("link", ["mln3", "mln8"])]
    assert report.groups[-1].nodes == ["mln3", "mln8"] and report.groups[-1].wall_s >= DEADLINE_S


def test_a_group_that_measured_a_size_or_has_nothing_comparable_is_not_stopped():
    pace = GroupPace()
    pace.judge_only([[0, 1, 2, 3]])
    assert pace.judges([0, 1, 2, 3]) and not pace.judges([4, 5, 6, 7])   # a search group: waits its deadline
    four_in_eight = [[0, 1, 2, 3], [4, 5, 6, 7]]
    pace.record(GroupRun([0, 1, 2, 3], "ok", wall_s=20.0), four_in_eight)
    pace.record(GroupRun([4, 5, 6, 7], "hang", wall_s=120.0), four_in_eight)   # a failing group sets no pace
    assert pace.healthy_s(4, 8) == 20.0
    assert pace.why_stop(59.0, [], 4, 8) is None                     # under 3 x 20 s
    assert "cut for pace" in pace.why_stop(60.0, [], 4, 8)
    assert pace.why_stop(100.0, [ROW], 4, 8) is None                 # measuring, however slowly: its deadline decides
    assert pace.why_stop(500.0, [], 5, 8) is None                    # larger than any healthy group
    assert pace.why_stop(500.0, [], 2, 10) is None                   # a fuller round than any healthy group's
    pace.record(GroupRun([0, 1], "ok", wall_s=5.0), [[0, 1]])        # a lone pair: quick, sets no pace for busier rounds
    assert pace.healthy_s(2, 8) == 20.0 and pace.healthy_s(2, 2) == 20.0   # the slowest comparable one
    assert pace.stop_rule([4, 5, 6, 7], [[0, 1, 2, 3], [4, 5, 6, 7]])(500.0, []) is None
    assert pace.stop_rule([0, 1, 2, 3], [[0, 1, 2, 3], [4, 5, 6, 7]])(60.0, []) is not None


def test_bisect_runs_its_srun_rounds_with_a_group_pace(monkeypatch):
    """The tool wires it: before, bisect ran without any pace (`pace=None`), pairwise with its own."""
    seen = []

    def fake_rounds(groups, *, pace=None, **_):
        seen.append(pace)
        return [GroupRun(g, "ok", wall_s=1.0, busbw_gbps=0.05) for g in groups]

    def fake_bisect(names, run_round, *, progress=None, pace=None):
        seen.append(("bisect", pace))
        return bisect(names, run_round, progress=progress, pace=pace)

    monkeypatch.setattr(patterns, "bisect", fake_bisect)
    monkeypatch.setattr(patterns, "pattern_nodes", lambda params: (NAMES, "srun"))
    monkeypatch.setattr(patterns, "run_round_srun", fake_rounds)
    monkeypatch.setattr(patterns, "remove_scratch", lambda names, tag: None)
    params = types.SimpleNamespace(pattern="bisect", pair_rounds=None, transport="nccl", group_deadline_s=120,
                                   pg_timeout_s=30, slow_margin=None, slow_latency_factor=5.0)
    report, _ = patterns.run_pattern(params, {"backend": "gloo"}, 1, lambda *a: None)
    assert report.rounds == 1 and seen[0][0] == "bisect" and isinstance(seen[0][1], GroupPace)
    assert seen[1] is seen[0][1]        # the one pace: bisect tells it the second measurements, the rounds use it



def test_a_bisect_where_every_group_hangs_answers_inconclusive_naming_no_node():
    """Model round 6, cl-link-down at load ~50: every group of a 7-node bisect hung at start-up and the answer named
    three 2-node sets ("fails, and no node is known good") while smoke tests passed on the same nodes. With no group
    passed, the answer says so first, names nothing, and sends to a two-node smoke test."""
    from tools.collective_bench.patterns import pattern_findings

    names = [f"mln{i}" for i in range(1, 8)]
    report = bisect(names, lambda groups: [GroupRun(g, "hang", wall_s=120.0, detail="did not finish") for g in groups])
    verdict, findings, nxt = pattern_findings(report)
    assert verdict == "warn" and not report.suspects
    assert findings[0].startswith("Inconclusive: all ") and "none passed" in findings[0], findings
    assert not any(f.startswith("Suspect") for f in findings) and nxt[0] == "dist_smoke_test"


def test_a_pairwise_where_every_pair_hangs_before_a_size_names_no_set():
    """The healthy control ssh-healthy-network under a CPU hog (load ~12, 2026-12-04): all 6 pairs hung before their
    first size and the answer was "fail: Suspect set mln1 - mln2 - mln3 - mln4 ... fleet-wide". Nothing measured is
    nothing to judge against: inconclusive, no set, a smoke test next. Pairs that failed with an error still judge."""
    from tools.collective_bench.isolation import pairwise
    from tools.collective_bench.patterns import pattern_findings

    names = NAMES[:4]
    report = pairwise(names, lambda groups: [GroupRun(g, "hang", wall_s=120.0, detail="did not finish") for g in groups])
    verdict, findings, nxt = pattern_findings(report)
    assert verdict == "warn" and not report.suspects and report.rounds == 3, findings
    assert findings[0].startswith("Inconclusive: all 6 groups (2 nodes) failed or hung and none passed"), findings
    assert "pairwise again with a longer group_deadline_s" in findings[0] and nxt[0] == "dist_smoke_test"
    failed = pairwise(names, lambda groups: [GroupRun(g, "fail", wall_s=3.0, detail="gloo: connection refused")
                                             for g in groups])
    assert pattern_findings(failed)[0] == "fail" and [s.kind for s in failed.suspects] == ["set"]


def _sweep(sizes: int) -> list[dict]:
    return [dict(ROW, bytes=32768 << k) for k in range(sizes)]


def test_a_whole_set_cut_by_its_deadline_while_measuring_is_not_a_fault_of_scale():
    """Model round 8, cl-link-down: with group_deadline_s=60 on a loaded host the 4-node group of healthy mln1-mln4
    was ended by its deadline after 7 of 10 sizes, its pairs passed, and the headline named the set "a fault of
    scale". Slow is not hung: such a set is listed, not named. A whole set that hangs before any size still is."""
    from tools.collective_bench.patterns import pattern_findings

    names = NAMES[:4]

    def slow_whole(groups):
        return [GroupRun(g, "hang", 0.1, 900.0, 62.0, "did not finish within 62 s (7 sizes measured)", _sweep(7))
                if len(g) == 4 else GroupRun(g, "ok", 0.2, 500.0, 30.0, "", _sweep(10)) for g in groups]
    report = bisect(names, slow_whole)
    assert not report.suspects and [(s.kind, s.nodes) for s in report.unconfirmed] == [("set", names)]
    # Model round 11: such a group read "hang" in the answer's groups; it measured sizes, so it is "unfinished".
    assert {g.status for g in report.groups if len(g.nodes) == 4} == {"unfinished"}
    assert "still measuring sizes when its deadline ended it" in report.unconfirmed[0].evidence
    verdict, findings, _ = pattern_findings(report)
    assert verdict == "warn" and not any(f.startswith("Suspect") for f in findings), findings

    def hung_whole(groups):
        return [GroupRun(g, "hang", None, None, 62.0, "did not finish within 62 s (0 sizes measured)")
                if len(g) == 4 else GroupRun(g, "ok", 0.2, 500.0, 30.0, "", _sweep(10)) for g in groups]
    hung = bisect(names, hung_whole)
    assert [(s.kind, s.nodes) for s in hung.suspects] == [("set", names)]
    assert {g.status for g in hung.groups if len(g.nodes) == 4} == {"hang"}
