"""upgrade_roi — is the new accelerator worth it: cost per token, time to train, break-even speedup and price.

The throughput ratio comes from the user's own measurements (tokens/s on both, or a speedup), else
from the datasheets: the dense TFLOPS ratio for compute-bound work (training, prefill) or the memory
bandwidth ratio for memory-bound work (decode). Prices are per GPU-hour, in any one currency.

How to run by hand (anywhere, it runs no GPU code):
    mleng run upgrade_roi --current h100 --candidate b200 --current-price-per-gpu-hour 2.5 --candidate-price-per-gpu-hour 5 --current-tokens-per-s-per-gpu 3500
    mleng run upgrade_roi --current a100 --candidate h100 --speedup 2.4 --current-price-per-gpu-hour 1.3 --candidate-price-per-gpu-hour 2.5 --train-tokens 1e12 --num-gpus 256 --json
"""

from typing import Literal

from pydantic import ConfigDict, model_validator

from .shared.planning import find_accelerator
from .engine.spec import SELF_EVIDENT, Field, Params, Progress, Result, ToolFailure, ToolSpec, needs, not_both

Dtype = Literal["bf16", "fp16", "fp8", "fp4", "tf32", "fp32"]


class RoiParams(Params):
    # A first purchase (current null or 'none') has no current tokens/s to compare against.
    model_config = ConfigDict(json_schema_extra={"allOf": [
        {"anyOf": [needs("candidate_tokens_per_s_per_gpu", "current_tokens_per_s_per_gpu"),
                   {"required": ["current"], "properties": {"current": {"anyOf": [
                       {"type": "null"}, {"type": "string", "pattern": r"^\s*[Nn][Oo][Nn][Ee]\s*$"}]}}}]},
        not_both("speedup", "candidate_tokens_per_s_per_gpu")]})

    current: str | None = Field("h100", max_length=100, description="Accelerator now; null or 'none': first purchase.")
    candidate: str = Field("b200", max_length=100,
            json_schema_extra=SELF_EVIDENT, description="Accelerator considered.")
    current_price_per_gpu_hour: float | None = Field(None, gt=0, le=1e6, description="Any currency, the same for both.")
    candidate_price_per_gpu_hour: float | None = Field(None, gt=0, le=1e6, description="Per GPU-hour.")
    current_tokens_per_s_per_gpu: float | None = Field(None, gt=0, le=1e12, description="Measured on the current one.")
    candidate_tokens_per_s_per_gpu: float | None = Field(None, gt=0, le=1e12, description=(
        "Measured, same workload (not with speedup)."))
    speedup: float | None = Field(None, gt=0, le=1000, description=(
        "Measured candidate/current per GPU."))
    workload: Literal["compute_bound", "memory_bound"] = Field(
        "compute_bound", description="Datasheet estimate: training/prefill or decode.")
    dtype: Dtype = Field("bf16", description="Current's matmul dtype (estimate).")
    candidate_dtype: Dtype | None = Field(None, description="Default: dtype.")
    params_b: float | None = Field(None, gt=0, le=100000, description=(
        "Billions, to estimate tokens/s at assumed_mfu."))
    assumed_mfu: float = Field(0.4, gt=0, le=1, description="For that estimate.")
    candidate_tokens_per_s_estimate: bool = Field(True, description=(
        "First purchase: estimate from params_b."))
    break_even_tolerance: float = Field(0.1, ge=0, le=1, description="Within this of break-even: too close to call.")
    train_tokens: float | None = Field(None, gt=0, le=1e18, description="For time and cost to train.")
    num_gpus: int = Field(8, ge=1, le=1_000_000, json_schema_extra=SELF_EVIDENT, description="On the current one.")
    candidate_num_gpus: int | None = Field(None, ge=1, le=1_000_000, description="Default: num_gpus.")
    gpus_per_node: int = Field(8, ge=1, le=1024, json_schema_extra=SELF_EVIDENT, description="Current.")
    candidate_gpus_per_node: int | None = Field(None, ge=1, le=1024, description=(
        "GB200 trays: 4; default gpus_per_node."))

    @model_validator(mode="after")
    def _check(self):
        if self.current is not None and self.current.strip().lower() == "none":
            self.current = None
        if self.current is None and (self.current_tokens_per_s_per_gpu is not None or self.speedup is not None
                                     or self.current_price_per_gpu_hour is not None):
            raise ValueError("a first purchase (current=none) has no current tokens/s, speedup or price: give the "
                             "candidate's (candidate_tokens_per_s_per_gpu or params_b, candidate_price_per_gpu_hour)")
        if self.current is None:
            return self
        if self.candidate_tokens_per_s_per_gpu is not None and self.current_tokens_per_s_per_gpu is None:
            raise ValueError("candidate_tokens_per_s_per_gpu needs current_tokens_per_s_per_gpu to compare against")
        if self.speedup is not None and self.candidate_tokens_per_s_per_gpu is not None:
            raise ValueError("give either speedup or candidate_tokens_per_s_per_gpu, not both")
        return self


