"""When a training log's step time changed: a trend over every step line of the tail, not its first and last lines.

Model rounds 10 and 11 asked for a series: the first line beside the last three shows that the end is slower, not
whether step time crept up or jumped, nor at which step. Here each step line's time is read (a time field and its
number: "step_ms 812.4", "iter_time=0.85", "elapsed time per iteration (ms): 1234.5"; or a number and its unit:
"850 ms"), and the series is summed up as the medians of its first, middle and last thirds and how it changed: a
shift at one step (the split that leaves the least squared error), or a creep (a straight line fits better than
any one split).

A change is said only when the last or middle third moved from the first by more than chance allows (SPREAD_FACTOR
standard errors of a difference of two thirds' medians, one step's spread taken from successive differences, which a
shift or a creep hardly moves) and by at least MIN_SHIFT_PCT; else the series is "steady". Up and down (the middle
third apart from both ends) is "varied"; a shift is said only where the medians on its two sides differ as much.
Rates (tokens/s, it/s, TFLOPS) are not step times and are not read. The values are in the log's own unit, named by
the field or unit they came with; a log whose lines mix fields keeps the field most of its lines carry.
"""

from __future__ import annotations

import re
from collections import Counter
from statistics import median, pstdev
from typing import Literal

from ..engine.spec import Field, Record

MIN_LINES = 12          # fewer step times than this say nothing about a trend: thirds of < 4 lines are noise
MIN_SHIFT_PCT = 5.0     # a shift smaller than this is not said, however quiet the steps
# A change must exceed this many standard errors of the difference of two medians. Measured on 1,000 seeded series
# of steady steps each (normal, 3% sd; and with spikes of 3-10 x): a change said in 0-0.6% of them at 12-60 lines,
# none at 200 (spikes: none); a 15% shift two thirds in is placed (within 2 steps) in 78% of series at 15 lines and
# all at 20, 30 and 60; at 12 lines its later side is shorter than MIN_SIDE (tests/test_step_trend.py).
SPREAD_FACTOR = 3.5
MAD_SCALE = 1.4826      # the MAD of a normal sample times this is its standard deviation
MEDIAN_SE = 1.2533      # the standard error of a median of m normal values is this x sd / sqrt(m)
CLIP_SD = 6.0           # for the fits, a value further than this many sds from its neighbours' median is clipped
MIN_SIDE = 6            # a shift's sides hold at least this many steps (and 5% of the lines): fewer is a spike

# A number that is not the start of a date or a clock ("2024-12-05", "10:00:01"): the lookahead keeps the digits
# from backtracking to a shorter number before the "-" or ":".
NUMBER = r"(\d{1,12}(?:\.\d{1,9})?)(?![\d.:-])"
# A time field, then its number: the field names training loops print (Megatron-LM's "elapsed time per iteration
# (ms)", "step_time", "batch time", our drills' workload's "step_ms"). Bounded repeats only
# (tests/test_door_matching.py).
TIME_FIELD = re.compile(r"(?i)(elapsed time per iteration \(ms\)|step_ms|step[_ ]time(?:_ms|_s)?"
                        r"|iter[_ ]time(?:_ms|_s)?|iteration_time|time_ms|batch[_ ]time)[ \t]{0,4}[:=]?[ \t]{0,4}"
                        + NUMBER)
# A number, then a time unit ("| 850 ms", "took 1.2 s").
TIME_UNIT = re.compile(r"(?i)(?<![\w.])" + NUMBER + r"[ \t]{0,2}(ms|sec|s)\b")
# Last: a bare "time" and its number (PyTorch's examples' "Time 0.469"), read only where no named field or unit is:
# it is also what a "data time 0.01" or a "time=2024-12-05" field says.
BARE_TIME = re.compile(r"(?i)\b(time)\b[ \t]{0,4}[:=]?[ \t]{0,4}" + NUMBER)
# The step's number: after a step word, or the first of PyTorch's examples' "[epoch][step/steps]".
STEP_NUMBER = re.compile(r"(?i)\b(?:step|iter(?:ation)?)\b[ \t:=#]{0,8}(\d{1,12})|\]\[ {0,8}(\d{1,12})/")


