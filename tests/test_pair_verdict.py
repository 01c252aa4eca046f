"""pairwise's verdict: the one rule, the measured spread, confirmation by a second measurement, the
expected-figure gate (tools/collective_bench/pair_verdict.py through isolation.pairwise).

The rounds are run by a model of the fleet (each call draws a fresh figure, so a re-measurement is a
new sample, as on a cluster); the schedule, the rule and the confirmation are the real code.
"""

from __future__ import annotations

import random

import pytest

from tools.collective_bench.isolation import pairwise
from tools.collective_bench.node_groups import GroupRun
from tools.shared.judging import rule_for

GLOO = {"backend": "gloo", "versions": {"device_name": "cpu"}}
H200 = {"backend": "nccl", "versions": {"device_name": "NVIDIA H200"}, "local_world_size": 8, "nccl_env": {},
        "rdma_ports": [{"active": True, "rate_gbits": 400.0, "link_layer": "InfiniBand"}] * 8}
BIG = 1 << 30


class Fleet:
    """run_round for a model fleet: busbw = base x jitter x the factor of every fault the pair holds."""

    def __init__(self, n, *, base=1.0, jitter=0.05, bad_nodes=(), bad_links=(), flaky=(), setup=GLOO, seed=0):
        self.n, self.base, self.jitter, self.setup = n, base, jitter, setup
        self.bad_nodes, self.bad_links, self.flaky = set(bad_nodes), {tuple(sorted(x)) for x in bad_links}, set(flaky)
        self.rng, self.calls = random.Random(seed), 0

    def __call__(self, groups):
        self.calls += 1
        runs = []
        for a, b in groups:
            bw = self.base * self.rng.lognormvariate(0, self.jitter)
            if {a, b} & self.bad_nodes or (a, b) in self.bad_links:
                bw *= 0.05
            if (a, b) in self.flaky and self.calls == 1:  # slow the first time only: a busy moment
                bw *= 0.05
            rows = [{"op": "all_reduce", "bytes": BIG, "busbw_gbps": bw, "time_us": 100.0},
                    {"op": "all_reduce", "bytes": 8, "busbw_gbps": 0.0, "time_us": 50.0}]
            runs.append(GroupRun([a, b], "ok", bw, 50.0, 1.0, "", rows, self.setup))
        return runs


def names(n):
    return [f"n{i}" for i in range(n)]


def named(report):
    return [(s.kind, s.nodes) for s in report.suspects]


@pytest.mark.parametrize("seed", range(5))
def test_a_slow_node_is_named_after_a_second_measurement(seed):
    report = pairwise(names(8), Fleet(8, bad_nodes={5}, seed=seed))
    assert named(report) == [("node", ["n5"])] and not report.inconclusive
    assert "measured again with" in report.suspects[0].evidence and "slow again" in report.suspects[0].evidence
    assert report.rounds == 8  # 7 rounds + one confirmation round
    assert report.groups[-1].round == 8 and "n5" in report.groups[-1].nodes


def test_a_slow_link_is_named_as_a_link():
    report = pairwise(names(8), Fleet(8, bad_links={(2, 7)}))
    assert named(report) == [("link", ["n2", "n7"])]


def test_a_pair_slow_once_is_listed_not_named():
    report = pairwise(names(8), Fleet(8, flaky={(0, 7)}))  # round 1 holds (0, 7)
    assert not report.suspects and [(s.kind, s.nodes) for s in report.unconfirmed] == [("link", ["n0", "n7"])]
    assert "fine: not named" in report.unconfirmed[0].evidence


