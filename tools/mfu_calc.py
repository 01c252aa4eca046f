"""mfu_calc — how efficient is a training run: achieved TFLOPS per GPU, MFU, HFU and MAMF utilisation.

From a measured tokens/s, the model and the sequence length: FLOPs per token (6 x matmul parameters
plus the attention-score term, PaLM arXiv 2204.02311 appendix B), achieved TFLOPS per GPU, MFU
against the dense datasheet peak, HFU when activations are recomputed, and utilisation against the
maximum achievable matmul TFLOPS (MAMF): measured by matmul_bench on this GPU model when the results
store has it, else the published figure.

Reference points used in the findings: Llama 3 405B trained at 38-43% bf16 MFU on 16K H100s
(https://arxiv.org/abs/2407.21783, 380-430 TFLOPS per GPU); PaLM 540B at 46.2% MFU
(https://arxiv.org/abs/2204.02311); Llama 4 pretraining in fp8 at 390 TFLOPS per GPU
(https://ai.meta.com/blog/llama-4-multimodal-intelligence/), ~20% of the fp8 peak.

How to run by hand (anywhere, it runs no GPU code):
    python -m tools.mfu_calc --model llama-3-8b --tokens-per-s 3500 --tokens-per-s-scope per_gpu --accelerator h100 --seq-len 8192
    python -m tools.mfu_calc --params-b 70 --tokens-per-s 120000 --num-gpus 256 --accelerator h200 --json
"""

from typing import Literal

from .shared.planning import find_accelerator
from .shared.transformer_math import AttentionFlops, ModelParams, Recompute, flops_per_token
from .engine.spec import Field, Progress, Result, ToolFailure, ToolSpec

DTYPES = ("bf16", "fp16", "fp8", "tf32", "fp32")


class MfuParams(ModelParams):
    tokens_per_s: float = Field(1000.0, gt=0, le=1e12, description="Measured training throughput in tokens/s "
                                "(steady state, after warm-up).")
    tokens_per_s_scope: Literal["total", "per_gpu"] = Field(
        "total", description="Whether tokens_per_s is for the whole job (total) or one GPU (per_gpu).")
    num_gpus: int = Field(1, ge=1, le=1_000_000, description="GPUs in the job.")
    seq_len: int = Field(4096, ge=1, le=10_000_000, description="Training sequence length (tokens).")
    accelerator: str | None = Field(None, max_length=100, description="GPU model (h100, h200, a100, mi300x, "
                                    "...); default: the first GPU of this machine.")
    dtype: Literal["bf16", "fp16", "fp8", "tf32", "fp32"] = Field(
        "bf16", description="Matmul dtype the run uses; selects the datasheet peak.")
    activation_checkpointing: Recompute = Field(
        "none", description="none | selective | full: recomputation adds hardware FLOPs (HFU) but not model FLOPs.")
    attention_flops: AttentionFlops = Field(
        "full", description="full: whole seq x seq score matrix (PaLM/Megatron convention); causal: half; "
        "none: the bare 6N rule.")
    peak_tflops: float | None = Field(None, gt=0, le=1e6, description="Override the dense peak TFLOPS per GPU "
                                      "(e.g. a power-capped part).")


class MfuResult(Result):
    accelerator: str | None = Field(None, description="GPU the peak figures are for.")
    tokens_per_s_per_gpu: float | None = Field(None, description="Throughput per GPU (tokens/s).")
    flops_per_token: float | None = Field(None, description="Model FLOPs per trained token (forward + backward).")
    hardware_flops_per_token: float | None = Field(None, description="With recomputation (FLOPs per token).")
    attention_share_pct: float | None = Field(None, description="Share of the model FLOPs in attention scores (%).")
    achieved_tflops_per_gpu: float | None = Field(None, description="Model TFLOPS per GPU (1e12 FLOP/s).")
    peak_tflops: float | None = Field(None, description="Dense datasheet peak for the dtype (TFLOPS).")
    mfu_pct: float | None = Field(None, description="Model FLOPs utilisation vs the dense peak (%).")
    hfu_pct: float | None = Field(None, description="Hardware FLOPs utilisation, recomputation included (%).")
    mamf_tflops: float | None = Field(None, description="Max achievable matmul TFLOPS used as the practical ceiling.")
    mamf_source: str | None = Field(None, description="'measured (results store id N)' or the published source.")
    mamf_utilisation_pct: float | None = Field(None, description="Achieved TFLOPS / MAMF (%).")


