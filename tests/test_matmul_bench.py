"""matmul_bench on the CPU: the search against synthetic timing landscapes with a planted best, real tiny
runs on device='cpu', parameter errors, and the verdicts on made-up figures."""

import math
import random
import re
import statistics

import pytest
from pydantic import ValidationError

from tools.matmul_bench import search as ms
from tools.shared.gpu_sampler import decode_reasons, summarize
from tools.matmul_bench.verdict import MatmulRun, compare_to_specs, gpu_spread, judge
from tools.engine.spec import ToolFailure
from tools.matmul_bench import SPEC, MatmulBenchParams


class Landscape:
    """A synthetic GPU: TFLOPS per shape from tile/wave quantisation and K amortisation (like a real GEMM
    library), times a planted bump; per-iteration noise; a fake clock advanced by what measuring costs."""

    def __init__(self, planted=(2304, 1792, 13312), bump=0.08, width=0.35, sms=132, peak=800.0, noise=0.02, seed=0):
        self.planted, self.bump, self.width, self.sms, self.peak, self.noise = planted, bump, width, sms, peak, noise
        self.rng = random.Random(seed)
        self.now = 0.0
        self.calls = 0

    def tflops(self, shape) -> float:
        m, n, k = shape
        tiles = math.ceil(m / 128) * math.ceil(n / 256)
        eff = (m * n) / (math.ceil(tiles / self.sms) * self.sms * 128 * 256)  # wave fill and tile padding
        eff *= k / (k + 1024)                                                   # per-tile fixed cost
        eff *= 1 - 0.03 * max(0.0, math.log2(2 * m * n * k / 1e11))             # big shapes run hotter
        d2 = sum(math.log2(a / b) ** 2 for a, b in zip(shape, self.planted))
        return self.peak * eff * (1 + self.bump * math.exp(-d2 / (2 * self.width ** 2)))

    def clock(self) -> float:
        return self.now

    def measure(self, shape, iterations, warmup):
        self.calls += 1
        t = 2 * shape[0] * shape[1] * shape[2] / (self.tflops(shape) * 1e12)
        self.now += (iterations + warmup) * (t + 40e-6) + 3e-3  # launch overhead and per-shape set-up
        return ms.Timing(shape, tuple(t * (1 + self.rng.gauss(0, self.noise)) for _ in range(iterations)))


class PowerCapped(Landscape):
    """A power-capped card (an H100/H200 at 700 W) on top of the Landscape's tiling model.

    The SM clock (a fraction of its maximum) follows the load with a lag (tau, tens of ms), like a power
    controller: under a long, dense matmul it sinks to `sustained`; a shape whose iterations are short next
    to the gap between them (L2 flush, output refresh) draws less power and sustains a higher clock; the
    set-up between shapes (allocation, random operands) is light, so each new shape starts with a burst.
    Large shapes thus look fast for a few iterations and slow over 150; mid-size ones win under load."""

    def __init__(self, *a, sustained=0.76, gap_s=60e-6, lift=0.6, tau_s=0.05, **kw):
        kw.setdefault("bump", 0.0)
        super().__init__(*a, **kw)
        self.sustained, self.gap_s, self.lift, self.tau_s = sustained, gap_s, lift, tau_s
        self.c = sustained  # warmed up, as both the tool and the bench's grid are

    def tflops(self, shape) -> float:  # at full clock: the clock model replaces the "big shapes run hotter" term
        m, n, k = shape
        return super().tflops(shape) / (1 - 0.03 * max(0.0, math.log2(2 * m * n * k / 1e11)))

    def _full_clock_s(self, shape) -> float:
        return 2 * shape[0] * shape[1] * shape[2] / (self.tflops(shape) * 1e12)

    def target(self, shape) -> float:
        t1 = self._full_clock_s(shape)
        return min(1.0, self.sustained * (1 + self.lift * self.gap_s / (t1 + self.gap_s)))

    def sustained_tflops(self, shape) -> float:
        return self.tflops(shape) * self.target(shape)

    def _relax(self, target, dt):
        self.c += (target - self.c) * (1 - math.exp(-dt / self.tau_s))

    def cool_down(self, seconds):  # a light load: the power cap does not bind, the clock climbs to its maximum
        self._relax(1.0, seconds)
        self.now += seconds

    def measure(self, shape, iterations, warmup):
        self.calls += 1
        t1, target, times = self._full_clock_s(shape), self.target(shape), []
        self._relax(1.0, 3e-3)
        self.now += 3e-3
        for i in range(warmup + iterations):
            t = t1 / self.c
            if i >= warmup:
                times.append(t * (1 + self.rng.gauss(0, self.noise)))
            self._relax(target, t + self.gap_s)
            self.now += t + 40e-6
        return ms.Timing(shape, tuple(times))


