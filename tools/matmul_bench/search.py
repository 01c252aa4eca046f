"""Shape search for matmul_bench: find the matmul shape with the highest mean TFLOPS, fast.

Pure logic, no torch: the caller passes `measure(shape, iterations, warmup) -> Timing`, so the
search runs the same against a GPU, a CPU, or a synthetic timing function in the tests.

Why not a grid. A grid spends the full 50 + 100 iterations on every shape, most of which are
clearly behind after a handful of iterations. The search here:

1. screens a coarse set of tile-friendly shapes (powers of two and 1.5x powers of two, plus shapes
   whose output blocks fill whole waves of the GPU's SMs: wave_seeds), then keeps the best third of
   each size class and measures those again for three times as long, and so on (successive halving);
2. refines around the leaders of every size class (from different basins) with a pattern search:
   step each of M, N, K (and M and N together) up and down, move to a better neighbour, halve the
   step when none is better, down to the alignment (256 on GPUs);
3. measures the best shapes of every size class the way the published tables do (warm-up, then the
   mean of `final_iterations`), and reports the best of those means as MAMF. Screening numbers never
   become the answer: a max over many noisy short measurements is biased upwards.

Power caps. An H100/H200 at its 700 W limit lowers its SM clock under a long, dense matmul, with a
lag of tens of milliseconds; a shape with short iterations (gaps between them for the cache flush)
sustains a higher clock. A screen of 3 iterations right after set-up times large shapes in a burst
they cannot sustain, and ranks them first; over 150 iterations a mid-size shape (~2-4k x 2k x 8-12k)
wins. Hence, everywhere above: every measurement lasts a minimum time (warm-up and timed, capped at
the finals' counts), shapes are measured in order of FLOP count (each meets the clock a similar load
sets, as in a grid loop), and leaders are kept per size class (small, medium, large FLOP count) so
that no class crowds out another before it has been measured long enough.

Full clock and sustained. Traced on an H200 (bench/clock_settle.py, docs/benchmarks.md): after a light
load the card runs a matmul at its full clock (~810 TFLOPS) for ~40 ms, then its power controller
steps the clock down and the same shape settles ~4-5% lower within ~100-200 ms; after a heavy load a
shape starts ~10% below its settled level and climbs for ~20-40 ms. A published-way measurement of a
fast shape (50 + 100 iterations of ~0.15 ms) lasts ~25 ms, so it measures mostly the clock that the
shape before it left behind: the grid's best is partly luck of loop order. The finals therefore
measure each finalist from a defined state, twice: from full clock (`cooldown_s` of light load
first, then the published warm-up and iterations): the MAMF; and once it has run `settle_s` at its
own load: the sustained figure, what a long training run gets.
"""

import bisect
import dataclasses
import math
import random
import statistics
import time
from collections.abc import Callable, Iterable, Sequence

Shape = tuple[int, int, int]  # (M, N, K): C[M, N] = A[M, K] @ B[K, N]


def flop(shape: Shape) -> float:
    return 2.0 * shape[0] * shape[1] * shape[2]


@dataclasses.dataclass(frozen=True)
class Timing:
    """Per-iteration times of one shape, in seconds (iterations after warm-up)."""

    shape: Shape
    times_s: tuple[float, ...]

    @property
    def flop(self) -> float:
        m, n, k = self.shape
        return 2.0 * m * n * k

    @property
    def iterations(self) -> int:
        return len(self.times_s)

    @property
    def mean_tflops(self) -> float:
        return self.flop / statistics.fmean(self.times_s) / 1e12

    @property
    def median_tflops(self) -> float:
        return self.flop / statistics.median(self.times_s) / 1e12

    @property
    def max_tflops(self) -> float:
        return self.flop / min(self.times_s) / 1e12


def round_tflops(tflops: float) -> float:
    """One decimal for GPU-sized figures, four significant digits for CPU-sized ones."""
    return round(tflops, 1) if tflops >= 100 else float(f"{tflops:.4g}")


