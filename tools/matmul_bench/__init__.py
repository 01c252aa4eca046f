"""matmul_bench — maximum achievable matmul TFLOPS (MAMF) of a GPU, its best shape, and how it compares.

Instead of timing every shape of a grid for 150 iterations, it screens tile-friendly shapes for a
few milliseconds each (in order of size, so each meets the clock a similar load sets), gives more
time only to the contenders of each size class (successive halving), refines around the leaders of
small, medium and large shapes alike, and measures the finalists of every class the published way
(mean of 100 iterations after 50 warm-up), each from full clock (after a light load: the MAMF) and
again once it has run a while at its own load (the sustained figure). On power-capped cards (H100/H200
at 700 W) the two differ by 4-7%, and a shape measured the published way without a defined start
measures mostly the clock its predecessor left. See tools/matmul_bench/search.py for the search and
tools/matmul_bench/measure.py for how a shape is timed.

By hand:
    mleng run matmul_bench                                  # GPU 0, bf16, quick (~30 s)
    mleng run matmul_bench --dtype fp8 --mode thorough --device 3
    mleng run matmul_bench --all-gpus                       # every GPU of this node, flags slow ones
    mleng run matmul_bench --mode shapes --m 4096 --n 4096 --k 4096
    mleng run matmul_bench --mode grid --m-range 1024 16384 1024 --n 4096 --k 4096
    srun --ntasks-per-node=1 --gpus-per-node=8 mleng run matmul_bench --all-gpus --json   # every node
    mleng run matmul_bench --device cpu --iterations 5 --warmup 1    # the search on tiny CPU shapes
"""

import os
import time
from typing import Annotated, Literal

from pydantic import ConfigDict, field_validator, model_validator

from . import search
from ..engine.figures import Figure, Measured, SweepContract
from ..engine.spec import Field, Params, Record, Result, ToolFailure, ToolSpec, present
from ..engine.processes import local_gpu_count
from ..engine.rendering import short_repr

PUBLISHED_GRID = list(range(2048, 14337, 2048))  # 343 shapes: the reference grid of bench/mamf_vs_grid.py
CPU_MAX_DIM = 1024
MAX_DIM = 65536      # largest M, N or K accepted
MAX_SHAPES = 100_000  # shapes in one shapes/grid run
Dim = Annotated[int, Field(ge=1, le=MAX_DIM)]
RangeValue = Annotated[int, Field(ge=0, le=MAX_DIM)]
RANGE_SHAPE = {"anyOf": [{"maxItems": 0}, {"minItems": 3}]}   # empty, or START STOP STEP
# quick: warm-up included. On an H200 a quick run takes ~22 s: warm-up ~3.5, screen ~8.7, refinement ~5,
# finals ~4.7 (most of it cool-downs and settling); a quarter of the 343-shape grid's ~90 s is ~22 s. The
# budget only guards slower cards, where it drops the largest shapes' last rungs first.
DEFAULT_BUDGET_S = {"quick": 30.0, "thorough": 300.0}


def _shape_rules() -> dict:
    """The mode rules as JSON Schema: quick/thorough (also the default) take no shapes; shapes needs each of
    M, N, K; device='cpu' takes dimensions up to CPU_MAX_DIM and not all_gpus."""
    no_shapes = {"properties": {f: {"maxItems": 0} for f in ("m", "n", "k", "m_range", "n_range", "k_range")}}
    searching = {"anyOf": [{"not": {"required": ["mode"]}}, {"properties": {"mode": {"enum": ["quick", "thorough"]}}}]}
    each_dim = [{"anyOf": [present(d, minItems=1), present(f"{d}_range", minItems=1)]} for d in "mnk"]
    small = {"items": {"maximum": CPU_MAX_DIM}}
    return {"allOf": [
        {"anyOf": [{"not": searching}, no_shapes]},
        {"anyOf": [{"not": present("mode", const="shapes")}, {"allOf": each_dim}]},
        {"anyOf": [{"not": present("device", const="cpu")},
                   {"properties": {"all_gpus": {"const": False}, **{f: small for f in ("m", "n", "k")},
                                   **{f"{d}_range": small for d in "mnk"}}}]}]}


