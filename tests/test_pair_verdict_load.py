"""pairwise on a loaded host: deadlines, start-up and one healthy pair are not evidence against a node.

Built from a real model's run of the drill cl-slow-link (4 nodes, only mln1<->mln2 at 50 Mbit/s, 2 cores at
load ~45, group deadline 120 s; /work/notes/fixtures/d07-pairwise-run1.json): round 1 hung at start-up in
both groups, round 2 measured all 10 sizes at healthy-looking rates in both and was cut by the deadline,
round 3 held the fault (mln1+mln2 stopped by the pace at 512 KiB, 0.00475 GB/s) and the one healthy pair
(0.394 GB/s, 115 s). main named mln1 (slow with 3 of 3 partners, then 0.160 against 0.394 GB/s with mln4)
and printed a drain command for it. Each group's figures below are the fixture's; the per-size rows, which
the stored result leaves out, follow one healthy curve scaled to the fixture's largest-size figure.
"""

from __future__ import annotations

import pytest

from tools.collective_bench.isolation import pairwise
from tools.collective_bench.node_groups import GroupRun
from tools.collective_bench.patterns import pattern_findings

NAMES = ["mln1", "mln2", "mln3", "mln4"]
GLOO = {"backend": "gloo", "versions": {"device_name": "cpu"}}
SIZES = [(32 << 10) << k for k in range(10)]          # 32 KiB .. 16 MiB: the CPU default sweep


def curve(top: float, sizes: int = 10) -> list[dict]:
    """all_reduce rows of the first `sizes` sizes, busbw rising to `top` GB/s at 16 MiB (gloo's shape)."""
    shape = lambda b: b / (b + (3 << 19))  # noqa: E731  half of the top at 1.5 MiB
    return [{"op": "all_reduce", "bytes": b, "busbw_gbps": top * shape(b) / shape(SIZES[-1]), "time_us": 9000.0}
            for b in SIZES[:sizes]]


def ok(a, b, top, wall):
    return GroupRun([a, b], "ok", top, 9000.0, wall, "", curve(top), GLOO)


def cut_by_deadline(a, b, top, wall, sizes=10):
    rows = curve(top, sizes)
    return GroupRun([a, b], "hang", rows[-1]["busbw_gbps"] if rows else None, 9000.0 if rows else None, wall,
                    f"{NAMES[a]}+{NAMES[b]} did not finish within {wall:.0f} s ({sizes} sizes measured)", rows)


def hung_at_start(a, b, wall):
    return GroupRun([a, b], "hang", None, None, wall, f"{NAMES[a]}+{NAMES[b]} did not finish within {wall:.0f} s "
                    "(0 sizes measured)")


def stopped_by_pace(a, b):
    rows = [dict(r, busbw_gbps=r["busbw_gbps"] / 20) for r in curve(0.394, 5)]   # 0.005 GB/s at 512 KiB
    return GroupRun([a, b], "hang", rows[-1]["busbw_gbps"], 12615.0, 117.6, f"{NAMES[a]}+{NAMES[b]} stopped at "
                    "115 s, after a healthy pair's 115 s: under a tenth", rows, cut=True)


class Drill:
    """The three rounds as the fixture recorded them; confirmations as the cluster answers: a group holding
    the shaped link is stopped by the pace again, any other pair is healthy at a loaded host's rate (round 4
    of the fixture: mln1+mln4 0.160, mln2+mln3 0.271 GB/s)."""

    def __init__(self, rounds, bad_link=(0, 1)):
        self.rounds, self.bad_link, self.asked = list(rounds), bad_link, []

    def __call__(self, groups):
        self.asked.append([sorted(g) for g in groups])
        if self.rounds:
            runs = self.rounds.pop(0)
            assert [r.nodes for r in runs] == groups
            return runs
        again = {(0, 3): 0.160, (1, 2): 0.271}
        return [stopped_by_pace(*g) if tuple(sorted(g)) == self.bad_link
                else ok(*g, again.get(tuple(sorted(g)), 0.3), 72.0) for g in groups]


def d07_rounds(link_round3):
    return [[hung_at_start(0, 3, 123.9), hung_at_start(1, 2, 124.9)],
            [cut_by_deadline(0, 2, 0.136, 123.4), cut_by_deadline(1, 3, 0.344, 123.4)],
            [link_round3, ok(2, 3, 0.394, 114.6)]]


def answer(report, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "7")   # the drain line is printed only inside an allocation
    return pattern_findings(report)