def _grid(land):
    dims = range(2048, 14337, 2048)
    return ms.exhaustive(land.measure, ms.grid_shapes(dims, dims, dims), iterations=100, warmup=50, clock=land.clock)


def _search(land, budget_s=60.0, plan=ms.QUICK):
    return ms.search(land.measure, plan, final_iterations=100, final_warmup=50, budget_s=budget_s, clock=land.clock,
                     cool_down=getattr(land, "cool_down", None))


def test_search_finds_planted_best():
    land = Landscape(planted=(2304, 1792, 13312), bump=0.25, width=0.5, noise=0.02)
    out = _search(land)
    near = [(m, n, k) for m in range(256, 4609, 256) for n in range(256, 4609, 256) for k in range(9216, 16385, 512)]
    true_best = max(near, key=land.tflops)
    assert land.tflops(out.best.shape) >= 0.99 * land.tflops(true_best)
    assert all(abs(a - b) <= 768 for a, b in zip(out.best.shape, land.planted)), out.best.shape
    assert out.best.shape not in ms.QUICK.coarse_shapes()  # found by refinement, not by the coarse screen


def test_cpu_plan_finds_planted_best_among_tiny_shapes():
    """The plan device='cpu' uses, on a smooth landscape whose best (224x160x320) is off its coarse grid."""
    planted = (224, 160, 320)

    def measure(shape, iterations, warmup):
        d2 = sum(math.log2(a / b) ** 2 for a, b in zip(shape, planted, strict=True))
        return ms.Timing(shape, (2 * shape[0] * shape[1] * shape[2] / (1e12 * math.exp(-d2)),) * iterations)

    out = ms.search(measure, ms.TINY, final_iterations=5, final_warmup=1, budget_s=60, clock=lambda: 0.0)
    assert out.best.shape == planted and planted not in ms.TINY.coarse_shapes()


@pytest.mark.parametrize("sms", [108, 132, 148, 304])
def test_search_beats_grid_in_a_quarter_of_its_time(sms):
    """The benchmark's claim on a model of the hardware: best >= the 343-shape grid's best, cost <= 1/4."""
    search_land, grid_land = Landscape(sms=sms, seed=1), Landscape(sms=sms, seed=1)
    out, grid = _search(search_land), _grid(grid_land)
    assert search_land.tflops(out.best.shape) >= grid_land.tflops(grid.best.shape)
    assert out.elapsed_s <= grid.elapsed_s / 4
    assert len(grid.tried) == 343


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_search_beats_grid_on_a_power_capped_card(seed):
    """The H200 failure: a 3-iteration screen ranked large shapes first (a burst), their sustained means
    lost to the grid's mid-size winners. Judged like the bench: measured means, the search's against the grid's."""
    search_land, grid_land = PowerCapped(sms=132, seed=seed), PowerCapped(sms=132, seed=seed)
    out, grid = _search(search_land), _grid(grid_land)
    assert out.best.mean_tflops >= grid.best.mean_tflops, (out.best.shape, grid.best.shape)
    # the search's sustained pick holds at least what the grid's best shape holds (the model's true figures)
    assert search_land.sustained_tflops(out.best_sustained.shape) >= search_land.sustained_tflops(grid.best.shape)
    assert out.elapsed_s <= grid.elapsed_s / 4


def test_power_capped_model_has_the_h200_shape():
    """The model itself: big shapes win a 3-iteration burst but lose over 150 iterations to a mid-size one."""
    big, mid = (8448, 16384, 16384), (2048, 2048, 12288)  # whole waves of 128x256 tiles on 132 SMs; 128 tiles
    burst, sustained = PowerCapped(), PowerCapped()
    assert burst.measure(big, 3, 1).mean_tflops > burst.measure(mid, 3, 1).mean_tflops
    assert sustained.measure(big, 100, 50).mean_tflops < sustained.measure(mid, 100, 50).mean_tflops