class RoiResult(Result):
    current: str | None = Field(None, description="Current accelerator (None: a first purchase).")
    candidate: str | None = Field(None, description="Candidate accelerator.")
    speedup: float | None = Field(None, description="Candidate/current throughput per GPU used below.")
    speedup_basis: str | None = Field(None, description="measured | given | datasheet TFLOPS | datasheet bandwidth.")
    compute_ratio: float | None = Field(None, description="Datasheet dense TFLOPS ratio (candidate/current).")
    mamf_ratio: float | None = Field(None, description="Published max achievable matmul TFLOPS ratio (bf16): the "
                                     "realistic compute ceiling, used for compute-bound estimates.")
    within_tolerance: bool | None = Field(None, description="The speedup is within break_even_tolerance of break-even.")
    bandwidth_ratio: float | None = Field(None, description="Datasheet memory bandwidth ratio.")
    memory_ratio: float | None = Field(None, description="Datasheet memory size ratio.")
    current_tokens_per_s_per_gpu: float | None = Field(None, description="Throughput per GPU now (tokens/s).")
    candidate_tokens_per_s_per_gpu: float | None = Field(None, description="Throughput per GPU on the candidate.")
    current_cost_per_mtok: float | None = Field(None, description="Cost per million tokens now.")
    candidate_cost_per_mtok: float | None = Field(None, description="Cost per million tokens on the candidate.")
    break_even_speedup: float | None = Field(None, description="Speedup at which both cost the same per token.")
    candidate_break_even_price: float | None = Field(None, description="Candidate GPU-hour price below which "
                                                     "it is cheaper per token.")
    current_hours_to_train: float | None = Field(None, description="Wall hours for train_tokens now.")
    candidate_hours_to_train: float | None = Field(None, description="Wall hours for train_tokens on the candidate.")
    current_cost_to_train: float | None = Field(None, description="GPU-hour cost of train_tokens now.")
    candidate_cost_to_train: float | None = Field(None, description="GPU-hour cost of train_tokens on the candidate.")


def _peak(acc: dict, dtype: str) -> float:
    value = acc.get("dense_tflops", {}).get(dtype)
    if not value:
        raise ToolFailure(f"{acc['name']} has no dense {dtype} figure in accelerators.toml (not supported natively): "
                          "choose another dtype or give a measured speedup")
    return value


def cost_per_mtok(price_per_gpu_hour: float, tokens_per_s_per_gpu: float) -> float:
    return price_per_gpu_hour / (tokens_per_s_per_gpu * 3600) * 1e6