@pytest.mark.parametrize("seed", range(10))
def test_healthy_pairs_spread_wider_than_the_rule_can_judge_is_inconclusive(seed):
    """gloo on a loaded host: pairs differing several-fold name nothing, whatever the draw."""
    report = pairwise(names(8), Fleet(8, jitter=0.6, seed=seed))
    rule = rule_for("pair_busbw_gbps_gloo")
    assert not report.suspects
    if report.inconclusive:
        assert rule.k * report.spread > rule.widest
        # Whether anything failed leads, answered whatever the spread (model round 12: hang questions read
        # "Inconclusive" first over groups that all finished).
        from tools.collective_bench.patterns import pattern_findings
        head = pattern_findings(report)[1][0]
        assert head.startswith(f"Every one of the {len(report.groups)} groups finished; none failed or hung. "
                               "Inconclusive on speed"), head
        # No latency rule applies then: no ceiling is stated (model round 12 read latency_ceiling_us = 8.7e12).
        assert report.latency_ceiling_us is None
    else:
        assert report.latency_ceiling_us is not None and report.latency_ceiling_us < 1e7
    assert "spread" in report.rule


def test_quiet_healthy_fleet_names_nothing_and_needs_no_extra_round():
    fleet = Fleet(8, jitter=0.05)
    report = pairwise(names(8), fleet)
    assert not report.suspects and not report.unconfirmed and not report.inconclusive
    assert fleet.calls == 7 and report.spread < 0.1
    # A histogram bin's centre, said to 3 figures (round 12 read 0.37159611150101046 twice as a carried-over value).
    ref = report.reference_busbw_gbps
    assert ref == float(f"{ref:.3g}") and report.busbw_floor_gbps == float(f"{report.busbw_floor_gbps:.3g}")


def test_uniformly_degraded_fleet_is_not_ok_against_the_expected_figure():
    """Every pair at a third of what two H200 nodes with 8 NDR NICs reach: no pair stands out, the set does."""
    report = pairwise(names(4), Fleet(4, base=100.0, setup=H200))
    assert report.expected_busbw_gbps and report.expected_busbw_gbps > 250
    assert named(report) == [("set", names(4))] and "expected" in report.suspects[0].evidence


def test_healthy_gpu_fleet_at_the_expected_figure_passes():
    expected = pairwise(names(4), Fleet(4, base=100.0, setup=H200)).expected_busbw_gbps
    report = pairwise(names(4), Fleet(4, base=expected, jitter=0.01, setup=H200))
    assert not report.suspects and report.threshold == pytest.approx(rule_for("busbw_gbps").margin)


class DeadNode(Fleet):
    """A fleet whose node `dead` fails (hangs) with every partner."""

    def __init__(self, n, dead, **kw):
        super().__init__(n, **kw)
        self.dead = dead

    def __call__(self, groups):
        runs = super().__call__(groups)
        for run in runs:
            if self.dead in run.nodes:
                run.status, run.busbw_gbps, run.latency_us, run.detail = "hang", None, None, "did not finish"
        return runs


@pytest.mark.parametrize("seed", range(3))
def test_a_node_that_hangs_is_named_even_when_the_healthy_pairs_are_too_noisy_to_judge(seed):
    report = pairwise(names(8), DeadNode(8, 7, jitter=0.8, seed=seed))
    assert report.inconclusive and named(report) == [("node", ["n7"])]
    # nothing was measured with it: the answer says so rather than "slow with 7 of 7 partners"
    evidence = report.suspects[0].evidence
    assert evidence.startswith("every one of its 7 pairs failed or hung") and "slow with" not in evidence, evidence
    assert "did not finish" in evidence, evidence


@pytest.mark.parametrize("seed", range(5))
def test_four_nodes_leave_too_few_healthy_pairs_to_measure_a_spread(seed):
    """One bad node among 4 leaves 3 healthy pairs: their spread is no measurement, the stated one is used."""
    report = pairwise(names(4), Fleet(4, bad_nodes={2}, jitter=0.5, seed=seed))
    assert named(report) == [("node", ["n2"])] and not report.inconclusive
    assert report.spread == rule_for("pair_busbw_gbps_gloo").spread and "too few" in report.rule