def test_finals_start_from_full_clock_then_settle():
    """Each finalist, in FLOP order: a cool-down, the published measurement, then the same shape run on for at
    least settle_s, timed the same way, of which the last `iterations` make the sustained figure."""
    events = []

    def measure(shape, iterations, warmup):
        events.append(("measure", shape, iterations, warmup))
        per = 2 * shape[0] * shape[1] * shape[2] / 700e12
        return ms.Timing(shape, tuple(per * (1 + i / 10_000) for i in range(iterations)))  # slowing down as it runs

    shapes = [(4096, 4096, 8192), (2048, 2048, 8192)]
    finals = ms.final_measure(ms.Recorder(measure), shapes, 100, 50, cool_down=lambda s: events.append(("cool", s)),
                              cooldown_s=0.2, settle_s=0.1)
    per_small = 2 * 2048 * 2048 * 8192 / 700e12
    mean_small = per_small * statistics.fmean(1 + i / 10_000 for i in range(100))
    settle_small = math.ceil((0.1 - 150 * mean_small) / mean_small)  # the published 50 + 100 count towards settle_s
    assert events[:3] == [("cool", 0.2), ("measure", (2048, 2048, 8192), 100, 50), ("measure", (2048, 2048, 8192), settle_small + 100, 0)]
    assert [e[0] for e in events[3:]] == ["cool", "measure", "measure"] and events[4][1] == (4096, 4096, 8192)
    small = next(t for t in finals.sustained if t.shape == (2048, 2048, 8192))
    assert small.iterations == 100 and small.times_s[0] == pytest.approx(per_small * (1 + settle_small / 10_000))
    for ranked in (finals.fresh, finals.sustained):  # best mean first
        assert {t.shape for t in ranked} == set(shapes) and ranked[0].mean_tflops >= ranked[1].mean_tflops


def test_a_long_finalist_is_not_settled_twice():
    """A shape whose published measurement already lasted settle_s runs only `iterations` more."""
    calls = []

    def measure(shape, iterations, warmup):
        calls.append((iterations, warmup))
        return ms.Timing(shape, (2e-3,) * iterations)  # 150 x 2 ms = 0.3 s > settle_s

    ms.final_measure(ms.Recorder(measure), [(16384, 16384, 16384)], 100, 50, settle_s=0.2)
    assert calls == [(100, 50), (100, 0)]


def test_power_capped_card_shows_a_sustained_figure_below_the_mamf():
    capped = _search(PowerCapped(sms=132, seed=0))
    assert capped.best_sustained is not None and capped.best_sustained.mean_tflops < 0.98 * capped.best.mean_tflops
    sustained = {t.shape: t.mean_tflops for t in capped.sustained}
    assert all(sustained[t.shape] < t.mean_tflops for t in capped.finals)
    uncapped = _search(Landscape(sms=132, seed=0))  # no power cap: the two figures agree within the noise
    assert uncapped.best_sustained.mean_tflops == pytest.approx(uncapped.best.mean_tflops, rel=0.01)


def test_cool_down_is_what_lifts_the_finals_on_a_power_capped_card():
    """The same search with and without the cool-down hook: without it a short finalist measures the clock its
    predecessor left; with it, the clock the card reaches at that shape."""
    with_cool, without = PowerCapped(sms=132, seed=0), PowerCapped(sms=132, seed=0)
    a = _search(with_cool)
    b = ms.search(without.measure, ms.QUICK, final_iterations=100, final_warmup=50, budget_s=60, clock=without.clock)
    assert a.best.mean_tflops > 1.02 * b.best.mean_tflops


def test_finals_cover_every_size_class():
    land = PowerCapped(sms=132, seed=1)
    out = _search(land)
    bounds = ms.class_bounds(list(dict.fromkeys(ms.QUICK.coarse_shapes())), ms.QUICK.classes)
    classes = {ms.size_class(t.shape, bounds) for t in out.finals}
    assert classes == {0, 1, 2}, [t.shape for t in out.finals]
    assert len(out.finals) >= ms.QUICK.final_count


def test_screen_measures_for_a_minimum_time_capped_at_the_finals():
    rec = ms.Recorder(lambda shape, iterations, warmup: ms.Timing(shape, (2 * shape[0] * shape[1] * shape[2] / 500e12,) * iterations))
    rec((4096, 4096, 4096), 3, 1)  # 0.27 ms at 500 TFLOPS
    iterations, warmup = rec.counts((4096, 4096, 4096), 0.01, 3, 0.004, 1, cap=(100, 50))
    assert iterations == math.ceil(0.01 / (2 * 4096 ** 3 / 500e12)) and warmup == math.ceil(0.004 / (2 * 4096 ** 3 / 500e12))
    assert rec.counts((512, 512, 512), 0.01, 3, 0.004, 1, cap=(100, 50)) == (100, 50)   # short shapes: never past the finals
    assert rec.counts((16384, 16384, 16384), 0.01, 3, 0.004, 1, cap=(100, 50)) == (3, 1)  # long ones: the counts given