class StepTrend(Record):
    log: str = Field(description="The log's file name.")
    unit: str = Field(description="The field or unit the times were read with, as the log prints it.")
    lines: int = Field(description="Step times read from the log's tail.")
    first_step: int | None = Field(None, description="Step number of the first time read, when the lines number steps.")
    last_step: int | None = Field(None, description="Step number of the last time read.")
    thirds: list[float] = Field(description="Median step time of the first, middle and last third of the lines.")
    change_pct: float = Field(description="Last third's median against the first third's, %.")
    shape: Literal["steady", "shift", "creep", "varied"] = Field(description=(
        "steady: no third moved beyond the steps' own spread; shift: at one step (shift_at_step); creep: "
        "gradually, one way; varied: up and down (the middle third apart from both ends)."))
    shift_at_step: int | None = Field(None, description=(
        "Step (or line, counted from 1, where lines carry no step number) from which step time shifted."))
    before: float | None = Field(None, description="Median step time before the shift.")
    after: float | None = Field(None, description="Median step time from the shift on.")
    spread: float = Field(description="One step's own spread, one standard deviation, in the log's unit.")
    bar: float = Field(0.0, description=(
        "How far two thirds' medians had to differ to count as a change (3.5 standard errors, at least 5%)."))


def step_time(line: str) -> tuple[float, str] | None:
    """(time, its field or unit) of one step line; None when it carries no time of a step (a rate only)."""
    field = TIME_FIELD.search(line)
    if field:
        return float(field.group(2)), field.group(1).lower()
    unit = TIME_UNIT.search(line)
    if unit:
        return float(unit.group(1)), unit.group(2).lower()
    bare = BARE_TIME.search(line)
    if bare:
        return float(bare.group(2)), "time"
    return None


def _step_number(line: str) -> int | None:
    found = STEP_NUMBER.search(line)
    return int(found.group(1) or found.group(2)) if found else None


def _noise_sd(times: list[float]) -> float:
    """The steps' own spread, as a standard deviation, from successive differences: a shift or a creep moves the
    series' level but few of its step-to-step differences, so neither inflates it (one level's MAD would)."""
    diffs = [b - a for a, b in zip(times, times[1:])]
    mid = median(diffs)
    # The standard deviation of the differences, each held within 4 MADs of their median: the MAD alone is too
    # loose an estimate at 12-30 lines (it came out low often enough to call 1% of steady series changed), and a
    # spike's two large differences must not swell it either.
    bound = 4 * MAD_SCALE * median(abs(d - mid) for d in diffs)
    held = [min(max(d, mid - bound), mid + bound) for d in diffs]
    return pstdev(held) / 2 ** 0.5


def _clipped(times: list[float], sd: float) -> list[float]:
    """Each value held within CLIP_SD sds of its five neighbours' median: one checkpoint step that took 10 x as long
    moves no fit, and a shift, which the neighbours follow, is kept."""
    out = []
    for i, t in enumerate(times):
        local = median(times[max(0, i - 2):i + 3])
        out.append(min(max(t, local - CLIP_SD * sd), local + CLIP_SD * sd))
    return out


