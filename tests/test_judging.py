"""The one verdict rule (tools/shared/judging.py) and its table (knowledge/data/verdict_rules.toml)."""

import dataclasses

import pytest

from tools.engine.spec import ToolFailure
from tools.shared import judging
from tools.shared.judging import FigureRule, compare, deficit, is_inconclusive, relative_spread, rule_for, threshold

RULE = FigureRule(figure="x", unit="GB/s", better="higher", margin=0.05, k=3.0, spread=0.01, source="test", widest=0.2)


def test_every_rule_is_complete_and_sourced():
    rules = judging.rules()
    assert {"mamf_tflops", "copy_tbps", "matmul_gflops", "copy_gbps", "busbw_gbps", "step_time_s"} <= set(rules)
    for rule in rules.values():
        assert rule.better in ("higher", "lower")
        assert 0 < rule.margin < rule.widest <= 1, rule.figure
        assert rule.k >= 1 and rule.spread >= 0 and rule.unit, rule.figure
        # a source is a sentence, or "as <figure>" naming a rule that has one
        same_as = rule.source.split()[1].rstrip(":,;") if rule.source.startswith("as ") else None
        assert (same_as in rules and len(rules[same_as].source) > 20) if same_as else len(rule.source) > 20, rule.figure


def test_rule_for_unknown_figure_names_the_known_ones():
    with pytest.raises(ToolFailure, match="no verdict rule for figure 'nope'.*mamf_tflops"):
        rule_for("nope")
    assert dataclasses.is_dataclass(rule_for("mamf_tflops"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        rule_for("mamf_tflops").margin = 0.5


def test_deficit_direction():
    assert deficit(90, 100, "higher") == pytest.approx(0.10)
    assert deficit(110, 100, "higher") == pytest.approx(-0.10)
    assert deficit(1.2, 1.0, "lower") == pytest.approx(0.20)
    assert deficit(0.8, 1.0, "lower") == pytest.approx(-0.20)
    assert deficit(5, 0, "higher") == 0.0


def test_threshold_is_the_larger_of_margin_and_k_spreads():
    assert threshold(RULE) == pytest.approx(0.05)              # 3 x 1% < 5%
    assert threshold(RULE, spread=0.03) == pytest.approx(0.09)  # 3 x 3% > 5%
    assert threshold(RULE, spread=0.0) == pytest.approx(0.05)


def test_a_stated_rule_past_100_percent_says_it_judges_nothing_slow():
    """Model round 12 (cl-healthy-allreduce, 8 nodes under load) read "below its reference by more than 130%" as a
    rule no reading can meet, and it is one: the sentence says so."""
    assert "judges none" not in judging.statement(RULE, spread=0.03)
    said = judging.statement(RULE, spread=0.45)
    assert "by more than 135.0%" in said and "cannot fall more than 100% below" in said, said


def test_relative_spread_is_robust_to_one_outlier():
    healthy = [100, 101, 99, 100.5, 99.5, 100, 100.2]
    with_fault = healthy + [40]
    assert relative_spread(healthy) == pytest.approx(relative_spread(with_fault), abs=0.004)
    assert relative_spread(healthy) < 0.01
    assert relative_spread([100, 50]) == 0.0                    # too few values to have a spread
    # scaled MAD of normal noise estimates its sigma: values at median +- 1 sigma
    assert relative_spread([90, 100, 110, 100, 90, 110, 100]) == pytest.approx(1.4826 * 0.10)


def test_inconclusive_when_healthy_spread_exceeds_widest():
    assert not is_inconclusive([100, 101, 99, 100, 98], RULE)
    assert is_inconclusive([100, 60, 140, 80, 120, 100], RULE)   # 3 x 30% spread > widest 20%
    assert not is_inconclusive([100, 50], RULE)                  # too few to judge the spread


def test_compare_names_each_reference_broken():
    breaches = compare(90, RULE, {"fleet median": 100, "expected": 92, "nothing": None})
    assert [b.against for b in breaches] == ["fleet median"]
    assert breaches[0].deficit == pytest.approx(0.10) and breaches[0].threshold == pytest.approx(0.05)
    assert "10.0% worse than the fleet median 100 GB/s (threshold 5.0%)" in breaches[0].sentence("GB/s")
    assert compare(96, RULE, {"fleet median": 100}) == []
    assert compare(90, RULE, {"fleet median": 100}, spread=0.05) == []   # noisy: 3 x 5% = 15% > 10%
    lower = dataclasses.replace(RULE, better="lower")
    assert [b.against for b in compare(1.2, lower, {"fleet median": 1.0})] == ["fleet median"]


def test_the_fleet_sweeps_page_quotes_the_margins_in_the_table():
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parent.parent / "knowledge/orchestration/fleet-sweeps.md").read_text()
    quoted = re.findall(r"`(\w+)`\s+(\d+)%", page)
    assert len(quoted) >= 3, quoted
    for figure, pct in quoted:
        assert rule_for(figure).margin == pytest.approx(int(pct) / 100), figure
    assert "max(margin, k x spread)" in page and "1.4826" in page