@pytest.mark.slow
@pytest.mark.parametrize("sms", [108, 132])
def test_thorough_is_no_worse_than_quick(sms):
    quick_land, thorough_land = Landscape(sms=sms), Landscape(sms=sms)
    quick = _search(quick_land)
    thorough = ms.search(thorough_land.measure, ms.THOROUGH, final_iterations=100, final_warmup=50, budget_s=300,
                         clock=thorough_land.clock)
    assert thorough_land.tflops(thorough.best.shape) >= 0.995 * quick_land.tflops(quick.best.shape)
    assert len(thorough.tried) > len(quick.tried)


def test_refinement_seeds_come_from_different_basins():
    ranked = [ms.Timing(s, (1.0,)) for s in [(2048, 2048, 8192), (2048, 2048, 8448), (2304, 2048, 8192),
                                              (8192, 1024, 4096), (1024, 8192, 4096)]]
    assert ms._diverse_top(ranked, 3) == [(2048, 2048, 8192), (8192, 1024, 4096), (1024, 8192, 4096)]
    assert ms._diverse_top(ranked, 5)[3:] == [(2048, 2048, 8448), (2304, 2048, 8192)]  # topped up in rank order


def test_wave_seeds_fill_whole_waves():
    seeds = ms.wave_seeds(132)
    assert (1408, 3072, 12288) in seeds and (3072, 1408, 12288) in seeds  # 11 x 12 = 132 blocks of 128x256
    def fill(m, n, tm, tn):
        blocks = math.ceil(m / tm) * math.ceil(n / tn)
        return blocks / (math.ceil(blocks / 132) * 132)

    for m, n, _ in seeds:  # full waves with 128x256 blocks, or with 256x128 ones (the transposed seed)
        assert max(fill(m, n, 128, 256), fill(m, n, 256, 128)) >= 0.97 and 1024 <= min(m, n) and max(m, n) <= 8192


def test_wave_seeds_do_not_hurt_the_search():
    plain_land, seeded_land = Landscape(sms=148), Landscape(sms=148)
    plain = _search(plain_land)
    seeded = ms.search(seeded_land.measure, ms.QUICK, final_iterations=100, final_warmup=50, budget_s=60,
                       clock=seeded_land.clock, extra_seeds=ms.wave_seeds(148))
    assert seeded_land.tflops(seeded.best.shape) >= plain_land.tflops(plain.best.shape)
    assert seeded.elapsed_s <= 1.2 * plain.elapsed_s


def test_mamf_comes_from_full_iteration_finals_only():
    land = Landscape(noise=0.05)
    out = _search(land)
    assert out.best.iterations == 100
    assert all(t.iterations == 100 for t in out.finals)
    assert out.best.mean_tflops == max(t.mean_tflops for t in out.finals)
    assert out.iterations_total > 0 and len(out.tried) > len(out.finals)
    assert out.geomean_tflops < out.best.mean_tflops


def test_time_budget_cuts_the_search_but_finals_still_run():
    land = Landscape()
    out = _search(land, budget_s=1.0)
    assert out.stopped_early
    assert out.best is not None and out.best.iterations == 100
    assert out.phase_s["screen_s"] <= ms.SCREEN_SHARE * 1.0 + 0.2  # one measurement may overrun the share


def test_skipped_shapes_do_not_break_the_search():
    land = Landscape()

    def measure(shape, iterations, warmup):  # pretend the largest shapes do not fit in memory
        return None if shape[0] * shape[1] > 8192 * 8192 else land.measure(shape, iterations, warmup)

    out = ms.search(measure, ms.QUICK, final_iterations=20, final_warmup=2, budget_s=60, clock=land.clock)
    assert out.skipped and out.best is not None
    assert out.best.shape[0] * out.best.shape[1] <= 8192 * 8192


def test_warm_until_stable_waits_for_a_plateau():
    now = [0.0]
    values = iter([500, 650, 720, 770, 790, 795, 796, 796, 797, 797, 797])

    def batch():
        now[0] += 1.0
        return next(values)

    w = ms.warm_until_stable(batch, min_s=2, max_s=30, clock=lambda: now[0])
    assert w.stable and w.batches == 7 and w.last_tflops == 796  # 795, 796, 796 within 1%

    now[0] = 0.0
    w = ms.warm_until_stable(lambda: (now.__setitem__(0, now[0] + 1) or 100 * (now[0] % 2 + 1)),
                             min_s=2, max_s=5, clock=lambda: now[0])
    assert not w.stable and w.seconds == 5