class MatmulBenchParams(Params):
    model_config = ConfigDict(json_schema_extra=_shape_rules())

    dtype: Literal["bf16", "fp16", "tf32", "fp32", "fp8"] = Field(
        "bf16", description="fp8: e4m3; tf32: fp32 on TF32 cores; fp32: TF32 off.")
    mode: Literal["quick", "thorough", "shapes", "grid"] = Field(
        "quick", description=(
            "quick ~30 s, thorough ~5 min, shapes (m/n/k given), grid (every M x N x K)."))
    m: list[Dim] = Field(default_factory=list, max_length=512, description="M values (shapes/grid).")
    n: list[Dim] = Field(default_factory=list, max_length=512, description="N values (shapes/grid).")
    k: list[Dim] = Field(default_factory=list, max_length=512, description="K values, the reduction dim (shapes/grid).")
    m_range: list[RangeValue] = Field(default_factory=list, max_length=3, json_schema_extra=RANGE_SHAPE, description=(
        "[START, STOP, STEP], STOP included (shapes/grid)."))
    n_range: list[RangeValue] = Field(default_factory=list, max_length=3, json_schema_extra=RANGE_SHAPE, description=(
        "As m_range."))
    k_range: list[RangeValue] = Field(default_factory=list, max_length=3, json_schema_extra=RANGE_SHAPE, description=(
        "As m_range."))
    device: Annotated[int, Field(ge=0)] | Literal["cpu"] = Field(
        0, description="GPU index, or 'cpu' (tiny shapes, for tests).")
    all_gpus: bool = Field(False, description="Every GPU in turn; flags any >5% below the median.")
    time_budget_s: float | None = Field(
        None, ge=5, le=7200, description="Default: quick 30 s, thorough 300 s.")
    iterations: int = Field(100, ge=1, le=10000, description="Timed per final shape; MAMF is the best mean.")
    warmup: int = Field(50, ge=0, le=10000, description="Untimed per final shape.")

    @field_validator("m_range", "n_range", "k_range")
    @classmethod
    def _range_shape(cls, v: list[int]) -> list[int]:
        if v and (len(v) != 3 or v[2] <= 0 or v[0] < 0 or v[1] < v[0]):
            raise ValueError(f"give START STOP STEP with 0 <= START <= STOP and STEP > 0 (got {short_repr(v)})")
        if v and v[1] > MAX_DIM:
            raise ValueError(f"STOP is at most {MAX_DIM} (the largest dimension measured); got {v[1]}")
        return v

    @field_validator("m", "n", "k")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        if any(x < 1 or x > MAX_DIM for x in v):
            raise ValueError(f"dimensions must be between 1 and {MAX_DIM} (got {short_repr(v)})")
        return v

    @model_validator(mode="after")
    def _consistent(self):
        if self.mode == "shapes":
            missing = [d for d in "mnk" if not (getattr(self, d) or getattr(self, f"{d}_range"))]
            if missing:
                raise ValueError(f"mode='shapes' needs {', '.join(f'{d} or {d}_range' for d in missing)}")
        given = [f for f in ("m", "n", "k", "m_range", "n_range", "k_range") if getattr(self, f)]
        if given and self.mode in ("quick", "thorough"):
            raise ValueError(f"{given[0]}: explicit shapes need mode='shapes' or mode='grid' (mode={self.mode!r} searches by itself)")
        if self.all_gpus and self.device == "cpu":
            raise ValueError("all_gpus=true measures GPUs; it cannot be combined with device='cpu'")
        if self.device == "cpu":
            for d in "mnk":
                largest = self.largest_dim(d)
                if largest > CPU_MAX_DIM:
                    raise ValueError(f"{d}: device='cpu' runs tiny shapes only (each dimension <= {CPU_MAX_DIM}); got {largest}")
        # Counted, never expanded: a range of 30 million values costs nothing to refuse.
        counts = {d: self.dim_count(d) or len(PUBLISHED_GRID) for d in "mnk"}
        n_shapes = counts["m"] * counts["n"] * counts["k"]
        if self.mode in ("shapes", "grid") and n_shapes > MAX_SHAPES:
            sizes = " x ".join(f"{counts[d]} {d}" for d in "mnk")
            raise ValueError(f"m/n/k (m_range, n_range, k_range): {sizes} is {n_shapes} shapes, too many for one "
                             f"run (at most {MAX_SHAPES}); use mode='quick' or coarser ranges (a larger STEP)")
        return self

    def dim_count(self, d: str) -> int:
        """How many distinct values dims(d) would hold, counted without building them."""
        values, rng = set(getattr(self, d)), getattr(self, f"{d}_range")
        if not rng:
            return len(values)
        start, stop, step = rng
        in_range = (stop - start) // step + 1 - (1 if start == 0 else 0)
        return in_range + sum(1 for v in values if not (start <= v <= stop and (v - start) % step == 0))

    def largest_dim(self, d: str) -> int:
        values, rng = getattr(self, d), getattr(self, f"{d}_range")
        top = rng[0] + (rng[1] - rng[0]) // rng[2] * rng[2] if rng else 0
        return max([top, *values])

    def dims(self, d: str) -> list[int]:
        return search.expand_dims(getattr(self, d), getattr(self, f"{d}_range"), d)


