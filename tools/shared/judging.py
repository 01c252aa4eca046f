"""The one verdict rule every tool that names a bad node, GPU or link applies (issue 24).

    A figure is bad when it is worse than its reference (the fleet median of its group, and the
    expected figure where one exists) by more than the larger of a stated margin and k times the
    measured run-to-run spread of that check.

The margins, k and the spreads measured on real machines live in knowledge/data/verdict_rules.toml,
one record per figure, each with its source. fleet_sweep, collective_bench (pairwise, bisect),
results_history and straggler_find judge with the functions here, so a threshold is stated once.

Spread is the scaled median absolute deviation over the median: 1.4826 * MAD / |median|. For normal
noise it estimates the standard deviation as a fraction of the median, and one wild value (the bad
node itself, a busy moment) moves it little, where the standard deviation or the range would swell.

When the healthy figures themselves spread so widely that the threshold grows past the widest one
the check can still answer (`FigureRule.widest`), the answer is "inconclusive", with the spread:
naming culprits out of that noise is how healthy nodes get drained.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from functools import cache
from typing import Literal

from ..engine.data import load_data
from ..engine.spec import ToolFailure

Better = Literal["higher", "lower"]
MAD_TO_SIGMA = 1.4826    # MAD of normal noise x this = its standard deviation
MIN_FOR_SPREAD = 3       # fewer values than this have no spread we can trust (one is the median itself)


@dataclass(frozen=True)
class FigureRule:
    figure: str          # the figure's name, as the tool that measures it declares it
    unit: str
    better: Better
    margin: float        # fraction of the reference: the smallest deficit we call bad on a quiet system
    k: float             # how many spreads a deficit must exceed on a noisy one
    spread: float        # run-to-run spread measured on real machines (fraction; see the module docstring)
    source: str          # where the margin comes from, and where the spread was measured
    widest: float = 0.5  # the largest threshold at which the check still answers; beyond: inconclusive


@dataclass(frozen=True)
class Breach:
    """One figure worse than one reference by more than the rule allows."""
    against: str         # "fleet median" | "expected" | "its own past" | ... (what the reference is)
    value: float
    reference: float
    deficit: float       # fraction worse than the reference
    threshold: float     # fraction it had to exceed

    def sentence(self, unit: str) -> str:
        return (f"{self.value:.4g} {unit} is {self.deficit:.1%} worse than the {self.against} {self.reference:.4g} {unit} "
                f"(threshold {self.threshold:.1%})")


@cache
def rules() -> dict[str, FigureRule]:
    """Every rule in verdict_rules.toml by figure name."""
    table = load_data("verdict_rules")
    out = {}
    for record in table.get("rule", []):
        fields = {name: record[name] for name in FigureRule.__dataclass_fields__ if name in record}
        rule = FigureRule(**fields)
        if rule.better not in ("higher", "lower"):
            raise ToolFailure(f"verdict_rules.toml: {rule.figure}: better must be 'higher' or 'lower', not {rule.better!r}")
        out[rule.figure] = rule
    return out


def rule_for(figure: str) -> FigureRule:
    """The rule of one figure; a figure without one is a mistake in the tool that declares it."""
    try:
        return rules()[figure]
    except KeyError:
        raise ToolFailure(f"no verdict rule for figure {figure!r} in knowledge/data/verdict_rules.toml "
                          f"(rules exist for: {', '.join(sorted(rules()))}); add a [[rule]] with its margin and source") from None


def deficit(value: float, reference: float, better: Better) -> float:
    """How much worse than the reference, as a fraction of it; negative when better; 0 without a reference."""
    if not reference:
        return 0.0
    worse = (reference - value) if better == "higher" else (value - reference)
    return worse / abs(reference)


def relative_spread(values) -> float:
    """Scaled MAD over the median (fraction); 0.0 for fewer than MIN_FOR_SPREAD values or a zero median."""
    values = [v for v in values if v is not None]
    if len(values) < MIN_FOR_SPREAD:
        return 0.0
    median = statistics.median(values)
    if not median:
        return 0.0
    mad = statistics.median(abs(v - median) for v in values)
    return MAD_TO_SIGMA * mad / abs(median)


def threshold(rule: FigureRule, spread: float | None = None) -> float:
    """The deficit a figure must exceed to be bad: max(margin, k x spread), spread the measured one by default."""
    return max(rule.margin, rule.k * (rule.spread if spread is None else spread))


def is_inconclusive(healthy_values, rule: FigureRule) -> bool:
    """True when the healthy figures spread so widely that the threshold passes the widest the check can answer."""
    values = [v for v in healthy_values if v is not None]
    return len(values) >= MIN_FOR_SPREAD and rule.k * relative_spread(values) > rule.widest


def compare(value: float, rule: FigureRule, references: dict[str, float | None],
            spread: float | None = None) -> list[Breach]:
    """Every reference (name -> figure; None skipped) the value is worse than by more than the threshold."""
    limit = threshold(rule, spread)
    out = []
    for against, reference in references.items():
        if reference is None or value is None:
            continue
        short = deficit(value, reference, rule.better)
        if short > limit:
            out.append(Breach(against=against, value=value, reference=reference, deficit=short, threshold=limit))
    return out


def statement(rule: FigureRule, spread: float | None = None) -> str:
    """The rule as applied to one figure, in a sentence a reader can check."""
    measured = rule.spread if spread is None else spread
    limit = threshold(rule, spread)
    said = (f"{rule.figure} is bad when {'below' if rule.better == 'higher' else 'above'} its reference by more than "
            f"{limit:.1%} = max(margin {rule.margin:.1%}, {rule.k:g} x spread {measured:.1%})")
    if rule.better == "higher" and limit >= 1:
        # Model round 12 read "below its reference by more than 130%" as a rule nothing can meet: it is one.
        said += ": a figure cannot fall more than 100% below, so this spread judges none of them slow"
    return said