def test_expand_dims_like_the_classic_ranges():
    assert ms.expand_dims(None, [2048, 14336, 2048], "m") == [2048, 4096, 6144, 8192, 10240, 12288, 14336]
    assert ms.expand_dims([4096], [0, 1024, 512], "k") == [512, 1024, 4096]  # 0 dropped, merged, sorted
    with pytest.raises(ValueError, match="n_range"):
        ms.expand_dims(None, [10, 5, 1], "n")


# ---------------------------------------------------------------------------------------------- params

@pytest.mark.parametrize("kwargs,field", [
    ({"dtype": "int8"}, "dtype"),
    ({"mode": "fast"}, "mode"),
    ({"m_range": [0, 1024]}, "m_range"),
    ({"k_range": [1024, 0, 256]}, "k_range"),
    ({"n": [0]}, "n"),
    ({"iterations": 0}, "iterations"),
    ({"device": "gpu0"}, "device"),
    ({"time_budget_s": 1}, "time_budget_s"),
])
def test_bad_params_name_the_field(kwargs, field):
    with pytest.raises(ValidationError) as e:
        MatmulBenchParams(**kwargs)
    assert field in str(e.value)


def test_model_level_errors_name_the_field():
    with pytest.raises(ValidationError, match="k or k_range"):
        MatmulBenchParams(mode="shapes", m=[64], n=[64])
    with pytest.raises(ValidationError, match="m: device='cpu' runs tiny shapes"):
        MatmulBenchParams(device="cpu", mode="shapes", m=[4096], n=[64], k=[64])
    with pytest.raises(ValidationError, match="k_range: explicit shapes need mode='shapes' or mode='grid'"):
        MatmulBenchParams(k_range=[1024, 4096, 1024])
    with pytest.raises(ValidationError, match="all_gpus"):
        MatmulBenchParams(device="cpu", all_gpus=True)


def test_fp8_refused_cleanly_on_cpu():
    with pytest.raises(ToolFailure, match="fp8 needs a GPU with fp8 tensor cores"):
        SPEC.run(MatmulBenchParams(device="cpu", dtype="fp8"), lambda f, m: None)


def test_no_gpu_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ToolFailure, match="No GPU visible to torch.*device='cpu'"):
        SPEC.run(MatmulBenchParams(), lambda f, m: None)


# ---------------------------------------------------------------------------------------------- real CPU runs

def test_quick_run_on_cpu_returns_a_complete_result():
    events = []
    r = SPEC.run(MatmulBenchParams(device="cpu", iterations=5, warmup=1, time_budget_s=5),
                 lambda f, m: events.append((f, m)))
    assert r.verdict == "info" and r.device == "cpu" and r.dtype == "bf16"
    assert re.fullmatch(r"\d+x\d+x\d+", r.best_shape)
    assert r.mamf_tflops > 0 and r.best_max_tflops >= r.mamf_tflops
    assert r.sustained_tflops > 0 and r.top_sustained[0].shape == r.sustained_shape and r.top_sustained[0].iterations == 5
    assert {s.shape for s in r.top_sustained} == {s.shape for s in r.top_shapes}
    assert r.top_shapes[0].shape == r.best_shape and r.top_shapes[0].iterations == 5
    assert [s.mean_tflops for s in r.top_shapes] == sorted((s.mean_tflops for s in r.top_shapes), reverse=True)
    assert r.shapes_tried > len(r.top_shapes) and r.geomean_tflops > 0  # a busy CPU makes any ordering flaky
    assert r.spec_tflops is None and r.telemetry["available"] is False
    assert set(r.phase_s) == {"screen_s", "refine_s", "final_s"} and sum(r.phase_s.values()) <= r.wall_time_s
    assert any("device='cpu'" in f for f in r.findings) and "TFLOPS" in r.findings[0]
    fractions = [f for f, _ in events]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0


def test_shapes_mode_on_cpu_measures_exactly_the_given_shapes():
    r = SPEC.run(MatmulBenchParams(device="cpu", mode="shapes", m=[64, 128], n=[64], k_range=[0, 64, 64],
                                   iterations=3, warmup=1, dtype="fp32"), lambda f, m: None)
    assert r.shapes_tried == 2 and {s.shape for s in r.top_shapes} == {"64x64x64", "128x64x64"}


# ---------------------------------------------------------------------------------------------- verdicts

def _judge(**over):
    base = dict(dtype="bf16", device_name="NVIDIA H200", is_cpu=False, mamf_tflops=785.1, best_shape="2048x2048x12288",
                iterations=100, telemetry={}, gpu_rows=[], slow_gpus=[], gpu_median=None, tunableop_missing=False,
                stopped_early=False, budget_s=60, warmup_stable=True, shapes_tried=700, geomean_tflops=600.0,
                wall_time_s=25.0, sustained_tflops=None, sustained_shape=None)
    base.update(over)
    base["comparison"] = compare_to_specs(base["mamf_tflops"], base["dtype"], base["device_name"])
    return judge(MatmulRun(**base))