MeasureFn = Callable[[Shape, int, int], Timing | None]  # (shape, iterations, warmup); None = shape skipped
ProgressFn = Callable[[float, str], None]


@dataclasses.dataclass(frozen=True)
class SearchPlan:
    """How hard to look. `quick` and `thorough` below are the GPU plans; `tiny` is for device='cpu'."""

    mn_values: tuple[int, ...]        # coarse values of M and of N
    k_values: tuple[int, ...]         # coarse values of K
    align: int                        # refinement granularity: every dimension is a multiple of this
    max_dim: int                      # refinement never leaves [align, max_dim]
    refine_start_step: int            # first pattern-search step (halved down to `align`)
    screen_iterations: int = 4        # iterations per shape in the first rung
    eta: int = 3                      # keep 1/eta of the shapes per rung, with eta x the iterations
    rungs: int = 3
    refine_seeds: int = 4             # leaders refined by pattern search
    refine_iterations: int = 24
    refine_max_moves: int = 12        # per seed
    final_count: int = 5              # shapes measured the published way at the end
    # Time, not only iteration counts: on a power-capped card the SM clock follows the load with a lag
    # (tens of ms). A shape timed for a millisecond right after set-up (light load) or after smaller
    # shapes runs at a clock it cannot sustain; 100 iterations later it is slower. So every measurement
    # runs at least warmup_min_s of untimed iterations and min_s of timed ones (capped at the finals'
    # counts: a shape is never measured longer than the published way would).
    screen_min_s: float = 0.0         # timed seconds per shape in the first rung (x eta per rung)
    warmup_min_s: float = 0.0         # untimed seconds before the timed ones (first rung; x eta per rung and in refinement)
    refine_min_s: float = 0.0         # timed seconds per shape in the refinement
    classes: int = 3                  # size classes (by FLOP count) screened, refined and finalised separately
    # The finals (see the module docstring): light load before each finalist so it starts at full clock,
    # then, after the published measurement, the same shape until it has run settle_s (timed the same way,
    # only the last `final_iterations` kept) for the sustained figure. 0 turns either off.
    cooldown_s: float = 0.0
    settle_s: float = 0.0

    def coarse_shapes(self) -> list[Shape]:
        return [(m, n, k) for m in self.mn_values for n in self.mn_values for k in self.k_values]


QUICK = SearchPlan(
    mn_values=(1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384),
    k_values=(1024, 2048, 4096, 8192, 12288, 16384),
    align=256, max_dim=16384, refine_start_step=1024,
    screen_iterations=3, refine_seeds=6, refine_iterations=8, refine_max_moves=8, final_count=9,
    screen_min_s=0.002, warmup_min_s=0.002, refine_min_s=0.01, cooldown_s=0.2, settle_s=0.2,
)
THOROUGH = SearchPlan(
    mn_values=(1024, 1536, 2048, 2560, 3072, 4096, 5120, 6144, 8192, 10240, 12288, 14336, 16384, 20480),
    k_values=(1024, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 20480),
    align=128, max_dim=20480, refine_start_step=1024,
    screen_iterations=5, rungs=4, refine_seeds=9, refine_iterations=40, refine_max_moves=20, final_count=12,
    screen_min_s=0.004, warmup_min_s=0.004, refine_min_s=0.02, cooldown_s=0.3, settle_s=0.3,
)
TINY = SearchPlan(  # device='cpu': the same logic on shapes a CPU multiplies in milliseconds
    mn_values=(32, 64, 128, 256), k_values=(64, 256),
    align=32, max_dim=384, refine_start_step=64,
    screen_iterations=3, rungs=2, refine_seeds=2, refine_iterations=5, refine_max_moves=4, final_count=3,
    settle_s=0.005,  # no power controller to wait for: exercises the sustained figure's plumbing only
)
PLANS = {"quick": QUICK, "thorough": THOROUGH, "tiny": TINY}