def test_the_slow_link_under_load_is_named_as_the_link_and_no_node_is_drained(monkeypatch):
    report = pairwise(NAMES, Drill(d07_rounds(stopped_by_pace(0, 1))))
    verdict, findings, _ = answer(report, monkeypatch)
    assert [(s.kind, s.nodes) for s in report.suspects] == [("link", ["mln1", "mln2"])], report.suspects
    assert verdict == "fail" and not any("state=drain" in f for f in findings), findings
    text = " ".join(findings)
    assert "Round 1: every group hung before measuring a size" in text and "count against no node" in text
    late = next(f for f in findings if f.startswith("Not finished in time"))
    assert "mln1+mln3" in late and "mln2+mln4" in late and "group_deadline_s of at least 229" in late
    assert "a healthy pair took 115 s" in late
    # A link's next steps are its path and its two NICs, not the hosts' software (model round 7, ssh-slow-link)
    _, _, nxt = answer(report, monkeypatch)
    assert nxt[:2] == ["nic_health", "knowledge://network/link-health.md"] and "dist_smoke_test" not in nxt
    assert any(f.startswith("Between mln1 and mln2 only: the route") for f in findings), findings


def test_healthy_pairs_slow_under_load_name_nothing(monkeypatch):
    """The twin without the fault: round 3's mln1+mln2 also runs out of time at healthy rates. main had mln1
    and mln2 'slow with 3 of 3 partners' and named mln1 at 0.160 against 0.394 GB/s."""
    report = pairwise(NAMES, Drill(d07_rounds(cut_by_deadline(0, 1, 0.2, 123.0)), bad_link=None))
    verdict, findings, _ = answer(report, monkeypatch)
    assert not report.suspects and verdict == "warn"
    assert not any("state=drain" in f for f in findings)
    assert report.rounds == 3   # nothing to measure again


class Failing:
    """mln1's pairs fail in the rounds (a busy node); measured again with a healthy partner it reads `again`."""

    def __init__(self, again: GroupRun):
        self.again, self.calls = again, 0

    def __call__(self, groups):
        self.calls += 1
        if self.calls > 3:
            return [self.again]
        return [GroupRun(g, "fail", None, None, 30.0, "rank 0 exited 1") if 0 in g else ok(*g, 0.394, 60.0)
                for g in groups]


def test_one_healthy_pair_names_a_node_only_for_a_gross_deficit():
    """4 nodes, one suspect: 3 healthy pairs are too few to measure the spread, so 0.160 against 0.394 GB/s
    (under the 50% margin, not under a tenth) is not named; it is said with its figure."""
    report = pairwise(NAMES, Failing(ok(0, 3, 0.160, 70.0)))
    assert not report.suspects
    [s] = report.unconfirmed
    assert s.nodes == ["mln1"] and "0.16 GB/s" in s.evidence and "too few to measure the spread" in s.evidence


@pytest.mark.parametrize("again", [ok(0, 3, 0.030, 70.0), GroupRun([0, 3], "fail", None, None, 30.0, "exit 1"),
                                   GroupRun([0, 3], "hang", None, None, 120.0, "did not finish")])
def test_a_gross_deficit_or_a_failure_on_confirmation_still_names_the_node(again):
    report = pairwise(NAMES, Failing(again))
    assert [(s.kind, s.nodes) for s in report.suspects] == [("node", ["mln1"])]


def test_a_round_all_hung_still_counts_against_nodes_that_never_measured_anything():
    """mln1 and mln2 never start (dead): round 2's two groups both hang with nothing measured, but that is no
    start-up under load, since those nodes measured nothing anywhere: their hangs still count."""
    def fleet(groups):
        return [hung_at_start(*g, 120.0) if {0, 1} & set(g) else ok(*g, 0.394, 60.0) for g in groups]

    report = pairwise(NAMES, fleet)
    assert [(s.kind, s.nodes) for s in report.suspects] == [("node", ["mln1"]), ("node", ["mln2"])]
    assert not report._not_counted


def test_a_pair_cut_by_the_deadline_at_a_gross_deficit_still_counts():
    """A deadline-cut pair under a tenth of a healthy pair at the same size is a fault, not load."""
    slow = GroupRun([0, 1], "hang", 0.01, 9000.0, 120.0, "did not finish within 120 s (6 sizes measured)",
                    [dict(r, busbw_gbps=r["busbw_gbps"] / 40) for r in curve(0.394, 6)])
    rounds = [[ok(0, 3, 0.39, 60.0), ok(1, 2, 0.39, 60.0)], [ok(0, 2, 0.39, 60.0), ok(1, 3, 0.39, 60.0)],
              [slow, ok(2, 3, 0.394, 60.0)]]
    report = pairwise(NAMES, Drill(rounds))
    assert [(s.kind, s.nodes) for s in report.suspects] == [("link", ["mln1", "mln2"])]
    assert not report._not_counted
    # the groups that failed or hung are named in the head line while few: "2 failed or hung" beside one suspect
    # sent model round 7 to the stored result to see that both were this pair
    head = next(f for f in pattern_findings(report)[1] if f.startswith("pairwise: 4 nodes"))
    assert "(2 failed or hung: mln1+mln2 (round 3), mln1+mln2 (round 4))" in head, head