class ShapeRow(Record):
    shape: str = Field(description="M x N x K (C[M,N] = A[M,K] @ B[K,N]).")
    iterations: int = Field(description="Timed iterations behind these figures.")
    mean_tflops: float = Field(description="Mean over the iterations, TFLOPS (1e12 FLOP/s, 2*M*N*K per matmul).")
    median_tflops: float = Field(description="Median, TFLOPS.")
    max_tflops: float = Field(description="Fastest iteration, TFLOPS.")


class GpuRow(Record):
    device: int = Field(description="torch GPU index.")
    name: str = Field(description="Device name as torch reports it.")
    mamf_tflops: float | None = Field(None, description="Best mean over the finalist shapes, TFLOPS.")
    best_shape: str | None = Field(None, description="Shape of that best mean.")
    sustained_tflops: float | None = Field(None, description="Best mean of the finalists once settled at their own load, TFLOPS.")
    vs_median_pct: float | None = Field(None, description="MAMF's difference from the node median, percent (negative = slower).")
    sustained_vs_median_pct: float | None = Field(None, description="Sustained figure's difference from the node median, percent.")


class MatmulBenchResult(Result):
    device: str | None = Field(None, description="'cuda:N' or 'cpu'.")
    device_name: str | None = Field(None, description="Device name as torch reports it.")
    accelerator_id: str | None = Field(None, description="Matching record in knowledge/data/accelerators.toml.")
    dtype: str | None = Field(None, description="Input dtype measured.")
    mamf_tflops: float | None = Field(None, description="MAMF: the best per-shape mean, TFLOPS (1e12 FLOP/s); in quick and "
                                      "thorough modes each finalist is measured from full clock (after a light load).")
    best_shape: str | None = Field(None, description="M x N x K of the MAMF.")
    sustained_tflops: float | None = Field(None, description="The finalists' best mean once each has run ~0.2 s at its own "
                                           "load (quick/thorough): what a long job holds; below the MAMF on a power-capped card.")
    sustained_shape: str | None = Field(None, description="M x N x K of the sustained figure.")
    best_median_tflops: float | None = Field(None, description="Median of the best shape, TFLOPS.")
    best_max_tflops: float | None = Field(None, description="Fastest single iteration of the best shape, TFLOPS.")
    spec_tflops: float | None = Field(None, description="Datasheet dense peak for this dtype, TFLOPS.")
    efficiency_pct: float | None = Field(None, description="MAMF / datasheet peak, percent.")
    published_mamf_tflops: float | None = Field(None, description="Published measured bf16 MAMF of this accelerator, TFLOPS.")
    vs_published_pct: float | None = Field(None, description="Burst MAMF / published MAMF, percent (bf16/fp16 only): extra "
                                           "information, the burst starts from full clock.")
    sustained_vs_published_pct: float | None = Field(None, description=(
        "Sustained / published MAMF, percent: the comparison the verdict uses (the published figure was measured on "
        "a warm card, shape after shape)."))
    geomean_tflops: float | None = Field(None, description="Geometric mean of the mean TFLOPS of every shape tried.")
    shapes_tried: int = Field(0, description="Distinct shapes measured.")
    iterations_total: int = Field(0, description="Matmuls run, warm-up included.")
    wall_time_s: float | None = Field(None, description="Wall time of the measurement, seconds (warm-up included).")
    warmup_s: float | None = Field(None, description="Seconds spent warming the card until its throughput was stable.")
    warmup_stable: bool | None = Field(None, description="Whether the warm-up reached a stable throughput over 3 batches "
                                          "(within 1% for shapes/grid, 2% before a search).")
    stopped_early: bool = Field(False, description="The time budget cut the search or grid short.")
    phase_s: dict[str, float] = Field(default_factory=dict, description="Seconds per phase: screen_s (successive "
                                      "halving), refine_s (pattern search), final_s (finalists); measure_s for shapes/grid.")
    top_shapes: list[ShapeRow] = Field(default_factory=list, description="The final measurements from full clock, best first (at most 10).")
    top_sustained: list[ShapeRow] = Field(default_factory=list, description="The same finalists once settled, best first (at most 10).")
    telemetry: dict = Field(default_factory=dict, description="NVML samples during the run: SM clock (MHz), power (W), "
                            "temperature (C), fraction of samples with each clock-event (throttle) reason.")
    gpus: list[GpuRow] = Field(default_factory=list, description="With all_gpus: one row per GPU.")
    slow_gpus: list[int] = Field(default_factory=list, description="With all_gpus: GPUs more than 5% below the node median.")