def local_gpu_name() -> str | None:
    """Name of this machine's first GPU through NVML (None without a driver)."""
    from .engine.store import host_provenance

    names = host_provenance()["gpu_names"]
    return names[0] if names else None


def measured_mamf(acc_id: str, dtype: str) -> tuple[float, int] | None:
    """Best MAMF matmul_bench stored for this GPU model and dtype: (TFLOPS, result id), else None."""
    from .shared.accelerators import match_accelerator
    from .engine import store

    try:
        rows = store.query(tool="matmul_bench", limit=1000)
    except Exception:  # an unreadable store must not stop an arithmetic tool
        return None
    best = None
    for row in rows:
        names = row.get("gpu_names") or []
        rec = match_accelerator(names[0]) if names else None
        if rec is None or rec["id"] != acc_id:
            continue
        value = _mamf_of(row, dtype)
        if value and (best is None or value > best[0]):
            best = (float(value), row["id"])
    return best


def _mamf_of(row: dict, dtype: str) -> float | None:
    """matmul_bench results carry `dtype` and `mamf_tflops`; older rows only the params and the metric."""
    result, params = row.get("result") or {}, row.get("params") or {}
    if result.get("dtype", params.get("dtype", "bf16")) != dtype:
        return None
    value = result.get("mamf_tflops", row.get("metric_value"))
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def run(params: MfuParams, progress: Progress) -> MfuResult:
    name = params.accelerator or local_gpu_name()
    if not name:
        raise ToolFailure("no accelerator given and no GPU found on this machine: pass accelerator "
                          "(e.g. h100, h200, a100, mi300x)")
    acc = find_accelerator(name)
    peak = params.peak_tflops or acc.get("dense_tflops", {}).get(params.dtype)
    if not peak:
        raise ToolFailure(f"{acc['name']} has no {params.dtype} peak in accelerators.toml (it does not run "
                          f"{params.dtype} natively); pass another dtype or peak_tflops")
    arch = params.architecture()
    matmul_params = arch.matmul_params() if (arch and params.params_b is None) else params.total_params()
    flops = flops_per_token(matmul_params, arch, params.seq_len, params.attention_flops,
                            params.activation_checkpointing)
    per_gpu = params.tokens_per_s / (params.num_gpus if params.tokens_per_s_scope == "total" else 1)
    achieved = flops.model * per_gpu / 1e12
    res = MfuResult(accelerator=acc["name"], tokens_per_s_per_gpu=round(per_gpu, 3),
                    flops_per_token=flops.model, hardware_flops_per_token=flops.hardware,
                    attention_share_pct=round(100 * flops.attention / flops.model, 2),
                    achieved_tflops_per_gpu=round(achieved, 2), peak_tflops=peak,
                    mfu_pct=round(100 * achieved / peak, 2),
                    hfu_pct=round(100 * flops.hardware * per_gpu / 1e12 / peak, 2))
    measured = measured_mamf(acc["id"], params.dtype)
    if measured:
        res.mamf_tflops, res.mamf_source = measured[0], f"measured by matmul_bench (results store id {measured[1]})"
    elif params.dtype in ("bf16", "fp16") and acc.get("mamf_bf16_tflops"):
        res.mamf_tflops, res.mamf_source = acc["mamf_bf16_tflops"], f"published: {acc.get('mamf_source', '')}"
    if res.mamf_tflops:
        res.mamf_utilisation_pct = round(100 * achieved / res.mamf_tflops, 2)
    _explain(params, acc, res, per_gpu, flops, arch is not None)
    return res