def cpu_starved_fleet(mln4: dict[tuple[int, int], float], again: float):
    """A real model's run of cl-cpu-starved (4 nodes, mln4 capped by its cgroup, load ~3, 2026-12-03, model round 7):
    every pair measured; the healthy ones 0.346-0.462 GB/s. `mln4` gives its three pairs, `again` its confirmation
    with mln3."""
    healthy = {(1, 2): 0.3459, (0, 2): 0.3615, (0, 1): 0.4618}

    def fleet(groups):
        if groups == [[2, 3]]:
            return [ok(2, 3, again, 60.0)]
        return [ok(*g, (healthy | mln4)[tuple(g)], 60.0) for g in groups]
    return fleet


def test_a_node_apart_in_every_pair_is_named_without_a_measured_spread(monkeypatch):
    """3 healthy pairs are too few for a spread, but mln4's every pair (0.140-0.147 GB/s) is under half the slowest
    healthy pair (0.346) and again with mln3 (0.152): no spread guess is needed to say it stands apart."""
    report = pairwise(NAMES, cpu_starved_fleet({(0, 3): 0.1398, (1, 3): 0.1453, (2, 3): 0.1474}, again=0.1523))
    assert [(s.kind, s.nodes) for s in report.suspects] == [("node", ["mln4"])], report.unconfirmed
    assert "stands apart without a measured spread" in report.suspects[0].evidence
    verdict, findings, _ = answer(report, monkeypatch)
    assert verdict == "fail" and findings[0].startswith("Suspect node mln4"), findings   # the headline
    assert any("nodename=mln4 state=drain" in f for f in findings)
    # each node with its partners, slowest first: one node low with all (model round 7 opened the matrix for it)
    per_node = next(f for f in findings if f.startswith("Per node"))
    assert "slowest first: mln4 0.144 GB/s (3), mln3 0.2" in per_node, per_node
    # and every pair (model round 8 opened results_history for the matrices in three drills of four)
    pairs = next(f for f in findings if f.startswith("Pairs, busbw GB/s"))
    assert "slowest first: mln1-mln4 0.14 (9 ms), mln2-mln4 0.145 (9 ms), mln3-mln4 0.147 (9 ms), mln2-mln3" in pairs
    assert pairs.endswith("mln1-mln2 0.462 (9 ms)."), pairs


@pytest.mark.parametrize("mln4, again", [
    ({(0, 3): 0.1398, (1, 3): 0.1453, (2, 3): 0.20}, 0.1523),   # one pair above half the slowest healthy pair
    ({(0, 3): 0.1398, (1, 3): 0.1453, (2, 3): 0.1474}, 0.30),   # fine when measured again
])
def test_a_node_not_apart_in_every_figure_is_not_named_without_a_spread(mln4, again):
    report = pairwise(NAMES, cpu_starved_fleet(mln4, again))
    assert not report.suspects, report.suspects


def test_apart_needs_two_healthy_pairs_to_compare_with():
    """d07's false name again: mln1's first pairs hung, one healthy pair measured: nothing stands apart."""
    report = pairwise(NAMES, Failing(ok(0, 3, 0.160, 70.0)))
    assert not report.suspects


def test_a_suspect_fine_when_measured_again_leaves_a_healthy_answer(monkeypatch):
    """Model round 7, cl-healthy-allreduce: one pair slow at first, fine again, nothing else: the answer was "warn"
    with a summary line first, and the model had to ask itself whether to act. Nothing to act on is said first."""
    calls = []

    def fleet(groups):
        calls.append(groups)
        first = len(calls) <= 3
        return [ok(*g, 0.02 if first and g == [0, 1] else 0.39, 60.0) for g in groups]

    report = pairwise(NAMES, fleet)
    verdict, findings, _ = answer(report, monkeypatch)
    assert not report.suspects and [s.cleared for s in report.unconfirmed] == [True], report.unconfirmed
    assert verdict == "ok" and findings[0].startswith("No bad node or link: every pair of the 4 nodes"), findings
    assert "1 suspect(s) slow at first were fine when measured again" in findings[0]
    # Not measured again (or slow again under the margin only) is no all-clear: still "warn"
    report = pairwise(NAMES, Failing(ok(0, 3, 0.160, 70.0)))
    assert answer(report, monkeypatch)[0] == "warn" and not answer(report, monkeypatch)[1][0].startswith("No bad")