def _shape_str(shape) -> str:
    return "x".join(str(d) for d in shape)


def _row(t: search.Timing) -> ShapeRow:
    r = search.round_tflops
    return ShapeRow(shape=_shape_str(t.shape), iterations=t.iterations, mean_tflops=r(t.mean_tflops),
                    median_tflops=r(t.median_tflops), max_tflops=r(t.max_tflops))


def _gpu_environment(params: MatmulBenchParams):
    """torch module for a GPU run, or a ToolFailure that says what is missing."""
    try:
        import torch
    except ImportError:
        raise ToolFailure("matmul_bench needs torch in this Python environment (pip install torch).") from None
    if not torch.cuda.is_available():
        for backend, what in (("xpu", "Intel GPUs"), ("mps", "Apple GPUs"), ("hpu", "Intel Gaudi")):
            mods = (getattr(torch, backend, None), getattr(torch.backends, backend, None))
            if any(getattr(m, "is_available", lambda: False)() for m in mods if m is not None):
                raise ToolFailure(f"{what} are not supported by matmul_bench yet (CUDA and ROCm only). "
                                  "Use accelerator_specs for the datasheet figures.")
        raise ToolFailure(f"No GPU visible to torch {torch.__version__} (torch.cuda.is_available() is False"
                          f"{'; this torch has no CUDA' if not torch.version.cuda and not getattr(torch.version, 'hip', None) else ''}). "
                          "matmul_bench needs an NVIDIA (CUDA) or AMD (ROCm) GPU; check nvidia-smi and "
                          "CUDA_VISIBLE_DEVICES, or run env_report. device='cpu' only exercises the search logic.")
    count = torch.cuda.device_count()
    if not params.all_gpus and params.device >= count:
        raise ToolFailure(f"device={params.device} does not exist: torch sees {count} GPU(s), indices 0..{count - 1}.")
    return torch