def run(params: RoiParams, progress: Progress) -> RoiResult:
    cand = find_accelerator(params.candidate)
    if params.current is None:
        return _first_purchase(params, cand)
    cur = find_accelerator(params.current)
    cand_dtype = params.candidate_dtype or params.dtype
    res = RoiResult(current=cur["name"], candidate=cand["name"],
                    compute_ratio=round(_peak(cand, cand_dtype) / _peak(cur, params.dtype), 3),
                    mamf_ratio=_mamf_ratio(cur, cand, params.dtype, cand_dtype),
                    bandwidth_ratio=round(cand["memory_bandwidth_tbps"] / cur["memory_bandwidth_tbps"], 3),
                    memory_ratio=round(cand["memory_gb"] / cur["memory_gb"], 3))
    cur_tps = params.current_tokens_per_s_per_gpu
    if params.candidate_tokens_per_s_per_gpu is not None:
        res.speedup, res.speedup_basis = params.candidate_tokens_per_s_per_gpu / cur_tps, "measured"
    elif params.speedup is not None:
        res.speedup, res.speedup_basis = params.speedup, "given"
    elif params.workload == "compute_bound" and res.mamf_ratio:
        res.speedup, res.speedup_basis = res.mamf_ratio, f"published MAMF ratio ({params.dtype})"
    elif params.workload == "compute_bound":
        res.speedup, res.speedup_basis = res.compute_ratio, f"datasheet TFLOPS ({params.dtype} -> {cand_dtype})"
    else:
        res.speedup, res.speedup_basis = res.bandwidth_ratio, "datasheet bandwidth"
    res.speedup = round(res.speedup, 4)
    if cur_tps is None and params.params_b is not None:
        cur_tps = _estimated_tps(params, cur, params.dtype)
    if cur_tps is not None:
        res.current_tokens_per_s_per_gpu = round(cur_tps, 3)
        res.candidate_tokens_per_s_per_gpu = round(cur_tps * res.speedup, 3)
    _costs(params, res)
    _explain(params, cur, cand, res)
    return res


def _mamf_ratio(cur: dict, cand: dict, dtype: str, cand_dtype: str) -> float | None:
    """Published bf16 MAMF ratio, when both have one and both run bf16/fp16 (the realistic ceiling; the
    seed chapter, compute/accelerator/README.md, recommends comparing MAMF, not datasheet peaks)."""
    if {dtype, cand_dtype} <= {"bf16", "fp16"} and cur.get("mamf_bf16_tflops") and cand.get("mamf_bf16_tflops"):
        return round(cand["mamf_bf16_tflops"] / cur["mamf_bf16_tflops"], 3)
    return None


def _estimated_tps(p: RoiParams, acc: dict, dtype: str) -> float:
    """Tokens/s per GPU from 6N FLOPs per token at assumed_mfu of the dense peak."""
    return p.assumed_mfu * _peak(acc, dtype) * 1e12 / (6 * p.params_b * 1e9)


def _first_purchase(p: RoiParams, cand: dict) -> RoiResult:
    res = RoiResult(current=None, candidate=cand["name"], speedup_basis="first purchase: no current GPU")
    dtype = p.candidate_dtype or p.dtype
    tps = p.candidate_tokens_per_s_per_gpu
    if tps is None and p.params_b is not None and p.candidate_tokens_per_s_estimate:
        tps = _estimated_tps(p, cand, dtype)
    f = res.findings
    if tps is None:
        f.append("First purchase: give candidate_tokens_per_s_per_gpu (measured on a rented node) or params_b to "
                 "estimate it, and candidate_price_per_gpu_hour, for cost per token and time to train.")
    else:
        res.candidate_tokens_per_s_per_gpu = round(tps, 3)
        gpus = p.candidate_num_gpus or p.num_gpus
        if p.candidate_price_per_gpu_hour is not None:
            res.candidate_cost_per_mtok = round(cost_per_mtok(p.candidate_price_per_gpu_hour, tps), 6)
            f.append(f"Cost per million tokens on {cand['name']}: {res.candidate_cost_per_mtok:.4g} at "
                     f"{tps:,.0f} tokens/s per GPU.")
        if p.train_tokens:
            res.candidate_hours_to_train = round(p.train_tokens / (tps * gpus) / 3600, 3)
            if p.candidate_price_per_gpu_hour is not None:
                res.candidate_cost_to_train = round(res.candidate_hours_to_train * gpus * p.candidate_price_per_gpu_hour, 2)
            f.append(f"{p.train_tokens:.3g} tokens: {res.candidate_hours_to_train / 24:.1f} days on {gpus} GPUs.")
        if p.candidate_tokens_per_s_per_gpu is None:
            f.append(f"Tokens/s is an estimate: {p.params_b:g}B parameters at {100 * p.assumed_mfu:.0f}% MFU of the "
                     f"{_peak(cand, dtype):g} TFLOPS {dtype} peak; measure on a rented node before buying.")
    res.verdict = "info"
    res.next = ["mfu_calc", "memory_estimate", "accelerator_specs", "knowledge://insights/upgrade-roi.md"]
    return res