def test_compare_to_specs_uses_the_data_table():
    c = compare_to_specs(785.1, "bf16", "NVIDIA H200")
    assert c["accelerator_id"] == "h200" and c["spec_tflops"] == pytest.approx(989.4)
    assert c["efficiency_pct"] == pytest.approx(79.4, abs=0.1)
    assert c["vs_published_pct"] == pytest.approx(98.8, abs=0.1)
    assert compare_to_specs(1400, "fp8", "NVIDIA H100 80GB HBM3")["vs_published_pct"] is None
    assert compare_to_specs(10, "bf16", "Mystery Accelerator 9000")["accelerator_id"] is None


@pytest.mark.parametrize("mamf,verdict", [(785.1, "ok"), (700.0, "warn"), (550.0, "fail")])
def test_verdict_against_published_mamf(mamf, verdict):
    v, findings, nxt = _judge(mamf_tflops=mamf)
    assert v == verdict
    assert f"{100 * mamf / 794.5:.1f}%" in findings[1]
    assert (nxt[0] == "gpu_health") == (verdict != "ok")


@pytest.mark.parametrize("sustained,verdict", [(760.0, "ok"), (690.0, "warn"), (560.0, "fail")])
def test_published_mamf_is_compared_with_the_sustained_figure(sustained, verdict):
    """The published MAMF was measured on a warm card, shape after shape: the sustained figure is measured that
    way, so it decides (healthy H200s held 93-98%, docs/benchmarks.md). The burst (after a 0.2 s cool-down, here
    815 = 102.6% of 794.5) is reported as extra information and never makes a verdict by itself."""
    v, findings, nxt = _judge(mamf_tflops=815.0, sustained_tflops=sustained, sustained_shape="2816x1536x11264")
    assert v == verdict
    assert any(f.startswith(f"Sustained {sustained:.4g} TFLOPS at 2816x1536x11264, measured like the published MAMF")
               and f"is {sustained / 794.5:.1%} of it" in f for f in findings)
    burst = next(f for f in findings if f.startswith("Burst: 815 TFLOPS"))
    assert "102.6% of the published figure" in burst and "not the figure to compare" in burst
    assert (nxt[0] == "gpu_health") == (verdict != "ok")


def test_throttling_warns_and_points_to_gpu_health():
    tel = summarize([{"sm_clock_mhz": 1400, "power_w": 690.0, "temperature_c": 91, "reasons": 0x40 | 0x4}] * 10
                    + [{"sm_clock_mhz": 1980, "power_w": 500.0, "temperature_c": 80, "reasons": 0}] * 10,
                    max_sm_clock_mhz=1980, power_limit_w=700)
    assert tel["throttled"] and tel["reasons_fraction"]["hw_thermal_slowdown"] == 0.5
    v, findings, nxt = _judge(telemetry=tel)
    assert v == "warn" and nxt[0] == "gpu_health"
    assert any("hw_thermal_slowdown in 50%" in f for f in findings)
    assert any("SM clock median 1690 MHz" in f and "temperature max 91 C" in f for f in findings)


def test_power_cap_alone_is_not_a_warning():
    tel = summarize([{"sm_clock_mhz": 1750, "power_w": 699.0, "temperature_c": 70, "reasons": 0x4}] * 5, 1980, 700)
    v, findings, _ = _judge(telemetry=tel)
    assert v == "ok" and not tel["throttled"] and any("power limit in 100%" in f for f in findings)


def test_rocm_without_tunableop_warns():
    v, findings, nxt = _judge(device_name="AMD Instinct MI300X", mamf_tflops=660.0, tunableop_missing=True)
    assert v == "warn" and any("PYTORCH_TUNABLEOP_ENABLED" in f for f in findings)
    assert "knowledge://compute/amd.md" in nxt


def test_all_gpus_names_the_slow_gpu():
    rows, slow, median = gpu_spread([(0, "H200", 780.0, "a", 760.0), (1, "H200", 782.0, "a", 761.0),
                                     (2, "H200", 779.0, "a", 759.0), (3, "H200", 700.0, "b", 690.0)])
    assert slow == [3] and median == pytest.approx(779.5) and rows[3]["vs_median_pct"] == pytest.approx(-10.2, abs=0.1)
    v, findings, _ = _judge(gpu_rows=rows, slow_gpus=slow, gpu_median=median)
    assert v == "warn" and any(f.startswith("GPU 3 (H200) reached 700.0 TFLOPS, 10.2% below") for f in findings)
    rows, slow, median = gpu_spread([(0, "H200", 780.0, "a", None)])
    assert slow == [] and _judge(gpu_rows=rows, slow_gpus=slow, gpu_median=median)[0] == "ok"