def _measure_device(device, params, progress, share, plan_shapes=None):
    """Warm up, then search (or measure plan_shapes), with telemetry. Returns (outcome, warmup, telemetry)."""
    from ..shared.gpu_sampler import GpuSampler
    from .measure import MatmulTimer, Unsupported

    is_cpu = device == "cpu"
    lo, hi = share
    budget = params.time_budget_s or DEFAULT_BUDGET_S.get(params.mode)

    def sub(fraction, message):
        progress(lo + (hi - lo) * fraction, message)

    timer = None
    try:
        timer = MatmulTimer(device, params.dtype)
        with GpuSampler(None if is_cpu else device) as sampler:
            progress(lo, "warming the card until its throughput is stable")
            # shapes/grid measure each shape from whatever state its predecessor left, as the classic finder
            # does: warm fully (>= 3 s, stable within 1%). The search's finals start from a defined state
            # (a cool-down), so its warm-up only brings the card under load, which its power controller
            # follows within ~0.2 s (bench/clock_settle.py): >= 1.5 s, stable within 2%.
            classic = params.mode in ("shapes", "grid")  # on every GPU of an all_gpus run too
            warm = timer.warm_up(min_s=0.1 if is_cpu else 3.0 if classic else 1.5, max_s=0.5 if is_cpu else 30.0,
                                 batch_s=0.02 if is_cpu else 0.5, tolerance=0.01 if classic else 0.02)
            if plan_shapes is not None:
                rec = search.Recorder(timer.measure)
                # measured as on the first GPU: from full clock and settled after a search, plainly after shapes/grid
                plan = search.TINY if is_cpu else search.PLANS.get(params.mode)
                finals = search.final_measure(rec, plan_shapes, params.iterations, params.warmup, sub, (0.1, 1.0),
                                              cool_down=timer.cool_down, cooldown_s=plan.cooldown_s if plan else 0.0,
                                              settle_s=plan.settle_s if plan else 0.0)
                outcome = search.SearchOutcome(best=finals.fresh[0] if finals.fresh else None, finals=finals.fresh,
                                               sustained=finals.sustained, tried=rec.tried,
                                               iterations_total=rec.iterations, elapsed_s=0.0, phase_s={})
            elif params.mode in ("quick", "thorough"):
                plan = search.TINY if is_cpu else search.PLANS[params.mode]
                seeds = [] if is_cpu else search.wave_seeds(timer.compute_units)
                outcome = search.search(timer.measure, plan, final_iterations=params.iterations,
                                        final_warmup=params.warmup, budget_s=max(budget - warm.seconds, 0.3 * budget),
                                        progress=sub, extra_seeds=seeds, cool_down=timer.cool_down)
            else:
                default = [64, 128, 192, 256] if is_cpu else PUBLISHED_GRID
                dims = [params.dims(d) or default for d in "mnk"]
                outcome = search.exhaustive(timer.measure, search.grid_shapes(*dims), iterations=params.iterations,
                                            warmup=params.warmup, budget_s=params.time_budget_s, progress=sub)
    except Unsupported as e:
        raise ToolFailure(f"dtype={params.dtype}: {e}") from None
    finally:
        if timer is not None:
            timer.close()
    outcome.errors = timer.errors
    return outcome, warm, sampler.summary()