def _costs(p: RoiParams, res: RoiResult) -> None:
    cur_tps, cand_tps = res.current_tokens_per_s_per_gpu, res.candidate_tokens_per_s_per_gpu
    prices = p.current_price_per_gpu_hour is not None and p.candidate_price_per_gpu_hour is not None
    if prices:
        res.break_even_speedup = round(p.candidate_price_per_gpu_hour / p.current_price_per_gpu_hour, 4)
        res.candidate_break_even_price = round(p.current_price_per_gpu_hour * res.speedup, 4)
    if cur_tps is not None:
        if prices:
            res.current_cost_per_mtok = round(cost_per_mtok(p.current_price_per_gpu_hour, cur_tps), 6)
            res.candidate_cost_per_mtok = round(cost_per_mtok(p.candidate_price_per_gpu_hour, cand_tps), 6)
        if p.train_tokens:
            cand_gpus = p.candidate_num_gpus or p.num_gpus
            res.current_hours_to_train = round(p.train_tokens / (cur_tps * p.num_gpus) / 3600, 3)
            res.candidate_hours_to_train = round(p.train_tokens / (cand_tps * cand_gpus) / 3600, 3)
            if prices:
                res.current_cost_to_train = round(res.current_hours_to_train * p.num_gpus * p.current_price_per_gpu_hour, 2)
                res.candidate_cost_to_train = round(res.candidate_hours_to_train * cand_gpus * p.candidate_price_per_gpu_hour, 2)


