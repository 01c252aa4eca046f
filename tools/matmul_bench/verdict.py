"""matmul_bench's reading of a measurement: spec comparison, per-GPU spread, verdict and findings.

Pure functions (no torch), so the verdicts are tested on the CPU with made-up figures.
"""

import dataclasses
import statistics

from ..engine.spec import worst
from ..shared.accelerators import match_accelerator

OK_VS_PUBLISHED = 0.90    # >= 90% of the published MAMF: as expected
FAIL_VS_PUBLISHED = 0.75  # < 75%: something is wrong with the card or the stack
SLOW_GPU_PCT = 5.0        # all_gpus: flag a GPU this much below the node median
SUSTAINED_DROP = 0.02     # sustained this far below the MAMF: say the clock does not hold (power cap)
THROTTLING_PAGE = "knowledge://compute/throttling-and-clocks.md"


def compare_to_specs(mamf_tflops: float, dtype: str, device_name: str) -> dict:
    """Datasheet and published-MAMF comparison for the accelerator `device_name` matches (if any)."""
    rec = match_accelerator(device_name) if device_name and device_name != "cpu" else None
    out = {"accelerator_id": None, "spec_tflops": None, "efficiency_pct": None,
           "published_mamf_tflops": None, "vs_published_pct": None}
    if rec is None:
        return out
    out["accelerator_id"] = rec["id"]
    spec = rec.get("dense_tflops", {}).get(dtype)
    if spec:
        out["spec_tflops"] = spec
        out["efficiency_pct"] = round(100 * mamf_tflops / spec, 1)
    published = rec.get("mamf_bf16_tflops")
    if published and dtype in ("bf16", "fp16"):  # same tensor-core peak; only bf16 MAMF is published
        out["published_mamf_tflops"] = published
        out["vs_published_pct"] = round(100 * mamf_tflops / published, 1)
    return out


def gpu_spread(per_gpu: list[tuple[int, str, float | None, str | None, float | None]]
               ) -> tuple[list[dict], list[int], float | None]:
    """Rows (device, name, MAMF, its shape, sustained) with each GPU's differences from the node medians, the
    GPUs more than SLOW_GPU_PCT below either median, and the MAMF median. Both figures count: a GPU with a
    lowered power limit or poor cooling reaches full clock in a burst but holds less once settled."""
    def median_of(i):
        values = [g[i] for g in per_gpu if g[i]]
        return statistics.median(values) if values else None

    def pct(value, median):
        return round(100 * (value - median) / median, 1) if (value and median) else None

    median, sustained_median = median_of(2), median_of(4)
    rows, slow = [], []
    for dev, name, value, shape, sustained in per_gpu:
        row = {"device": dev, "name": name, "mamf_tflops": round(value, 1) if value else None, "best_shape": shape,
               "sustained_tflops": round(sustained, 1) if sustained else None,
               "vs_median_pct": pct(value, median), "sustained_vs_median_pct": pct(sustained, sustained_median)}
        rows.append(row)
        if value is None or any(p is not None and p < -SLOW_GPU_PCT
                                for p in (row["vs_median_pct"], row["sustained_vs_median_pct"])):
            slow.append(dev)
    return rows, slow, median


def _telemetry_findings(tel: dict) -> tuple[str, list[str]]:
    if not tel.get("available"):
        return "info", []
    parts = []
    if "sm_clock_median_mhz" in tel:
        top = f" of {tel['max_sm_clock_mhz']} max" if tel.get("max_sm_clock_mhz") else ""
        parts.append(f"SM clock median {tel['sm_clock_median_mhz']:.0f} MHz (min {tel['sm_clock_min_mhz']}, "
                     f"max {tel['sm_clock_max_mhz']}{top})")
    if "power_mean_w" in tel:
        limit = f" of a {tel['power_limit_w']:.0f} W limit" if tel.get("power_limit_w") else ""
        parts.append(f"power mean {tel['power_mean_w']:.0f} W, max {tel['power_max_w']:.0f} W{limit}")
    if "temperature_max_c" in tel:
        parts.append(f"temperature max {tel['temperature_max_c']} C")
    findings = [f"During the run ({tel['samples']} NVML samples): " + "; ".join(parts) + "."] if parts else []
    reasons = tel.get("reasons_fraction", {})
    verdict = "info"
    bad = {r: f for r, f in reasons.items() if r in ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                                                      "hw_power_brake_slowdown") and f > 0.05}
    if bad:
        verdict = "warn"
        what = ", ".join(f"{r} in {f:.0%} of samples" for r, f in bad.items())
        findings.append(f"The card was throttled ({what}): overheating (cooling, airflow, a failed fan) or power "
                        "delivery (hw_power_brake) slowed it, so this MAMF is below the card's real ceiling. "
                        "Check gpu_health and the node's cooling, then rerun.")
    if reasons.get("sw_power_cap", 0) > 0.2:
        findings.append(f"The card ran at its power limit in {reasons['sw_power_cap']:.0%} of samples (sw_power_cap): "
                        "normal under a long matmul, and why clocks sat below their maximum. A lowered power limit "
                        "(nvidia-smi -pl) would show up here too.")
    return verdict, findings