def run(params: MatmulBenchParams, progress) -> MatmulBenchResult:
    from . import verdict

    started = time.monotonic()
    torch = None
    if params.device == "cpu":
        name, devices, rocm = "cpu", ["cpu"], False
    else:
        torch = _gpu_environment(params)
        devices = list(range(torch.cuda.device_count())) if params.all_gpus else [params.device]
        name = torch.cuda.get_device_name(devices[0])
        rocm = bool(getattr(torch.version, "hip", None))
    share = 1.0 / len(devices)
    outcome, warm, telemetry = _measure_device(devices[0], params, progress, (0.0, share))
    best = outcome.best
    if best is None:
        raise ToolFailure("no shape could be measured (every shape was skipped for lack of GPU memory); free the "
                          "GPU (gpu_health lists processes holding memory) or ask for smaller shapes.")

    def row(dev, dev_name, o):
        return (dev, dev_name, o.best and o.best.mean_tflops, o.best and _shape_str(o.best.shape),
                o.best_sustained and o.best_sustained.mean_tflops)

    per_gpu = [row(devices[0], name, outcome)]
    # the other GPUs: the first GPU's best finalists by either figure
    finalists = list(dict.fromkeys([t.shape for t in outcome.finals[:3]] + [t.shape for t in outcome.sustained[:3]]))
    for i, dev in enumerate(devices[1:], start=1):
        other, _, _ = _measure_device(dev, params, progress, (i * share, (i + 1) * share), plan_shapes=finalists)
        per_gpu.append(row(dev, torch.cuda.get_device_name(dev), other))
    progress(1.0, "done")
    gpu_rows, slow, median = verdict.gpu_spread(per_gpu) if params.all_gpus else ([], [], None)
    comparison = verdict.compare_to_specs(best.mean_tflops, params.dtype, name)
    wall = time.monotonic() - started
    geomean = outcome.geomean_tflops
    sustained = outcome.best_sustained
    r = search.round_tflops
    errors = outcome.errors
    v, findings, nxt = verdict.judge(verdict.MatmulRun(
        dtype=params.dtype, device_name=name, is_cpu=devices[0] == "cpu", mamf_tflops=best.mean_tflops,
        best_shape=_shape_str(best.shape), iterations=best.iterations, comparison=comparison, telemetry=telemetry,
        sustained_tflops=sustained and sustained.mean_tflops, sustained_shape=sustained and _shape_str(sustained.shape),
        gpu_rows=gpu_rows, slow_gpus=slow, gpu_median=median,
        tunableop_missing=rocm and os.environ.get("PYTORCH_TUNABLEOP_ENABLED") != "1",
        stopped_early=outcome.stopped_early, budget_s=params.time_budget_s or DEFAULT_BUDGET_S.get(params.mode),
        warmup_stable=warm.stable, shapes_tried=len(outcome.tried), geomean_tflops=geomean, wall_time_s=wall))
    if errors:
        findings.append(f"{len(errors)} shape(s) failed and were skipped, e.g. {errors[0]}")
    return MatmulBenchResult(
        verdict=v, findings=findings, next=nxt, device="cpu" if devices[0] == "cpu" else f"cuda:{devices[0]}",
        device_name=name, dtype=params.dtype, mamf_tflops=r(best.mean_tflops), best_shape=_shape_str(best.shape),
        best_median_tflops=r(best.median_tflops), best_max_tflops=r(best.max_tflops), **comparison,
        sustained_tflops=sustained and r(sustained.mean_tflops), sustained_shape=sustained and _shape_str(sustained.shape),
        sustained_vs_published_pct=(round(100 * sustained.mean_tflops / comparison["published_mamf_tflops"], 1)
                                    if sustained and comparison.get("published_mamf_tflops") else None),
        geomean_tflops=r(geomean) if geomean else None, shapes_tried=len(outcome.tried),
        iterations_total=outcome.iterations_total, wall_time_s=round(wall, 1), warmup_s=round(warm.seconds, 1),
        warmup_stable=warm.stable, stopped_early=outcome.stopped_early,
        phase_s={k: round(v, 2) for k, v in outcome.phase_s.items()},
        top_shapes=[_row(t) for t in outcome.finals[:10]], top_sustained=[_row(t) for t in outcome.sustained[:10]],
        telemetry=telemetry,
        gpus=[GpuRow(**row) for row in gpu_rows], slow_gpus=slow)


