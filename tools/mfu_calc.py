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
    mleng run mfu_calc --model llama-3-8b --tokens-per-s 3500 --tokens-per-s-scope per_gpu --accelerator h100 --seq-len 8192
    mleng run mfu_calc --params-b 70 --tokens-per-s 120000 --num-gpus 256 --accelerator h200 --json
"""

from typing import Literal

from pydantic import ConfigDict, model_validator

from .shared.planning import find_accelerator
from .shared.transformer_math import MODEL_DESCRIBED, AttentionFlops, ModelParams, Recompute, flops_per_token
from .engine.spec import SELF_EVIDENT, Field, Progress, Result, ToolFailure, ToolSpec, needs, present

DTYPES = ("bf16", "fp16", "fp8", "tf32", "fp32")


THROUGHPUTS = ("tokens_per_s", "step_time_s", "samples_per_s", "achieved_tflops_per_gpu")


class MfuParams(ModelParams):
    model_config = ConfigDict(json_schema_extra={"allOf": [
        MODEL_DESCRIBED, {"oneOf": [present(k) for k in THROUGHPUTS]},
        needs("step_time_s", "global_batch"), needs("global_batch", "step_time_s")]})

    tokens_per_s: float | None = Field(None, gt=0, le=1e12, description=(
        "Measured. One of: this, step_time_s + global_batch, samples_per_s, achieved_tflops_per_gpu."))
    tokens_per_s_scope: Literal["total", "per_gpu"] = Field(
        "total", description="Whole job or one GPU.")
    step_time_s: float | None = Field(None, gt=0, le=1e6, description="Per optimizer step (with global_batch).")
    global_batch: int | None = Field(None, ge=1, le=1e9, description="Sequences per step, whole job.")
    samples_per_s: float | None = Field(None, gt=0, le=1e12, description="Sequences/s, seq_len tokens each.")
    achieved_tflops_per_gpu: float | None = Field(None, gt=0, le=1e6, description="As a framework printed.")
    num_gpus: int = Field(1, ge=1, le=1_000_000, json_schema_extra=SELF_EVIDENT, description="GPUs in the job.")
    seq_len: int = Field(4096, ge=1, le=10_000_000, json_schema_extra=SELF_EVIDENT, description="Tokens per sequence.")
    accelerator: str | None = Field(None, max_length=100, description="Default: this machine's GPU.")
    dtype: Literal["bf16", "fp16", "fp8", "tf32", "fp32"] = Field(
        "bf16", description="Selects the datasheet peak.")
    activation_checkpointing: Recompute = Field(
        "none", description="Recompute: adds hardware FLOPs (HFU), not MFU.")
    attention_flops: AttentionFlops = Field(
        "causal", description=(
            "causal: half the scores (Megatron, torchtitan); full: PaLM; none: 6N."))
    embedding_flops: Literal["exclude", "include"] = Field(
        "exclude", description="Count the input embedding in 6N.")
    peak_tflops: float | None = Field(None, gt=0, le=1e6, description="Override the dense peak per GPU (power cap).")

    @model_validator(mode="after")
    def _one_throughput(self):
        given = [k for k in THROUGHPUTS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one throughput: tokens_per_s, step_time_s (+ global_batch), samples_per_s "
                             f"or achieved_tflops_per_gpu (got {', '.join(given) or 'none'})")
        if (self.step_time_s is None) != (self.global_batch is None):
            raise ValueError("step_time_s and global_batch go together: tokens/s = global_batch x seq_len / step_time_s")
        return self

    def tokens_per_s_per_gpu(self, flops_per_token: float) -> tuple[float, str]:
        """Throughput per GPU and where it came from."""
        per = self.num_gpus if self.tokens_per_s_scope == "total" else 1
        if self.tokens_per_s is not None:
            return self.tokens_per_s / per, f"{self.tokens_per_s:,.0f} tokens/s ({self.tokens_per_s_scope})"
        if self.samples_per_s is not None:
            return self.samples_per_s * self.seq_len / per, f"{self.samples_per_s:,.1f} samples/s x {self.seq_len} tokens"
        if self.step_time_s is not None:
            tps = self.global_batch * self.seq_len / self.step_time_s
            return tps / self.num_gpus, (f"{self.global_batch} sequences x {self.seq_len} tokens per "
                                         f"{self.step_time_s:g} s step = {tps:,.0f} tokens/s")
        return self.achieved_tflops_per_gpu * 1e12 / flops_per_token, f"{self.achieved_tflops_per_gpu:g} TFLOPS per GPU"


class MfuResult(Result):
    accelerator: str | None = Field(None, description="GPU the peak figures are for.")
    throughput_basis: str | None = Field(None, description="The throughput the figures are computed from.")
    tokens_per_s_per_gpu: float | None = Field(None, description="Throughput per GPU (tokens/s).")
    attention_convention: str | None = Field(None, description="causal | full | none: what mfu_pct counts.")
    flops_per_token: float | None = Field(None, description="Model FLOPs per trained token (forward + backward).")
    flops_per_token_causal: float | None = Field(None, description="The same with causal attention (FLOPs).")
    flops_per_token_full: float | None = Field(None, description="The same with the full score matrix (FLOPs).")
    hardware_flops_per_token: float | None = Field(None, description="With recomputation (FLOPs per token).")
    attention_share_pct: float | None = Field(None, description="Share of the model FLOPs in attention scores (%).")
    achieved_tflops_per_gpu: float | None = Field(None, description="Model TFLOPS per GPU (1e12 FLOP/s).")
    peak_tflops: float | None = Field(None, description="Dense datasheet peak for the dtype (TFLOPS).")
    mfu_pct: float | None = Field(None, description="Model FLOPs utilisation vs the dense peak, attention_convention (%).")
    mfu_causal_pct: float | None = Field(None, description="MFU counting causal attention (%).")
    mfu_full_pct: float | None = Field(None, description="MFU counting the full score matrix (%).")
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
    if arch and params.params_b is None and params.embedding_flops == "include":
        matmul_params += arch.embedding_params()
    conventions = {c: flops_per_token(matmul_params, arch, params.seq_len, c, params.activation_checkpointing)
                   for c in ("causal", "full", params.attention_flops)}
    flops = conventions[params.attention_flops]
    per_gpu, basis = params.tokens_per_s_per_gpu(flops.model)
    achieved = flops.model * per_gpu / 1e12
    res = MfuResult(accelerator=acc["name"], throughput_basis=basis, tokens_per_s_per_gpu=round(per_gpu, 3),
                    attention_convention=params.attention_flops, flops_per_token=flops.model,
                    flops_per_token_causal=conventions["causal"].model, flops_per_token_full=conventions["full"].model,
                    hardware_flops_per_token=flops.hardware,
                    attention_share_pct=round(100 * flops.attention / flops.model, 2),
                    achieved_tflops_per_gpu=round(achieved, 2), peak_tflops=peak,
                    mfu_pct=round(100 * achieved / peak, 2),
                    mfu_causal_pct=round(100 * conventions["causal"].model * per_gpu / 1e12 / peak, 2),
                    mfu_full_pct=round(100 * conventions["full"].model * per_gpu / 1e12 / peak, 2),
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
    f.append(f"{res.achieved_tflops_per_gpu:.1f} TFLOPS per GPU achieved ({per_gpu:,.0f} tokens/s per GPU from "
             f"{res.throughput_basis}, x {flops.model / 1e9:.2f} GFLOP per token): MFU {res.mfu_pct:.1f}% of the "
             f"{res.peak_tflops:g} TFLOPS dense {p.dtype} peak of {acc['name']}.")
    if has_arch and p.attention_flops != "none":
        f.append(f"Attention counted {p.attention_flops}. MFU is {res.mfu_causal_pct:.1f}% counting causal attention "
                 f"(Megatron-Bridge, torchtitan) and {res.mfu_full_pct:.1f}% counting the full score matrix (PaLM, the "
                 "Megatron-LM paper): compare with a source that counts the same way.")
    if has_arch and p.params_b is None:
        f.append("Embedding " + ("included (6 x vocab x hidden more per token, as 6N over all parameters counts)."
                                 if p.embedding_flops == "include" else "lookup not counted as FLOPs (the output head "
                                 "is); embedding_flops=include matches sources that use 6N over all parameters."))
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
                    f"({ceiling:g}). Check that the throughput is {'for the whole job' if p.tokens_per_s_scope == 'total' else 'per GPU'}, "
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
    if p.num_gpus > 1 and (mfu < 20 or mfu > 75) and (p.tokens_per_s or p.samples_per_s):
        other = mfu * p.num_gpus if p.tokens_per_s_scope == "total" else mfu / p.num_gpus
        scope = "per GPU" if p.tokens_per_s_scope == "total" else "for the whole job"
        if 5 <= other <= 100:  # only when the other reading is plausible
            f.append(f"Trap: if {res.throughput_basis} was {scope}, MFU would be {other:.1f}%.")
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
    summary="Achieved TFLOPS per GPU, MFU (causal and full attention), HFU and MAMF utilisation of a training run.",
    description=(
        "Use for 'what is my MFU', 'is 3000 tokens/s per GPU good for an 8B model on H100': from one measured "
        "throughput (tokens/s total or per GPU, step time with global batch, samples/s, or a framework's "
        "TFLOPS), the model, sequence length, GPU count and model: FLOPs per token (causal and full "
        "attention), achieved TFLOPS per GPU, MFU vs the dense peak, HFU, utilisation vs measured MAMF; flags "
        "total vs per-GPU tokens, sparse peaks, an MFU above 100%. Instant arithmetic. Measuring the GPU "
        "itself: matmul_bench."),
    Params=MfuParams, Result=MfuResult, run=run, runs="in_process", store=False,
)

if __name__ == "__main__":
    from .engine.cli import tool_main

    tool_main(SPEC)