def test_all_gpus_names_a_gpu_that_bursts_fine_but_does_not_hold():
    """A lowered power limit: full clock in a burst like its neighbours, less once settled."""
    rows, slow, median = gpu_spread([(0, "H200", 810.0, "a", 776.0), (1, "H200", 808.0, "a", 775.0),
                                     (2, "H200", 809.0, "a", 700.0)])
    assert slow == [2] and rows[2]["vs_median_pct"] == pytest.approx(0.0, abs=0.2)
    assert rows[2]["sustained_vs_median_pct"] == pytest.approx(-9.7, abs=0.1)
    v, findings, _ = _judge(gpu_rows=rows, slow_gpus=slow, gpu_median=median)
    assert v == "warn" and any(f.startswith("GPU 2 (H200) reaches 809.0 TFLOPS from full clock but holds only 700.0")
                               for f in findings)


def test_unknown_card_and_other_dtypes_are_info():
    assert _judge(device_name="Mystery Accelerator 9000")[0] == "info"
    v, findings, _ = _judge(dtype="fp8", mamf_tflops=1450.0)
    assert v == "info" and "73.3% of the 1978.9 TFLOPS datasheet peak" in findings[0]


def test_decode_throttle_reasons():
    assert decode_reasons(0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]
    assert summarize([])["available"] is False


def test_runs_as_a_subprocess_tool_through_the_runner():
    """What the server and CLI do: child process, JSON lines, result stored with its headline metric."""
    from tools.engine import store
    from tools.engine.runner import execute

    r = execute(SPEC, MatmulBenchParams(device="cpu", mode="shapes", m=[64], n=[64], k=[64, 128], iterations=3,
                                        warmup=1, dtype="fp32"), timeout_s=120)
    assert r.shapes_tried == 2 and r.result_id is not None and r.best_shape in {"64x64x64", "64x64x128"}
    assert store.query("matmul_bench")[0]["metric_value"] == r.mamf_tflops


class FakeNvml:
    """The NVML calls the samplers make, answering like a hot, power-capped H200. Every method name must
    exist in the real pynvml, so a typo in the tools fails here rather than on the GPU machine."""

    NVML_CLOCK_SM, NVML_TEMPERATURE_GPU = 1, 0

    def __init__(self):
        self.polls = 0

    def nvmlDeviceGetMaxClockInfo(self, h, kind): return 1980
    def nvmlDeviceGetEnforcedPowerLimit(self, h): return 700_000
    def nvmlDeviceGetPowerUsage(self, h): return 698_500
    def nvmlDeviceGetTemperature(self, h, kind): return 88
    def nvmlDeviceGetCurrentClocksEventReasons(self, h): return 0x4 | 0x20
    def nvmlDeviceGetMaxPcieLinkGeneration(self, h): return 5
    def nvmlDeviceGetMaxPcieLinkWidth(self, h): return 16
    def nvmlDeviceGetPciInfo(self, h): return type("Pci", (), {"busId": b"00000000:18:00.0"})()
    def nvmlDeviceGetCurrPcieLinkWidth(self, h): return 16

    def nvmlDeviceGetClockInfo(self, h, kind):
        self.polls += 1
        return 1500 + self.polls

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):  # idle Gen1 first, Gen5 once the copy runs
        self.polls += 1
        return 1 if self.polls < 3 else 5


def test_samplers_read_nvml_with_the_real_function_names(monkeypatch):
    import time

    import pynvml

    from tools.shared import gpu_sampler as _gpu_sampler
    from tools.memory_bandwidth_bench import measure as _membw_measure

    fake = FakeNvml()
    missing = [n for n in dir(FakeNvml) if n.startswith("nvml") and not hasattr(pynvml, n)]
    assert not missing, missing
    monkeypatch.setattr(_gpu_sampler, "nvml_handle_for_torch_device", lambda index: (fake, "h"))
    with _gpu_sampler.GpuSampler(0, interval_s=0.01) as sampler:
        time.sleep(0.2)
    tel = sampler.summary()
    assert tel["available"] and tel["samples"] >= 5 and tel["max_sm_clock_mhz"] == 1980 and tel["power_limit_w"] == 700
    assert tel["reasons_fraction"] == {"sw_power_cap": 1.0, "sw_thermal_slowdown": 1.0} and tel["throttled"]
    assert tel["temperature_max_c"] == 88 and tel["sm_clock_min_mhz"] > 1500

    fake.polls = 0
    with _membw_measure.PcieWatcher(0) as link:
        time.sleep(0.4)
    assert (link.gen, link.width, link.max_gen, link.max_width, link.bus_id) == (5, 16, 5, 16, "00000000:18:00.0")


