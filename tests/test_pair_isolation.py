"""The pure planners behind collective_bench's pairwise and bisect patterns, at 4 to 4096 nodes.

Faults are simulated by a predicate (a group fails when it holds a bad node, or both ends of a bad
link); the figures are synthetic but the schedule, planner and analysis are the real code.
"""

import math
import random
import tracemalloc

import pytest

from tools.collective_bench.pair_matrix import PairFigure, analyse_pairs, node_summaries
from tools.collective_bench.pair_schedule import Bisection, full_round_count, pair_rounds, partner, round_pairs


# ---------------------------------------------------------------------------------------------------
# Round-robin schedule

@pytest.mark.parametrize("n", list(range(2, 34)))
def test_small_schedules_cover_every_pair_once(n):
    seen = set()
    for pairs in pair_rounds(n):
        flat = [x for p in pairs for x in p]
        assert len(flat) == len(set(flat)) == 2 * (n // 2)  # disjoint, all at once
        for pair in pairs:
            assert pair not in seen
            seen.add(pair)
    assert len(seen) == n * (n - 1) // 2
    assert full_round_count(n) == (n - 1 if n % 2 == 0 else n)


@pytest.mark.slow
@pytest.mark.parametrize("n", [1024, 4096])
def test_large_schedule_covers_every_pair_once(n):
    covered = bytearray(n * n)
    rounds = 0
    for pairs in pair_rounds(n):
        rounds += 1
        assert len(pairs) == n // 2
        for a, b in pairs:
            covered[a * n + b] += 1
    assert rounds == n - 1
    assert covered.count(1) == n * (n - 1) // 2 and covered.count(0) == n * n - n * (n - 1) // 2


@pytest.mark.parametrize("n", [1024, 4096, 4095])
def test_partner_is_symmetric_and_needs_no_schedule(n):
    rng = random.Random(n)
    for _ in range(2000):
        r, i = rng.randrange(full_round_count(n)), rng.randrange(n)
        j = partner(n, r, i)
        if j is None:
            assert n % 2 == 1
            continue
        assert j != i and partner(n, r, j) == i
    assert sum(partner(n, 0, i) is None for i in range(n)) == n % 2


def test_schedule_bad_input_names_the_field():
    with pytest.raises(ValueError, match="nodes"):
        round_pairs(1, 0)
    with pytest.raises(ValueError, match="round"):
        partner(4, 3, 0)
    with pytest.raises(ValueError, match="rounds"):
        list(pair_rounds(4, rounds=9))


# ---------------------------------------------------------------------------------------------------
# Bisection

def bisect(n, fails, known_failing=False):
    plan = Bisection(n, known_failing=known_failing)
    while not plan.done:
        groups = plan.next_round()
        if groups:
            plan.record([not fails(set(g)) for g in groups])
        assert plan.rounds < 10 * (math.log2(n) + 2), "the planner does not converge"
    return plan


def named(plan, kind):
    return [f.nodes for f in plan.findings if f.kind == kind]


@pytest.mark.parametrize("bad", range(8))
def test_bisect_8_nodes_names_one_bad_node_within_log2_plus_2_rounds(bad):
    plan = bisect(8, lambda g: bad in g)
    assert named(plan, "node") == [[bad]] and not named(plan, "link") and not plan.untested
    assert plan.rounds <= math.ceil(math.log2(8)) + 2  # the last round measures the suspect again


def in_slurm_order(fails):
    """What a launcher whose rendezvous host is not the group's first listed node does: a group listed out
    of node order hangs (SLURM starts task 0 on its lowest node; everyone dials the first listed one)."""
    return lambda g: fails(set(g)) or list(g) != sorted(g)


def bisect_listed(n, fails):
    plan = Bisection(n)
    while not plan.done:
        groups = plan.next_round()
        if groups:
            plan.record([not fails(g) for g in groups])
    return plan


@pytest.mark.parametrize("n", [8, 16])
def test_bisect_groups_are_listed_in_node_order_so_no_healthy_node_is_named(n):
    """Review F1: a padded group came out as [mln8, mln3]; the group hung and healthy mln7 was named."""
    for bad in range(n):
        plan = bisect_listed(n, in_slurm_order(lambda g: bad in g))
        assert named(plan, "node") == [[bad]], (n, bad, plan.findings)
    for a, b in [(2, n - 1), (0, n - 1), (n - 2, n - 1)]:  # a dropped link; the review's was mln3-mln8
        plan = bisect_listed(n, in_slurm_order(lambda g: a in g and b in g))
        assert named(plan, "link") == [[a, b]] and not named(plan, "node"), (n, a, b, plan.findings)


def test_bisect_names_only_what_fails_twice():
    """A node that fails once (a busy moment) and passes when measured again is listed, not named."""
    failures = {"left": 1}

    def flaky(g):  # every larger group holding node 5 fails; its first two-node group fails, later ones pass
        if 5 in g and len(g) == 2 and failures["left"]:
            failures["left"] -= 1
            return True
        return 5 in g and len(g) > 2

    plan = bisect(8, flaky)
    assert not plan.findings and plan.unconfirmed and all(5 in f.nodes for f in plan.unconfirmed)
    assert "passed when measured again" in plan.unconfirmed[0].evidence


def test_bisect_confirms_a_node_with_another_good_partner():
    plan = Bisection(8)
    partners = []
    while not plan.done:
        groups = plan.next_round()
        partners += [g for g in groups if 3 in g and len(g) == 2]
        plan.record([3 not in g for g in groups])
    assert named(plan, "node") == [[3]] and len(partners) >= 2
    assert len({x for g in partners[-2:] for x in g if x != 3}) == 2  # two different good partners


@pytest.mark.parametrize("n", [1024, 4096, 1000, 5])
def test_bisect_large_fleets_one_bad_node(n):
    for bad in {0, n - 1, n // 2, random.Random(n).randrange(n)}:
        plan = bisect(n, lambda g: bad in g)
        assert named(plan, "node") == [[bad]], (n, bad, plan.findings)
        assert plan.rounds <= math.ceil(math.log2(n)) + 2


@pytest.mark.parametrize("bad", range(3))
def test_bisect_3_nodes_names_the_node_or_says_it_lacks_a_good_partner(bad):
    plan = bisect(3, lambda g: bad in g)
    assert named(plan, "node") == [[bad]] or (bad in plan.untested and len(plan.untested) == 2)


@pytest.mark.parametrize("n", [8, 1024, 4096])
def test_bisect_two_bad_nodes_both_named(n):
    rng = random.Random(7 * n)
    bad = set(rng.sample(range(n), 2))
    plan = bisect(n, lambda g: bool(bad & g))
    assert sorted(x for f in named(plan, "node") for x in f) == sorted(bad)
    assert plan.rounds <= math.ceil(math.log2(n)) + 3


@pytest.mark.parametrize("n", [4, 8, 1024, 4096])
def test_bisect_names_a_bad_link_not_a_node(n):
    rng = random.Random(n)
    a, b = rng.sample(range(n), 2)
    plan = bisect(n, lambda g: a in g and b in g)
    assert named(plan, "link") == [sorted([a, b])] and not named(plan, "node")
    assert plan.rounds <= 2 + 3 * math.ceil(math.log2(n))


def test_bisect_healthy_set_stops_after_one_round():
    plan = bisect(16, lambda g: False)
    assert plan.rounds == 1 and not plan.findings


def test_bisect_fault_of_scale_is_named_as_the_set():
    plan = bisect(8, lambda g: len(g) == 8)  # only the whole set fails
    assert named(plan, "set") == [list(range(8))] and not named(plan, "node")


def test_bisect_two_nodes_without_a_good_partner_stay_untested():
    plan = bisect(2, lambda g: 1 in g)
    assert sorted(plan.untested) == [0, 1] and not plan.findings and plan.nothing_passed


def test_bisect_where_every_group_hangs_names_no_set():
    """Model round 6, cl-link-down: at load ~50 every group of a 7-node bisect hung at start-up (smoke tests passed on
    the same nodes) and three 2-node sets were named. With no group passed, nothing is named."""
    plan = bisect(7, lambda g: True)
    assert not plan.findings and plan.untested and plan.nothing_passed
    plan = bisect(8, lambda g: 3 in g)  # one group passing is enough to judge against
    assert named(plan, "node") == [[3]] and not plan.nothing_passed


def test_bisect_record_checks_the_outcome_count():
    plan = Bisection(4)
    plan.next_round()
    with pytest.raises(ValueError, match="outcomes"):
        plan.record([True, False])


# ---------------------------------------------------------------------------------------------------
# Pair-matrix analysis

def synthetic(n, rounds, bad_nodes=(), bad_links=(), jitter=0.1, seed=0):
    """A callable that yields the pair figures of `rounds` rounds again on every call (no storage)."""
    links = {tuple(sorted(p)) for p in bad_links}

    def figures():
        rng = random.Random(seed)
        for pairs in pair_rounds(n, rounds):
            for a, b in pairs:
                bw, lat = 10.0 * (1 + rng.uniform(-jitter, jitter)), 50.0 * (1 + rng.uniform(-jitter, jitter))
                if a in bad_nodes or b in bad_nodes or (a, b) in links:
                    bw, lat = bw / 20, lat * 40
                yield PairFigure(a, b, bw, lat)
    return figures


def test_four_nodes_slow_node_3():
    verdict = analyse_pairs(4, list(synthetic(4, None, bad_nodes={3})()))
    assert [s.node for s in verdict.slow_nodes] == [3] and not verdict.slow_links
    assert verdict.slow_nodes[0].slow_partners == verdict.slow_nodes[0].partners == 3


def test_four_nodes_slow_link_is_not_a_node():
    verdict = analyse_pairs(4, list(synthetic(4, None, bad_links=[(1, 2)])()))
    assert not verdict.slow_nodes and [(f.a, f.b) for f in verdict.slow_links] == [(1, 2)]


def test_latency_alone_marks_a_pair_slow():
    figs = [PairFigure(a, b, 10.0, 100_000.0 if 3 in (a, b) else 80.0) for a, b in
            [p for r in pair_rounds(4) for p in r]]
    assert [s.node for s in analyse_pairs(4, figs).slow_nodes] == [3]


def test_node_that_fails_with_every_partner():
    figs = [PairFigure(a, b, None if 2 in (a, b) else 5.0, None, ok=2 not in (a, b))
            for r in pair_rounds(6) for a, b in r]
    verdict = analyse_pairs(6, figs)
    assert [(s.node, s.failed_partners) for s in verdict.slow_nodes] == [(2, 5)]


def test_every_pair_failing_is_fleet_wide_not_every_node():
    figs = [PairFigure(a, b, None, None, ok=False) for r in pair_rounds(4) for a, b in r]
    verdict = analyse_pairs(4, figs)
    assert verdict.fleet_wide and not verdict.slow_nodes and not verdict.slow_links


def test_two_nodes_cannot_tell_node_from_link():
    verdict = analyse_pairs(2, [PairFigure(0, 1, 0.01, 5e4, ok=False)])
    assert not verdict.slow_nodes and not verdict.slow_links and len(verdict.undetermined) == 1


@pytest.mark.slow
@pytest.mark.parametrize("n,rounds", [(1024, 4), (4096, 8), (1024, None)])
def test_large_fleet_slow_nodes_and_links(n, rounds):
    rng = random.Random(n)
    bad_nodes = set(rng.sample(range(n), 5))
    first = [p for p in round_pairs(n, 0) if not set(p) & bad_nodes]
    links = first[:3]
    verdict = analyse_pairs(n, synthetic(n, rounds, bad_nodes, links))
    assert {s.node for s in verdict.slow_nodes} == bad_nodes
    assert {(f.a, f.b) for f in verdict.slow_links} == set(links) and verdict.slow_link_count == 3
    assert verdict.pairs == (n // 2) * (rounds or n - 1)
    assert abs(verdict.median_busbw_gbps - 10.0) / 10.0 < 0.03


def test_memory_per_node_is_constant():
    def peak(n, rounds):
        source = synthetic(n, rounds, bad_nodes={1})
        tracemalloc.start()
        analyse_pairs(n, source)
        _, top = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return top
    small, more_rounds, large = peak(1024, 4), peak(1024, 32), peak(4096, 4)
    assert more_rounds < small * 1.15, "memory grows with the partners a node had"
    per_node_small, per_node_large = small / 1024, large / 4096
    assert per_node_large < per_node_small * 1.15, (per_node_small, per_node_large)


def test_summaries_and_bad_input():
    rows = node_summaries(4, list(synthetic(4, None, bad_nodes={0})()))
    assert [r.slow_partners for r in rows] == [3, 1, 1, 1]
    with pytest.raises(ValueError, match="figures"):
        analyse_pairs(4, [PairFigure(0, 4, 1.0)])
    with pytest.raises(ValueError, match="figures"):
        analyse_pairs(4, iter([PairFigure(0, 1, 1.0)]))
    with pytest.raises(ValueError, match="margin"):
        analyse_pairs(4, [PairFigure(0, 1, 1.0)], margin=1.5)


# ---------------------------------------------------------------------------------------------------
# The tool's inputs for the patterns: clear errors naming the field, before anything starts

def _run_bench(monkeypatch, env: dict, **fields):
    from tools.collective_bench import CollectiveBenchParams, run
    from tools.engine.spec import ToolFailure

    for key in ("SLURM_JOB_ID", "SLURM_JOBID", "SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_STEP_ID"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ToolFailure) as failure:
        run(CollectiveBenchParams(backend="gloo", nproc_per_node=1, **fields), lambda *a: None)
    return str(failure.value)


@pytest.mark.parametrize("fields,env,field", [
    ({"pattern": "pairwise"}, {}, "pattern"),
    ({"pattern": "bisect", "hosts": ["n1", "n2"], "node_rank": 0}, {}, "hosts"),   # by hand: rdzv_endpoint too
    ({"pattern": "pairwise", "hosts": ["n1", "n2"], "node_rank": 2, "rdzv_endpoint": "n1:29400"}, {}, "node_rank"),
    ({"pattern": "pairwise", "hosts": ["n1", "n1"], "node_rank": 0, "rdzv_endpoint": "n1:29400"}, {}, "hosts"),
    ({"pattern": "pairwise", "hosts": ["n1", "n2", "n3", "n4"], "node_rank": 0, "rdzv_endpoint": "n1:29400",
      "pair_rounds": 4}, {}, "pair_rounds"),
    ({"pattern": "pairwise", "nodes": ["gpu9", "gpu1"]}, {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[1-4]"},
     "nodes"),
])
def test_pattern_bad_input_names_the_field(monkeypatch, fields, env, field):
    import shutil

    if env and not shutil.which("srun"):
        pytest.skip("srun is not installed: the allocation path is not taken")
    assert _run_bench(monkeypatch, env, **fields).startswith(f"{field}:")


@pytest.mark.parametrize("fields,field", [
    ({"pattern": "pairwise", "partition": "debug", "job_id": "7"}, "job_id"),
    ({"pattern": "pairwise", "partition": "debug", "hosts": ["n1", "n2"], "node_rank": 0,
      "rdzv_endpoint": "n1:29400"}, "hosts"),
    ({"pattern": "all", "job_id": "7", "rdzv_endpoint": "n1:29400"}, "rdzv_endpoint"),
])
def test_partition_and_job_id_bad_combinations_name_the_field(monkeypatch, fields, field):
    assert _run_bench(monkeypatch, {}, **fields).startswith(f"{field}:")