@dataclasses.dataclass(frozen=True)
class MatmulRun:
    """What one matmul_bench run measured, as the verdict needs it."""

    dtype: str
    device_name: str
    is_cpu: bool
    mamf_tflops: float
    best_shape: str
    iterations: int
    comparison: dict            # compare_to_specs()
    telemetry: dict             # GpuSampler summary
    gpu_rows: list[dict]        # per GPU on an all_gpus run
    slow_gpus: list[int]
    gpu_median: float | None
    sustained_tflops: float | None
    sustained_shape: str | None
    tunableop_missing: bool
    stopped_early: bool
    budget_s: float | None
    warmup_stable: bool | None
    shapes_tried: int
    geomean_tflops: float | None
    wall_time_s: float


def _vs_published(m: MatmulRun) -> tuple[str, list[str], list[str]]:
    """(verdict, findings, next) against the published MAMF, comparing like with like: the published figure was
    measured on a warm card shape after shape, which is how the sustained figure is measured; the burst figure
    (each finalist's first moments after a 0.2 s cool-down, from full clock) is reported beside it."""
    pub = m.comparison["published_mamf_tflops"]
    sustained = bool(m.sustained_tflops) and not m.is_cpu
    figure = m.sustained_tflops if sustained else m.mamf_tflops
    ratio = figure / pub
    what = (f"Sustained {figure:.4g} TFLOPS at {m.sustained_shape}, measured like the published MAMF (a warm card, "
            f"shape after shape), is {ratio:.1%} of it ({pub:g} TFLOPS)" if sustained else
            f"That is {ratio:.1%} of the published MAMF for this card ({pub:g} TFLOPS)")
    out = []
    if ratio >= OK_VS_PUBLISHED:
        verdict, nxt = "ok", []
        out.append(f"{what}: as expected.")
    else:
        verdict = "warn" if ratio >= FAIL_VS_PUBLISHED else "fail"
        out.append(f"{what}; expected >= {OK_VS_PUBLISHED:.0%}. Look at clocks, power and throttle reasons below: "
                   "a lowered power limit, poor cooling or power delivery; check the card with gpu_health and the "
                   "software stack with env_report.")
        nxt = ["gpu_health", "env_report", THROTTLING_PAGE]
    if sustained:
        out.append(f"Burst: {m.mamf_tflops:.4g} TFLOPS ({m.mamf_tflops / pub:.1%} of the published figure), each "
                   "finalist timed from full clock after a 0.2 s cool-down: what a short kernel burst gets, extra "
                   "information, not the figure to compare.")
    return verdict, out, nxt


def _sustained_note(m: MatmulRun) -> str:
    drop = 1 - m.sustained_tflops / m.mamf_tflops
    if drop > SUSTAINED_DROP:
        return (f"Sustained is {drop:.1%} below the burst: held longer, the card's power controller lowers its "
                "clock. Plan MFU against the sustained figure: a training step is a long load.")
    return f"Sustained is within {SUSTAINED_DROP:.0%} of the burst: the clock holds under a long load."