def _explain(p: RoiParams, cur: dict, cand: dict, res: RoiResult) -> None:
    f = res.findings
    f.append(f"{cand['name']} vs {cur['name']}: {res.speedup:.2f}x throughput per GPU ({res.speedup_basis}).")
    if res.break_even_speedup is not None:
        better = res.speedup > res.break_even_speedup
        margin = res.speedup / res.break_even_speedup - 1
        res.within_tolerance = abs(margin) <= p.break_even_tolerance
        if res.within_tolerance:
            res.verdict = "warn"
            f.insert(0, f"Too close to call: {res.speedup:.2f}x against the {res.break_even_speedup:.2f}x needed to break "
                        f"even is within +-{100 * p.break_even_tolerance:.0f}% ({100 * margin:+.1f}%), inside what "
                        f"software versions and tuning change; measure both on the same stack. It wins below "
                        f"{res.candidate_break_even_price:.2f} per GPU-hour (now {p.candidate_price_per_gpu_hour:g}).")
        else:
            f.insert(0, f"The candidate is {'cheaper' if better else 'dearer'} per token: it needs {res.break_even_speedup:.2f}x "
                        f"to break even at these prices and gives {res.speedup:.2f}x ({100 * margin:+.0f}%); it wins below "
                        f"{res.candidate_break_even_price:.2f} per GPU-hour (now {p.candidate_price_per_gpu_hour:g}).")
    else:
        f.append("Give both prices per GPU-hour for cost per token, break-even speedup and price.")
    if res.current_cost_per_mtok is not None:
        f.append(f"Cost per million tokens: {res.current_cost_per_mtok:.4g} now, {res.candidate_cost_per_mtok:.4g} on the "
                 f"candidate ({res.current_tokens_per_s_per_gpu:,.0f} -> {res.candidate_tokens_per_s_per_gpu:,.0f} "
                 "tokens/s per GPU).")
    if p.current_tokens_per_s_per_gpu is None and p.params_b is not None:
        f.append(f"Current tokens/s is an estimate: {p.params_b:g}B parameters at {100 * p.assumed_mfu:.0f}% MFU; "
                 "measure it (mfu_calc checks a measured figure).")
    if res.current_hours_to_train is not None:
        cand_gpus = p.candidate_num_gpus or p.num_gpus
        nodes = -(-cand_gpus // (p.candidate_gpus_per_node or p.gpus_per_node))
        f.append(f"{p.train_tokens:.3g} tokens: {res.current_hours_to_train / 24:.1f} days on {p.num_gpus} GPUs "
                 f"({-(-p.num_gpus // p.gpus_per_node)} nodes) now, {res.candidate_hours_to_train / 24:.1f} days on "
                 f"{cand_gpus} candidate GPUs ({nodes} nodes).")
    if res.mamf_ratio and res.speedup_basis.startswith("published MAMF"):
        f.append(f"Compute ceiling from the published max achievable matmul TFLOPS ({res.mamf_ratio:.2f}x), not the "
                 f"datasheet peaks ({res.compute_ratio:.2f}x): real matmuls reach 70-80% of a peak, by different "
                 "fractions on different GPUs.")
    if res.speedup_basis.startswith(("datasheet", "published MAMF")):
        other = res.bandwidth_ratio if p.workload == "compute_bound" else res.compute_ratio
        f.append(f"Datasheet estimate for {p.workload.replace('_', '-')} work; the other ratio is {other:.2f}x "
                 "(training and prefill are mostly compute-bound, decode is memory-bound). Real speedups are "
                 "usually below the datasheet ratio: measure before buying.")
    f.extend(_capability_notes(p, cur, cand, res))
    f.append("For a fair measurement hold equal: software stack (torch, CUDA, NCCL, kernels), global batch, "
             "sequence length, precision and model; re-tune parallelism and micro batch for each GPU; compare "
             "steady-state tokens/s after warm-up, at the node count you will run.")
    res.next = ["mfu_calc", "matmul_bench", "memory_estimate", "accelerator_specs",
                "knowledge://insights/upgrade-roi.md", "knowledge://insights/choosing-a-cluster.md"]


def _capability_notes(p: RoiParams, cur: dict, cand: dict, res: RoiResult) -> list[str]:
    notes = []
    for dtype in ("fp8", "fp4"):
        has_cur, has_cand = dtype in cur.get("dense_tflops", {}), dtype in cand.get("dense_tflops", {})
        if has_cand and not has_cur:
            notes.append(f"The candidate runs {dtype} ({cand['dense_tflops'][dtype]:g} TFLOPS dense), the current "
                         f"GPU cannot: with {dtype} training or inference the gain can exceed the "
                         f"{p.dtype} ratio (set candidate_dtype={dtype} to see it).")
    if res.memory_ratio >= 1.3:
        notes.append(f"{res.memory_ratio:.1f}x the memory ({cand['memory_gb']:g} vs {cur['memory_gb']:g} GB): fewer GPUs per "
                     "model replica, less tensor/pipeline parallelism, larger batches or KV cache; this can add "
                     "throughput beyond the compute ratio (check with memory_estimate).")
    elif res.memory_ratio <= 0.8:
        notes.append(f"Less memory ({cand['memory_gb']:g} vs {cur['memory_gb']:g} GB): the same model may need more "
                     "parallelism or recomputation there; check with memory_estimate.")
    return notes


SPEC = ToolSpec(
    name="upgrade_roi",
    summary="Cost per token, time to train, break-even speedup and price for moving to another accelerator.",
    description=(
        "Use for 'is the new GPU worth it', 'H100 vs B200 cost per token', 'what price makes H200 pay off', "
        "renting or a first purchase with no GPUs yet (current=none): throughput ratio from the user's "
        "tokens/s or speedup, else the published MAMF ratio (compute-bound) or memory bandwidth ratio "
        "(memory-bound); with the user's prices per GPU-hour, cost per million tokens, the break-even speedup "
        "(+-10% too close to call) and price; with train_tokens and GPU counts, time and cost to train "
        "(pretraining). Instant arithmetic; prices are the user's."),
    Params=RoiParams, Result=RoiResult, run=run, runs="in_process", store=False,
)

if __name__ == "__main__":
    from .engine.cli import tool_main

    tool_main(SPEC)