def _best_split(y: list[float], min_side: int) -> tuple[int, float, float]:
    """(index the shift starts at, the split's residual sum of squares, a straight line's) by least squares, each
    side at least min_side values (or the middle, where the series is too short for that)."""
    n = len(y)
    prefix, prefix_sq = [0.0], [0.0]
    for v in y:
        prefix.append(prefix[-1] + v)
        prefix_sq.append(prefix_sq[-1] + v * v)

    def rss(a: int, b: int) -> float:
        total = prefix[b] - prefix[a]
        return (prefix_sq[b] - prefix_sq[a]) - total * total / (b - a)
    lo, hi = min(min_side, n // 2), max(n - min_side, n // 2) + 1
    split_rss, k = min((rss(0, k) + rss(k, n), k) for k in range(lo, hi))
    x_mean, y_mean = (n - 1) / 2, prefix[n] / n
    slope = (sum((x - x_mean) * (v - y_mean) for x, v in enumerate(y))
             / sum((x - x_mean) ** 2 for x in range(n)))
    line_rss = sum((v - y_mean - slope * (x - x_mean)) ** 2 for x, v in enumerate(y))
    return k, split_rss, line_rss


def trend(name: str, lines: list[str]) -> StepTrend | None:
    """The trend of a log's step lines (already picked as step lines, oldest first); None below MIN_LINES times."""
    read = [(t, _step_number(line)) for line in lines if (t := step_time(line)) is not None]
    if not read:
        return None
    unit = Counter(u for (_, u), _ in read).most_common(1)[0][0]
    kept = [(value, step) for (value, u), step in read if u == unit and value > 0]   # a warm-up's 0 is no step time
    if len(kept) < MIN_LINES:
        return None
    times = [v for v, _ in kept]
    steps = [s for _, s in kept]
    numbered = all(s is not None for s in steps)
    n, third = len(times), len(times) // 3
    thirds = [median(times[:third]), median(times[third:n - third]), median(times[-third:])]
    sd = _noise_sd(times)
    out = StepTrend(log=name, unit=unit, lines=n, thirds=[round(t, 4) for t in thirds], shape="steady",
                    first_step=steps[0] if numbered else None, last_step=steps[-1] if numbered else None,
                    change_pct=round((thirds[2] / thirds[0] - 1) * 100, 1), spread=round(sd, 4))
    floor = MIN_SHIFT_PCT / 100 * thirds[0]
    bar = max(_bar(sd, third, third), floor)
    out.bar = round(bar, 4)
    # A shift first: the split that leaves the least squared error, said where the medians on its two sides differ
    # beyond the spread (placed by means, a skewed series' split can fall where the medians agree: round 12's "median
    # 13.6 before, 13.65 after") and each side is level in itself (a bump's edge is no shift). Looked for whatever the
    # thirds say: the last 400 of 3,000 steps 30% slower leave the thirds' medians level (review, 2026-12-05).
    # Placed on values held near their neighbours (a spike moves nothing), each side at least MIN_SIDE steps: a new
    # level held for a few steps only is a spike's.
    k, split_rss, line_rss = _best_split(_clipped(times, sd), max(MIN_SIDE, n // 20))
    before, after = median(times[:k]), median(times[k:])        # medians of the steps as logged: spikes move neither
    if (split_rss <= line_rss and abs(after - before) > max(_bar(sd, k, n - k), floor)
            and _level(times[:k], sd, floor) and _level(times[k:], sd, floor)):
        out.shape = "shift"
        out.shift_at_step = steps[k] if numbered else k + 1
        out.before, out.after = round(before, 4), round(after, 4)
        return out
    rise, fall = thirds[2] - thirds[0], thirds[0] - thirds[2]
    if max(abs(thirds[1] - thirds[0]), abs(thirds[2] - thirds[0])) <= bar:
        return out
    # One way, each third no further back than the bar: a creep; anything else went up and down.
    one_way = ((rise > bar and thirds[1] - thirds[0] > -bar and thirds[2] - thirds[1] > -bar)
               or (fall > bar and thirds[0] - thirds[1] > -bar and thirds[1] - thirds[2] > -bar))
    out.shape = "creep" if one_way and line_rss < split_rss * 1.5 else "varied"
    return out


def _level(side: list[float], sd: float, floor: float) -> bool:
    """Whether one side of a split is level in itself: its halves' medians within the bar."""
    half = len(side) // 2
    return abs(median(side[half:]) - median(side[:half])) <= max(_bar(sd, half, len(side) - half), floor)


def _bar(sd: float, a: int, b: int) -> float:
    """How far the medians of a and b steps must differ to be told apart from the steps' spread."""
    return SPREAD_FACTOR * MEDIAN_SE * sd * (1 / a + 1 / b) ** 0.5


def sentence(t: StepTrend) -> str:
    """The trend in one sentence of the findings."""
    span = f"steps {t.first_step}-{t.last_step}" if t.first_step is not None else f"{t.lines} lines"
    head = (f"Step time in {t.log} ({t.lines} step lines, {span}, {t.unit}): {t.thirds[0]:.4g} in the first third, "
            f"{t.thirds[1]:.4g} in the middle, {t.thirds[2]:.4g} in the last ({t.change_pct:+.0f}%)")
    if t.shape == "steady":
        return head + (f"; steady: no third's median moved by more than chance allows (+-{t.bar:.3g}; one "
                       f"step's own spread +-{t.spread:.3g}).")
    if t.shape == "creep":
        return head + "; it crept, step by step, rather than shifting at one step."
    if t.shape == "varied":
        return head + "; it varied: up and down, neither one shift nor a steady creep (a load that came and went?)."
    where = "step" if t.first_step is not None else "line"
    return (head + f"; it shifted at {where} {t.shift_at_step}: median {t.before:.4g} before, {t.after:.4g} from "
            "there on.")