def judge(m: MatmulRun) -> tuple[str, list[str], list[str]]:
    """(verdict, findings, next) for one matmul_bench run."""
    findings = [f"MAMF {m.mamf_tflops:.4g} TFLOPS {m.dtype} (best per-shape mean of {m.iterations} iterations) at "
                f"{m.best_shape} (MxNxK) on {m.device_name}"
                + (f": {m.comparison['efficiency_pct']:.1f}% of the {m.comparison['spec_tflops']:g} TFLOPS datasheet peak."
                   if m.comparison.get("efficiency_pct") is not None else ".")]
    nxt = ["knowledge://compute/mamf.md", "knowledge://compute/theoretical-vs-achievable.md"]
    verdict = "info"
    if m.is_cpu:
        findings.append("device='cpu': this run exercises the shape search on tiny shapes; CPU TFLOPS say nothing "
                        "about a GPU.")
    elif m.comparison.get("vs_published_pct") is not None:
        verdict, more, extra_next = _vs_published(m)
        findings += more
        nxt = [*extra_next, *nxt]
    elif m.comparison.get("accelerator_id") is None:
        findings.append(f"No record in the accelerator table matches {m.device_name!r}, so there is no datasheet or "
                        "published figure to compare with (accelerator_specs list_all shows the table).")
    else:
        findings.append(f"No published {m.dtype} MAMF for this card to judge against; typical MAMF is 70-90% of the "
                        "datasheet peak on NVIDIA and 50-70% on AMD.")
    if m.sustained_tflops and not m.is_cpu:
        findings.append(_sustained_note(m))
    tel_verdict, tel_findings = _telemetry_findings(m.telemetry)
    findings += tel_findings
    if tel_verdict != "info":
        verdict = worst((verdict, tel_verdict))
        nxt = ["gpu_health", THROTTLING_PAGE, *[n for n in nxt if n not in ("gpu_health", THROTTLING_PAGE)]]
    if m.tunableop_missing:
        verdict = worst((verdict, "warn"))
        findings.append("PYTORCH_TUNABLEOP_ENABLED is not set to 1: on ROCm the default GEMM kernels leave much of "
                        "the card unused, and the published AMD MAMF figures were measured with TunableOp on. "
                        "Rerun with PYTORCH_TUNABLEOP_ENABLED=1 (each new shape is slow once while it tunes).")
        nxt.append("knowledge://compute/amd.md")
    for row in m.gpu_rows:
        if row["device"] in m.slow_gpus:
            verdict = worst((verdict, "warn"))
            if row["mamf_tflops"] is None:
                findings.append(f"GPU {row['device']} ({row['name']}) could not be measured.")
            elif row["vs_median_pct"] is not None and row["vs_median_pct"] < -SLOW_GPU_PCT:
                findings.append(f"GPU {row['device']} ({row['name']}) reached {row['mamf_tflops']:.1f} TFLOPS, "
                                f"{-row['vs_median_pct']:.1f}% below the node median of {m.gpu_median:.1f}: check it "
                                "with gpu_health (clocks, throttle reasons, power limit, ECC).")
            else:
                findings.append(f"GPU {row['device']} ({row['name']}) reaches {row['mamf_tflops']:.1f} TFLOPS from full "
                                f"clock but holds only {row['sustained_tflops']:.1f} once settled, "
                                f"{-row['sustained_vs_median_pct']:.1f}% below the node's sustained median: typical of a "
                                "lowered power limit or poor cooling; check it with gpu_health (power limit, clocks, "
                                "temperature, throttle reasons).")
    if m.gpu_rows and not m.slow_gpus:
        findings.append(f"All {len(m.gpu_rows)} GPUs within {SLOW_GPU_PCT:g}% of the node median ({m.gpu_median:.1f} TFLOPS).")
    if m.warmup_stable is False and not m.is_cpu:
        findings.append("The card's throughput had not settled by the end of the warm-up (clocks or temperature "
                        "still moving): expect more run-to-run spread than usual.")
    if m.stopped_early:
        findings.append(f"The time budget ({m.budget_s:g} s) cut the run short; a larger time_budget_s"
                        " (or mode='thorough') may find a better shape.")
    geo = f", geometric mean {m.geomean_tflops:.4g} TFLOPS" if m.geomean_tflops else ""
    findings.append(f"{m.shapes_tried} shapes tried{geo}; {m.wall_time_s:.1f} s in all.")
    if "gpu_health" not in nxt and not m.is_cpu:
        nxt.append("gpu_health")
    return verdict, findings, nxt