def test_fp8_code_path_runs_where_torch_can_execute_it():
    """fp8 is refused on the CPU for users (meaningless figures), but torch can run _scaled_mm there: drive
    the GPU code path's operand layout and call on the CPU so a wrong argument fails here, not on the GPU."""
    import torch

    from tools.matmul_bench.measure import MatmulTimer

    timer = MatmulTimer("cpu", "bf16")
    timer.fp8, timer.fp8_dtype, timer.out_dtype = True, torch.float8_e4m3fn, torch.bfloat16
    timer.scale = torch.ones((), dtype=torch.float32)
    a, b, c = timer._operands((32, 48, 64))
    assert a.dtype == b.dtype == torch.float8_e4m3fn and b.shape == (64, 48) and b.stride() == (1, 64)  # column-major
    out = timer._op(a, b, c)()
    assert out.shape == (32, 48) and out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), a.float() @ b.float(), rtol=0.02, atol=0.5)
    assert timer.measure((32, 48, 64), 2, 1).iterations == 2


def test_a_failing_shape_is_skipped_until_too_many_fail():
    from tools.matmul_bench.measure import MatmulTimer, Unsupported

    timer = MatmulTimer("cpu", "fp32")

    def broken_op(a, b, c):
        def op():
            raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED when calling cublasGemmEx\nmore")
        return op

    timer._op = broken_op
    assert timer.measure((64, 64, 64), 2, 0) is None
    assert timer.errors == ["64x64x64: CUBLAS_STATUS_NOT_SUPPORTED when calling cublasGemmEx"]
    with pytest.raises(Unsupported, match="10 shapes failed"):
        for i in range(9):
            timer.measure((64, 64, 64 + 16 * i), 2, 0)


def test_apple_and_intel_gpus_are_named_as_unsupported(monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    with pytest.raises(ToolFailure, match="Apple GPUs are not supported by matmul_bench yet"):
        SPEC.run(MatmulBenchParams(), lambda f, m: None)


def test_all_gpus_assembly_names_the_slow_gpu(monkeypatch):
    """The all_gpus flow of run() with four fake GPUs (the GPU machine has one): GPU 2 is 8% slow."""
    import types

    from tools import matmul_bench
    from tools.shared.gpu_sampler import summarize

    speed = {0: 1.0, 1: 0.99, 2: 0.92, 3: 1.005}
    fake_torch = types.SimpleNamespace(
        cuda=types.SimpleNamespace(device_count=lambda: 4, get_device_name=lambda i: "NVIDIA H200"),
        version=types.SimpleNamespace(hip=None))
    calls = []

    def fake_measure(device, params, progress, share, plan_shapes=None):
        calls.append((device, plan_shapes))
        shapes = plan_shapes or [(2048, 2048, 12288), (2048, 2048, 13312)]
        finals = sorted((ms.Timing(s, (2 * s[0] * s[1] * s[2] / (790e12 * speed[device] * (1 - i / 100)),) * 100)
                         for i, s in enumerate(shapes)), key=lambda t: -t.mean_tflops)
        outcome = ms.SearchOutcome(best=finals[0], finals=finals, sustained=finals[::-1], tried={t.shape: t for t in finals},
                                   iterations_total=300, elapsed_s=1.0, phase_s={})
        return outcome, ms.Warmup(3.0, 6, True, 780.0), summarize([])

    monkeypatch.setattr(matmul_bench, "_gpu_environment", lambda params: fake_torch)
    monkeypatch.setattr(matmul_bench, "_measure_device", fake_measure)
    r = matmul_bench.run(MatmulBenchParams(all_gpus=True), lambda f, m: None)
    assert [c[0] for c in calls] == [0, 1, 2, 3]
    assert calls[1][1] == [(2048, 2048, 12288), (2048, 2048, 13312)]  # the others re-measure GPU 0's finalists
    assert [g.device for g in r.gpus] == [0, 1, 2, 3] and r.slow_gpus == [2]
    assert r.verdict == "warn" and any(f.startswith("GPU 2 (NVIDIA H200) reached") for f in r.findings)
    assert r.mamf_tflops == pytest.approx(790.0, abs=0.1) and r.vs_published_pct == pytest.approx(99.4, abs=0.1)