def test_a_node_apart_is_named_beside_a_suspected_link(monkeypatch):
    """Model round 8, cl-link-and-starved-node (4 nodes, link mln1-mln2 shaped, mln4 capped by its cgroup, two
    drills on 2 cores; the stored run's figures): the link hung twice; mln4 was 0.117-0.129 GB/s with every partner
    and 0.153 again with mln3, against 0.391 and 0.472 for its two healthy pairs. Those two pairs have a link
    suspect's end in them, and were not counted as healthy: mln4 was left "not named" and the model overruled it."""
    first = {(0, 3): 0.1170, (1, 2): 0.3907, (0, 2): 0.4724, (1, 3): 0.1291, (2, 3): 0.1258}
    seen = set()

    def run(groups):   # the first measurement of a pair, then its confirmation (mln4 again with mln3: 0.153)
        answers = [stopped_by_pace(*g) if g == [0, 1] else ok(*g, 0.1531 if tuple(g) in seen else first[tuple(g)], 60.0)
                   for g in groups]
        seen.update(tuple(g) for g in groups)
        return answers
    report = pairwise(NAMES, run)
    assert sorted((s.kind, s.nodes) for s in report.suspects) == [("link", ["mln1", "mln2"]), ("node", ["mln4"])], (
        report.suspects, report.unconfirmed)
    verdict, findings, _ = answer(report, monkeypatch)
    assert verdict == "fail" and any("nodename=mln4 state=drain" in f for f in findings)
    assert not any("mln1" in f or "mln2" in f for f in findings if "state=drain" in f)   # the link's ends stay


def test_a_node_behind_every_pair_within_the_margin_is_said_first_to_check(monkeypatch):
    """Model round 8 (replay), cl-link-and-starved-node at load ~13: link mln1-mln2 hung twice (named); mln4, capped to
    0.2 CPU, 0.117-0.122 GB/s with each partner against 0.17 and 0.29 for the two pairs without it, was under the 50%
    margin of a reference its own pairs pulled down (0.172). The answer named only the link; the model named mln4
    from fleet_sweep against it. Such a node is now said, not named, with fleet_sweep to check it."""
    first = {(0, 3): 0.117, (1, 2): 0.17, (0, 2): 0.29, (1, 3): 0.118, (2, 3): 0.122}

    def run(groups):
        return [stopped_by_pace(*g) if g == [0, 1] else ok(*g, first[tuple(g)], 60.0) for g in groups]
    report = pairwise(NAMES, run)
    verdict, findings, nxt = answer(report, monkeypatch)
    assert [(s.kind, s.nodes) for s in report.suspects] == [("link", ["mln1", "mln2"])]
    # The link's pair measured sizes before the pace stopped it: unfinished, not hung (model round 11).
    pairs_line = ("Pairs, busbw GB/s (latency at the smallest size), slowest first: mln1-mln2 unfinished (sizes "
                  "measured, then cut), mln1-mln4")
    assert any(f.startswith(pairs_line) for f in findings), findings
    behind = [f for f in findings if f.startswith("Behind with every partner")]
    assert len(behind) == 1 and "(not named): mln4 0.117-0.122 GB/s" in behind[0] and "0.17-0.29" in behind[0], findings
    assert "fleet_sweep" in nxt and not any("nodename=mln4" in f for f in findings)


def test_a_healthy_spread_says_no_node_is_behind(monkeypatch):
    """Four healthy nodes on shared cores: pairs 0.17-0.29 GB/s in no node's order: nothing said, verdict ok."""
    figures = {(0, 1): 0.21, (2, 3): 0.29, (0, 2): 0.17, (1, 3): 0.24, (0, 3): 0.26, (1, 2): 0.19}
    report = pairwise(NAMES, lambda groups: [ok(*g, figures[tuple(g)], 60.0) for g in groups])
    verdict, findings, nxt = answer(report, monkeypatch)
    assert verdict == "ok" and not any(f.startswith("Behind") for f in findings) and "fleet_sweep" not in nxt


def test_with_nothing_named_the_node_behind_is_the_first_finding(monkeypatch):
    figures = {(0, 1): 0.29, (2, 3): 0.118, (0, 2): 0.25, (1, 3): 0.117, (0, 3): 0.122, (1, 2): 0.21}
    report = pairwise(NAMES, lambda groups: [ok(*g, figures[tuple(g)], 60.0) for g in groups])
    verdict, findings, nxt = answer(report, monkeypatch)
    assert not report.suspects and verdict == "warn" and nxt[0] == "fleet_sweep"
    assert findings[0].startswith("No node or link named; one is behind with every partner, within the margin: mln4 ")
    assert not any(f.startswith("Behind with every partner") for f in findings)    # said once, first