def _gpu_devices(params: MatmulBenchParams) -> list[int]:
    if params.device == "cpu":
        return []
    return list(range(local_gpu_count())) if params.all_gpus else [params.device]


MAMF = Figure("mamf_tflops", "TFLOPS", "higher", per_gpu=True)
SUSTAINED = Figure("sustained_tflops", "TFLOPS", "higher", per_gpu=True)
SM_CLOCK = Figure("sm_clock_mhz", "MHz", "higher", per_gpu=True)
POWER = Figure("power_w", "W", "higher", per_gpu=True)
TEMPERATURE = Figure("temperature_c", "°C", "lower", per_gpu=True)


def _sweep_figures(res: MatmulBenchResult) -> list[Measured]:
    """Per GPU: burst MAMF (against the published MAMF, a burst figure) and sustained MAMF (fleet-relative:
    healthy H200s settle 3-7% below the published figure); clocks, power and temperature
    under load from the NVML samples of the first GPU measured (the sweep compares them across nodes)."""
    rows = res.gpus or [GpuRow(device=int((res.device or "cuda:0").rpartition(":")[2] or 0), name=res.device_name or "",
                               mamf_tflops=res.mamf_tflops, sustained_tflops=res.sustained_tflops)]
    out = []
    for g in rows:
        out += [Measured(MAMF, g.mamf_tflops, gpu=g.device, expected=res.published_mamf_tflops, group=g.name),
                Measured(SUSTAINED, g.sustained_tflops, gpu=g.device, group=g.name)]
    tel, first = res.telemetry, rows[0]
    for fig, value in ((SM_CLOCK, tel.get("sm_clock_median_mhz")), (POWER, tel.get("power_mean_w")),
                       (TEMPERATURE, tel.get("temperature_max_c"))):
        if value is not None:
            out.append(Measured(fig, value, gpu=first.device, group=first.name))
    return out


def _sweep_evidence(res: MatmulBenchResult) -> list[str]:
    tel = res.telemetry
    lines = [f"GPU {d} more than 5% below the node median" for d in res.slow_gpus]
    reasons = {k: v for k, v in (tel.get("reasons_fraction") or {}).items() if v > 0.05}
    if reasons:
        lines.append("clock-event reasons during the run (share of samples): "
                     + ", ".join(f"{k} {v:.0%}" for k, v in reasons.items()))
    return lines


SWEEP = SweepContract(figures=(MAMF, SUSTAINED, SM_CLOCK, POWER, TEMPERATURE), read=_sweep_figures,
                      evidence=_sweep_evidence)

SPEC = ToolSpec(
    name="matmul_bench",
    summary="Maximum achievable matmul TFLOPS (MAMF) of a GPU, its best shape, and efficiency vs datasheet and published MAMF.",
    description=(
        "Measures what a GPU really achieves on matmul: maximum achievable TFLOPS (MAMF) for "
        "bf16/fp16/tf32/fp32/fp8, the shape that reaches it, efficiency vs the datasheet and the published "
        "MAMF, clocks, power and throttle reasons during the run; all_gpus flags a card >5% below its peers. "
        "Use for 'is my GPU as fast as it should be', the MFU ceiling, a slow or throttling card. One GPU "
        "locked; quick ~1 min, thorough ~5. Not for datasheet figures (accelerator_specs), memory bandwidth "
        "(memory_bandwidth_bench) or communication (collective_bench)."),
    Params=MatmulBenchParams, Result=MatmulBenchResult, run=run, runs="subprocess", needs_torch=True, timeout_s=900,
    gpu_devices=_gpu_devices, metric="mamf_tflops", higher_is_better=True,
    doctor=lambda ctx: {"time_budget_s": 30, "iterations": 50, "warmup": 10} if ctx["gpu_count"] else None,
    doctor_order=60, sweep=SWEEP,
)