def wave_seeds(compute_units: int, tile: tuple[int, int] = (128, 256), waves: Sequence[int] = (1, 2),
               k: int = 12288, lo: int = 1024, hi: int = 8192, fill: float = 0.97) -> list[Shape]:
    """Extra screening shapes whose output tiles fill whole waves of the GPU's SMs/CUs.

    A GEMM kernel covers C with tile-sized blocks, one per SM at a time; when the block count is just
    over a multiple of the SM count, the last wave runs nearly empty. (1408, 3072) makes 11 x 12 = 132
    blocks of 128x256: one full wave on a 132-SM H100/H200, a shape no power-of-two grid contains. The
    tile is a hint only (libraries pick their own); these shapes are screened like any other.
    """
    out: list[Shape] = []
    for w in waves:
        blocks = compute_units * w
        for a in range(math.ceil(lo / tile[0]), hi // tile[0] + 1):
            b = blocks // a
            if lo <= b * tile[1] <= hi and a * b >= fill * blocks:
                out += [(a * tile[0], b * tile[1], k), (b * tile[1], a * tile[0], k)]
    return list(dict.fromkeys(out))


@dataclasses.dataclass
class SearchOutcome:
    best: Timing | None                        # the best final mean: MAMF
    finals: list[Timing]                       # final (full-iteration) measurements, best first
    tried: dict[Shape, Timing]                 # every shape measured, with its longest measurement
    iterations_total: int
    elapsed_s: float
    phase_s: dict[str, float]
    skipped: list[Shape] = dataclasses.field(default_factory=list)   # measure() returned None (e.g. no memory)
    stopped_early: bool = False                # the time budget cut a phase short
    errors: list[str] = dataclasses.field(default_factory=list)     # shapes whose measurement raised
    sustained: list[Timing] = dataclasses.field(default_factory=list)  # the finalists after settle_s at their own load, best first

    @property
    def best_sustained(self) -> Timing | None:
        return self.sustained[0] if self.sustained else None

    @property
    def geomean_tflops(self) -> float | None:
        vals = [t.mean_tflops for t in self.tried.values() if t.mean_tflops > 0]
        return math.exp(statistics.fmean(math.log(v) for v in vals)) if vals else None


class Recorder:
    """Wraps measure(): keeps the longest measurement per shape, counts iterations, skips, time."""

    def __init__(self, measure: MeasureFn):
        self.measure = measure
        self.tried: dict[Shape, Timing] = {}
        self.skipped: list[Shape] = []
        self.iterations = 0

    def __call__(self, shape: Shape, iterations: int, warmup: int) -> Timing | None:
        if shape in self.skipped:
            return None
        t = self.measure(shape, iterations, warmup)
        self.iterations += iterations + warmup
        if t is None:
            self.skipped.append(shape)
            return None
        old = self.tried.get(shape)
        if old is None or t.iterations >= old.iterations:
            self.tried[shape] = t
        return t

    def ranked(self) -> list[Timing]:
        return sorted(self.tried.values(), key=lambda t: t.mean_tflops, reverse=True)

    def seconds_per_iteration(self, shape: Shape) -> float | None:
        """A guess from the median throughput measured so far (None before the first measurement)."""
        if not self.tried:
            return None
        ref = statistics.median(t.mean_tflops for t in self.tried.values())
        return flop(shape) / (ref * 1e12) if ref > 0 else None

    def counts(self, shape: Shape, min_s: float, iterations: int, warmup_min_s: float = 0.0, warmup: int = 1,
               cap: tuple[int, int] | None = None) -> tuple[int, int]:
        """(iterations, warm-up) for at least min_s timed and warmup_min_s untimed seconds, and at least
        the given counts; never more than `cap` (the finals' counts) unless the given counts are."""
        per = self.seconds_per_iteration(shape)
        if per:
            iterations = max(iterations, math.ceil(min_s / per))
            warmup = max(warmup, math.ceil(warmup_min_s / per))
        if cap is not None:
            iterations, warmup = min(iterations, max(cap[0], 1)), min(warmup, max(cap[1], 1))
        return iterations, warmup

    def timed(self, shape: Shape, min_s: float, iterations: int, warmup_min_s: float = 0.0, warmup: int = 1,
              cap: tuple[int, int] | None = None) -> Timing | None:
        return self(shape, *self.counts(shape, min_s, iterations, warmup_min_s, warmup, cap))


def class_bounds(shapes: Sequence[Shape], classes: int) -> list[float]:
    """FLOP-count boundaries that split `shapes` into `classes` groups of equal size (small .. large)."""
    f = sorted(flop(s) for s in shapes)
    return [f[len(f) * i // classes] for i in range(1, classes)] if f else []


def size_class(shape: Shape, bounds: Sequence[float]) -> int:
    return bisect.bisect_right(bounds, flop(shape))


def _by_class(timings: Iterable[Timing], bounds: Sequence[float]) -> dict[int, list[Timing]]:
    out: dict[int, list[Timing]] = {}
    for t in sorted(timings, key=lambda t: t.mean_tflops, reverse=True):
        out.setdefault(size_class(t.shape, bounds), []).append(t)
    return out


def successive_halving(rec: Recorder, shapes: Sequence[Shape], plan: SearchPlan,
                       out_of_time: Callable[[], bool], progress: ProgressFn | None = None,
                       share: tuple[float, float] = (0.0, 1.0), bounds: Sequence[float] = (),
                       cap: tuple[int, int] | None = None) -> tuple[list[Timing], bool]:
    """Screen `shapes` in rungs; returns the survivors of the last rung (best first) and whether time ran out.

    Shapes are measured in order of FLOP count, so each follows shapes of similar load (the clock it
    meets is close to the one it sustains), each for at least plan.warmup_min_s + plan.screen_min_s
    (both x eta per rung: the later rungs, which decide between contenders, see the longest load). The halving keeps the best 1/eta of every size class, not of all shapes: the
    large shapes' burst advantage must not crowd the small and medium ones out before they are
    measured long enough to show what they sustain."""
    pool = sorted(shapes, key=flop)
    iterations, min_s, warm_s, cut = plan.screen_iterations, plan.screen_min_s, plan.warmup_min_s, False
    per_class = max(1, math.ceil(plan.refine_seeds / max(plan.classes, 1)))
    survivors: list[Timing] = []
    for rung in range(plan.rungs):
        results = []
        for i, shape in enumerate(pool):
            if out_of_time():
                cut = True
                break
            t = rec.timed(shape, min_s, iterations, warm_s, 1 if rung == 0 else 2, cap)
            if t is not None:
                results.append(t)
            if progress and i % 16 == 0:
                frac = share[0] + (share[1] - share[0]) * (rung + i / max(len(pool), 1)) / plan.rungs
                progress(frac, f"screening rung {rung + 1}/{plan.rungs}: {i}/{len(pool)} shapes, >= {iterations} iterations each")
        if cut:  # the shapes this rung did not reach keep their last measurement (largest shapes come last)
            done = {t.shape for t in results}
            results += [t for t in survivors if t.shape not in done]
        results.sort(key=lambda t: t.mean_tflops, reverse=True)
        survivors = results or survivors
        groups = _by_class(results, bounds)
        if cut or all(len(g) <= per_class for g in groups.values()):
            break
        pool = sorted((t.shape for g in groups.values() for t in g[:max(per_class, math.ceil(len(g) / plan.eta))]), key=flop)
        iterations *= plan.eta
        min_s *= plan.eta
        warm_s *= plan.eta
    return survivors, cut


# Moves of the pattern search: each axis alone, plus M and N together. The diagonal moves matter:
# along M*N ~ constant the number of output tiles (and so the wave fill) barely changes, which is
# how the search walks between the narrow ridges that tile/wave quantisation cuts into the landscape.
_MOVES = [(1, 0, 0), (-1, 0, 0), (0, 1, 0), (0, -1, 0), (0, 0, 1), (0, 0, -1),
          (1, -1, 0), (-1, 1, 0), (1, 1, 0), (-1, -1, 0)]


def _neighbours(shape: Shape, step: int, plan: SearchPlan) -> list[Shape]:
    out = []
    for move in _MOVES:
        dims = tuple(d + sign * step for d, sign in zip(shape, move))
        if all(plan.align <= d <= plan.max_dim for d in dims):
            out.append(dims)
    return out


def pattern_search(rec: Recorder, seed: Shape, plan: SearchPlan, out_of_time: Callable[[], bool],
                   cap: tuple[int, int] | None = None) -> Timing | None:
    """Hill-climb from `seed` in steps of refine_start_step, halving down to plan.align."""
    def measure(shape: Shape) -> Timing | None:
        return rec.timed(shape, plan.refine_min_s, plan.refine_iterations, plan.warmup_min_s * plan.eta, 2, cap)

    current = measure(seed)
    if current is None:
        return None
    step, moves = plan.refine_start_step, 0
    measured: dict[Shape, Timing] = {seed: current}
    while step >= plan.align and moves < plan.refine_max_moves and not out_of_time():
        best = current
        for shape in _neighbours(current.shape, step, plan):
            if out_of_time():
                break
            t = measured.get(shape)
            if t is None:
                t = measure(shape)
                if t is None:
                    continue
                measured[shape] = t
            if t.mean_tflops > best.mean_tflops:
                best = t
        if best is current:
            step //= 2
        else:
            current, moves = best, moves + 1
    return current


def _distinct_top(timings: Iterable[Timing], count: int) -> list[Shape]:
    out: list[Shape] = []
    for t in timings:
        if t.shape not in out:
            out.append(t.shape)
        if len(out) == count:
            break
    return out


def _diverse_top(timings: Sequence[Timing], count: int, min_log2_gap: float = 0.5) -> list[Shape]:
    """The best shapes, skipping any within ~1.4x in every dimension of one already picked (same basin),
    so the refinement starts from different places; topped up with the next best if too few differ."""
    picked: list[Shape] = []
    for t in timings:
        if all(max(abs(math.log2(a / b)) for a, b in zip(t.shape, p, strict=True)) > min_log2_gap for p in picked):
            picked.append(t.shape)
        if len(picked) == count:
            return picked
    return picked + [s for s in _distinct_top(timings, count + len(picked)) if s not in picked][:count - len(picked)]


def _class_seeds(survivors: Sequence[Timing], plan: SearchPlan, bounds: Sequence[float]) -> list[Shape]:
    """Refinement seeds: the leaders (from different basins) of every size class, topped up overall."""
    groups = _by_class(survivors, bounds)
    per_class = max(1, plan.refine_seeds // max(len(groups), 1))
    seeds = [s for c in sorted(groups, reverse=True) for s in _diverse_top(groups[c], per_class)]
    return list(dict.fromkeys([*seeds, *_diverse_top(survivors, plan.refine_seeds)]))[:max(plan.refine_seeds, len(seeds))]


def _class_finalists(ranked: Sequence[Timing], plan: SearchPlan, bounds: Sequence[float]) -> list[Shape]:
    """The finals: the best shapes of every size class, topped up with the best overall."""
    groups = _by_class(ranked, bounds)
    per_class = max(1, plan.final_count // max(len(groups), 1))
    picked = [s for c in sorted(groups) for s in _distinct_top(groups[c], per_class)]
    return list(dict.fromkeys([*picked, *_distinct_top(ranked, plan.final_count)]))[:max(plan.final_count, len(picked))]


CoolDownFn = Callable[[float], None]  # run a light load for this many seconds (the clock climbs back to its maximum)


@dataclasses.dataclass
class Finals:
    fresh: list[Timing]       # from full clock, the published way: best mean first (MAMF)
    sustained: list[Timing]   # after settle_s at the shape's own load: best mean first


def final_measure(rec: Recorder, shapes: Sequence[Shape], iterations: int, warmup: int,
                  progress: ProgressFn | None = None, share: tuple[float, float] = (0.9, 1.0), *,
                  cool_down: CoolDownFn | None = None, cooldown_s: float = 0.0, settle_s: float = 0.0) -> Finals:
    """Measure each finalist the published way (warm-up, then `iterations`), from a defined clock state.

    Before each shape, cool_down(cooldown_s) runs a light load so the shape starts at full clock rather
    than at whatever its predecessor left (on a power-capped card that differs by ~10%). With settle_s,
    the shape then runs on, timed the same way (cache flush between iterations: the same power draw),
    until it has run at least settle_s in all, and the last `iterations` of that give its sustained
    mean. A long shape whose published measurement already lasted settle_s just runs `iterations` more."""
    fresh, sustained = [], []
    for i, shape in enumerate(sorted(shapes, key=flop)):
        if progress:
            progress(share[0] + (share[1] - share[0]) * i / max(len(shapes), 1),
                     f"final: {shape[0]}x{shape[1]}x{shape[2]}, {warmup} warm-up + {iterations} iterations")
        if cool_down is not None and cooldown_s > 0:
            cool_down(cooldown_s)
        t = rec(shape, iterations, warmup)
        if t is None:
            continue
        fresh.append(t)
        if settle_s > 0:
            per = statistics.fmean(t.times_s)
            longer = math.ceil(max(settle_s - (warmup + iterations) * per, 0.0) / per)
            s = rec(shape, longer + iterations, 0)
            if s is not None:
                sustained.append(Timing(shape, s.times_s[-iterations:]))
    return Finals(sorted(fresh, key=lambda t: t.mean_tflops, reverse=True),
                  sorted(sustained, key=lambda t: t.mean_tflops, reverse=True))


SCREEN_SHARE, REFINE_END = 0.5, 0.88  # of the budget: the screen may use up to half, refinement up to 88%


def search(measure: MeasureFn, plan: SearchPlan, *, final_iterations: int, final_warmup: int,
           budget_s: float, clock: Callable[[], float] = time.monotonic,
           progress: ProgressFn | None = None, extra_seeds: Sequence[Shape] = (),
           shuffle_seed: int = 0, cool_down: CoolDownFn | None = None) -> SearchOutcome:
    """Successive halving over plan.coarse_shapes(), pattern search around the leaders, then final.

    The finals always run (they are the answer), so their cool-down and settling time is set aside
    first; of the rest, screening may use up to half and refinement up to 88%: the budget is a target.
    """
    start = clock()
    rec = Recorder(measure)
    phase: dict[str, float] = {}
    finals_s = plan.final_count * (plan.cooldown_s + plan.settle_s)
    search_s = max(budget_s - finals_s, 0.5 * budget_s)

    def past(fraction: float) -> Callable[[], bool]:
        return lambda: clock() - start > fraction * search_s

    shapes = plan.coarse_shapes()
    random.Random(shuffle_seed).shuffle(shapes)  # ties in FLOP count: no systematic order along one axis
    shapes = list(dict.fromkeys([*extra_seeds, *shapes]))
    bounds = class_bounds(shapes, plan.classes)
    cap = (final_iterations, final_warmup)
    survivors, cut1 = successive_halving(rec, shapes, plan, past(SCREEN_SHARE), progress, (0.0, 0.45), bounds, cap)
    phase["screen_s"] = clock() - start

    t0 = clock()
    seeds = _class_seeds(survivors, plan, bounds)
    refine_stop = past(REFINE_END)
    for i, seed in enumerate(seeds):
        if refine_stop():
            break
        if progress:
            progress(0.45 + 0.4 * i / max(len(seeds), 1), f"refining around {seed[0]}x{seed[1]}x{seed[2]}")
        # Each seed gets an equal share of the refinement time left, so climbing among the largest
        # shapes (tens of ms a measurement) cannot use up the time of the small and medium ones.
        seed_end = clock() + (start + REFINE_END * search_s - clock()) / (len(seeds) - i)
        pattern_search(rec, seed, plan, lambda end=seed_end: refine_stop() or clock() > end, cap)
    cut2 = refine_stop()
    phase["refine_s"] = clock() - t0

    t0 = clock()
    finals = final_measure(rec, _class_finalists(rec.ranked(), plan, bounds), final_iterations, final_warmup,
                           progress, (0.85, 1.0), cool_down=cool_down, cooldown_s=plan.cooldown_s, settle_s=plan.settle_s)
    phase["final_s"] = clock() - t0
    return SearchOutcome(best=finals.fresh[0] if finals.fresh else None, finals=finals.fresh,
                         sustained=finals.sustained, tried=rec.tried,
                         iterations_total=rec.iterations, elapsed_s=clock() - start, phase_s=phase,
                         skipped=rec.skipped, stopped_early=cut1 or cut2)


def exhaustive(measure: MeasureFn, shapes: Sequence[Shape], *, iterations: int, warmup: int,
               budget_s: float | None = None, clock: Callable[[], float] = time.monotonic,
               progress: ProgressFn | None = None) -> SearchOutcome:
    """Every shape with full iterations, like the classic finder (mode 'shapes' and 'grid')."""
    start = clock()
    rec = Recorder(measure)
    cut = False
    for i, shape in enumerate(shapes):
        if budget_s is not None and clock() - start > budget_s:
            cut = True
            break
        if progress and (i % 8 == 0 or len(shapes) < 50):
            progress(i / len(shapes), f"shape {i + 1}/{len(shapes)}: {shape[0]}x{shape[1]}x{shape[2]}")
        rec(shape, iterations, warmup)
    ranked = rec.ranked()
    elapsed = clock() - start
    return SearchOutcome(best=ranked[0] if ranked else None, finals=ranked, tried=rec.tried,
                         iterations_total=rec.iterations, elapsed_s=elapsed, phase_s={"measure_s": elapsed},
                         skipped=rec.skipped, stopped_early=cut)


@dataclasses.dataclass(frozen=True)
class Warmup:
    seconds: float
    batches: int
    stable: bool
    last_tflops: float


def warm_until_stable(run_batch: Callable[[], float], *, min_s: float, max_s: float, window: int = 3,
                      tolerance: float = 0.01, clock: Callable[[], float] = time.monotonic) -> Warmup:
    """Run batches until the last `window` batch throughputs agree within `tolerance` (relative).

    A cold card boosts, heats, then settles; timing before it settles flatters the first shapes.
    Stops after max_s even if unstable (the caller reports that). run_batch returns TFLOPS.
    """
    start = clock()
    values: list[float] = []
    while True:
        values.append(run_batch())
        elapsed = clock() - start
        recent = values[-window:]
        stable = len(recent) == window and (max(recent) - min(recent)) <= tolerance * max(recent)
        if (stable and elapsed >= min_s) or elapsed >= max_s:
            return Warmup(seconds=elapsed, batches=len(values), stable=stable, last_tflops=values[-1])


def expand_dims(values: Sequence[int] | None, rng: Sequence[int] | None, field: str) -> list[int]:
    """M/N/K values from an explicit list and/or a classic start/stop/step range (stop inclusive, 0 dropped)."""
    out = list(values or [])
    if rng:
        if len(rng) != 3:
            raise ValueError(f"{field}_range: give three integers START STOP STEP (got {list(rng)})")
        start, stop, step = rng
        if step <= 0 or stop < start or start < 0:
            raise ValueError(f"{field}_range: need 0 <= START <= STOP and STEP > 0 (got {list(rng)})")
        out += [v for v in range(start, stop + 1, step) if v > 0]
    if any(v <= 0 for v in out):
        raise ValueError(f"{field}: dimensions must be positive (got {out})")
    return sorted(set(out))


def grid_shapes(ms: Sequence[int], ns: Sequence[int], ks: Sequence[int]) -> list[Shape]:
    return [(m, n, k) for m in ms for n in ns for k in ks]