def _explain(p: MfuParams, acc: dict, res: MfuResult, per_gpu: float, flops, has_arch: bool) -> None:
    f = res.findings
    f.append(f"{res.achieved_tflops_per_gpu:.1f} TFLOPS per GPU achieved ({per_gpu:,.0f} tokens/s per GPU x "
             f"{flops.model / 1e9:.2f} GFLOP per token): MFU {res.mfu_pct:.1f}% of the {res.peak_tflops:g} TFLOPS "
             f"dense {p.dtype} peak of {acc['name']}.")
    if p.activation_checkpointing != "none":
        f.append(f"With {p.activation_checkpointing} recomputation the GPUs execute more: HFU {res.hfu_pct:.1f}%.")
    if res.mamf_utilisation_pct is not None:
        f.append(f"{res.mamf_utilisation_pct:.1f}% of the maximum achievable matmul rate ({res.mamf_tflops:g} TFLOPS, "
                 f"{res.mamf_source.split(':')[0]}), the practical ceiling.")
    mfu = res.mfu_pct
    ceiling = res.mamf_tflops or res.peak_tflops
    if res.achieved_tflops_per_gpu > 1.02 * ceiling:
        res.verdict = "fail"
        f.insert(0, f"Impossible: {res.achieved_tflops_per_gpu:.0f} TFLOPS per GPU is above what this GPU can do "
                    f"({ceiling:g}). Check that tokens/s is {'for the whole job' if p.tokens_per_s_scope == 'total' else 'per GPU'}, "
                    "the GPU count, the parameter count and the sequence length.")
    elif mfu > 75:
        res.verdict = "warn"
        f.insert(0, f"MFU {mfu:.0f}% is higher than any published large-scale run (Llama 3 405B: 38-43%, PaLM: 46%): "
                    "check the inputs.")
    elif mfu < 20:
        res.verdict = "warn"
        f.insert(0, f"MFU {mfu:.1f}% is low for transformer training (well-tuned runs reach 35-55%).")
    else:
        res.verdict = "ok"
    if p.num_gpus > 1 and (mfu < 20 or mfu > 75):
        other = mfu * p.num_gpus if p.tokens_per_s_scope == "total" else mfu / p.num_gpus
        scope = "per GPU" if p.tokens_per_s_scope == "total" else "for the whole job"
        if 5 <= other <= 100:  # only when the other reading is plausible
            f.append(f"Trap: if {p.tokens_per_s:,.0f} tokens/s was {scope}, MFU would be {other:.1f}%.")
    if p.dtype == "fp8":
        bf16 = acc.get("dense_tflops", {}).get("bf16")
        if bf16:
            f.append(f"Against the bf16 peak ({bf16:g} TFLOPS) MFU would be {100 * res.achieved_tflops_per_gpu / bf16:.1f}%. "
                     "fp8 runs keep attention, norms and some matmuls in bf16, and published MFU is often against the bf16 peak "
                     "(Llama 4's fp8 pretraining: 390 TFLOPS per GPU, ~20% of the fp8 peak): say which.")
    f.append("Peaks are dense: NVIDIA datasheets print tensor TFLOPS 'with sparsity', twice the dense figure. "
             "MFU against a sparse peak looks half as good as it is.")
    if not has_arch:
        f.append("Only params_b given: FLOPs per token is 6N (embedding included, attention scores left out). "
                 "Give a preset or layers/hidden/heads for the attention term, which grows with the sequence length.")
    res.next = ["matmul_bench", "knowledge://compute/theoretical-vs-achievable.md",
                "knowledge://training/throughput-tuning.md", "knowledge://compute/mamf.md"]


SPEC = ToolSpec(
    name="mfu_calc",
    summary="Achieved TFLOPS per GPU, MFU, HFU and MAMF utilisation of a training run from its tokens/s.",
    description=(
        "Use when a user asks how efficient a training run is ('what is my MFU', 'is 3000 tokens/s per GPU good "
        "for a 8B model on H100'). Needs the measured tokens/s (total or per GPU), the model (preset, params_b or "
        "architecture), the sequence length, GPU count and GPU model. Reports FLOPs per token (6N + attention), "
        "achieved TFLOPS per GPU, MFU vs the dense datasheet peak, HFU with recomputation, and utilisation vs "
        "the measured max achievable matmul TFLOPS (from matmul_bench results on this GPU model, else published), "
        "and flags common traps (total vs per-GPU tokens, sparse datasheet peaks, fp8 vs bf16 peaks). Pure "
        "arithmetic, instant, no GPU. Not a benchmark: run matmul_bench to measure the GPU itself."
        " Also when an MFU figure looks wrong: above 100%, computed against the sparse peak, or from a"
        " framework's TFLOPS-per-GPU log line."),
    Params=MfuParams, Result=MfuResult, run=run, runs="in_process", store=False,
)

if __name__ == "__main__":
    from .engine.cli import tool_main

    tool_main(SPEC)
