"""memory_estimate — will this training or inference setup fit in GPU memory, and if not, what would.

Pure arithmetic, no GPU needed: per-GPU bytes for weights, gradients, master weights, optimizer
states, activations, logits, KV cache and framework / NCCL overhead, for the most loaded pipeline
stage, against an accelerator's memory; the largest micro batch that fits; changes that make it fit.
Formulas and the published figures they were checked against: docs/memory_estimate_validation.md.

How to run by hand (anywhere, it runs no GPU code):
    python -m tools.memory_estimate --model llama-3-8b --accelerator h100 --seq-len 8192
    python -m tools.memory_estimate --model llama-3-70b --tp 8 --pp 2 --dp 4 --sharding zero1 --json
    python -m tools.memory_estimate --model llama-3-70b --mode inference --tp 4 --micro-batch 32 --kv-dtype fp8
"""

from typing import Literal

from pydantic import ValidationError, model_validator

from . import memory_math as mm
from ..shared.planning import GIB, capacity_gib, find_accelerator, gib
from ..shared.transformer_math import ModelParams
from ..engine.spec import Field, Progress, Result, ToolSpec


class MemoryParams(ModelParams):
    mode: Literal["train", "inference"] = Field("train", description="train (model states + activations) "
                                                "or inference (weights + KV cache).")
    precision: Literal["fp32", "bf16_mixed", "fp16_mixed", "fp8"] = Field(
        "bf16_mixed", description="Training: fp32, bf16/fp16 mixed (half weights, fp32 master), fp8 "
        "(Transformer Engine: bf16 weights + fp8 copy). Inference: weight dtype (fp8 = 1 byte).")
    optimizer: Literal["adamw", "adam", "adam_8bit", "sgd_momentum", "adafactor"] = Field(
        "adamw", description="Optimizer; states per parameter: Adam/AdamW 8 B, 8-bit Adam 2 B, "
        "SGD with momentum 4 B, Adafactor ~0 (factored).")
    fp32_grads: bool = Field(True, description="Gradients kept in fp32 (Megatron-LM main_grad; 18 B/param "
                             "with Adam) rather than half precision (DeepSpeed ZeRO; 16 B/param).")
    sharding: Literal["none", "zero1", "zero2", "zero3", "fsdp_full_shard", "fsdp_hybrid_shard"] = Field(
        "none", description="ZeRO stage / FSDP strategy; shards over dp x cp ranks (hybrid: within "
        "shard_group_size ranks).")
    shard_group_size: int = Field(8, ge=1, le=100000, description="fsdp_hybrid_shard: GPUs per shard "
                                  "group (usually GPUs per node).")
    tp: int = Field(1, ge=1, le=1024, description="Tensor-parallel size (must divide heads).")
    pp: int = Field(1, ge=1, le=1024, description="Pipeline-parallel stages (1F1B schedule assumed).")
    dp: int = Field(1, ge=1, le=1_000_000, description="Data-parallel replicas.")
    cp: int = Field(1, ge=1, le=1024, description="Context-parallel size (sequence split across GPUs).")
    seq_len: int = Field(4096, ge=1, le=10_000_000, description="Training: sequence length. Inference: "
                         "context length per sequence held in the KV cache.")
    micro_batch: int = Field(1, ge=1, le=1_000_000, description="Training: sequences per micro batch per "
                             "GPU. Inference: concurrent sequences (KV cache batch).")
    activation_checkpointing: Literal["none", "selective", "full"] = Field(
        "none", description="none; selective (recompute attention scores, Megatron); full (keep layer "
        "inputs only).")
    flash_attention: bool = Field(True, description="Fused attention that never stores the seq x seq "
                                  "score matrix.")
    kernels: Literal["fused", "eager"] = Field(
        "eager", description="eager: plain PyTorch / Hugging Face modules (RMSNorm keeps fp32 copies, SwiGLU "
        "keeps silu output); fused: Megatron / Transformer Engine / compiled kernels (Korthikanti's formula).")
    sequence_parallel: bool = Field(True, description="With tp > 1, also split norm/dropout activations "
                                    "(Megatron sequence parallelism).")
    dropout: bool = Field(False, description="Dropout on (stores 1-byte masks); most LLM pretraining runs "
                          "without it.")
    kv_dtype: Literal["bf16", "fp16", "fp8", "fp32"] = Field("bf16", description="Inference: KV cache dtype.")
    accelerator: str | None = Field(None, max_length=100, description="GPU to check the fit against "
                                    "(id, name or alias from accelerator_specs, e.g. h100, h200, a100, mi300x).")
    gpu_memory_gib: float | None = Field(None, gt=0, le=10000, description="Usable GPU memory in GiB; "
                                         "overrides the accelerator's datasheet size.")

    @model_validator(mode="after")
    def _check_parallelism(self):
        arch = self.architecture()
        if arch is not None:
            if arch.heads % self.tp:
                raise ValueError(f"tp={self.tp} does not divide heads={arch.heads}: tensor parallelism splits "
                                 f"attention heads across GPUs; use a divisor of {arch.heads}")
            if arch.kv_heads % self.tp and self.tp % arch.kv_heads:
                raise ValueError(f"tp={self.tp} and kv_heads={arch.kv_heads}: one must divide the other")
            if self.pp > arch.layers:
                raise ValueError(f"pp={self.pp} is more than layers={arch.layers}")
        if self.sharding == "fsdp_hybrid_shard" and (self.dp * self.cp) % self.shard_group_size:
            raise ValueError(f"shard_group_size={self.shard_group_size} must divide dp x cp = {self.dp * self.cp}")
        return self


class MemoryResult(Result):
    total_gib: float | None = Field(None, description="Estimated peak per GPU (GiB).")
    weights_gib: float | None = Field(None, description="Model weights per GPU (GiB).")
    gradients_gib: float | None = Field(None, description="Gradients per GPU (GiB).")
    optimizer_states_gib: float | None = Field(None, description="Optimizer states per GPU (GiB).")
    master_weights_gib: float | None = Field(None, description="fp32 master weights per GPU (GiB).")
    gathered_params_gib: float | None = Field(None, description="ZeRO-3/FSDP unsharded layers in flight (GiB).")
    activations_gib: float | None = Field(None, description="Saved activations at the backward peak (GiB).")
    logits_gib: float | None = Field(None, description="fp32 logits saved for the loss (GiB).")
    loss_backward_gib: float | None = Field(None, description="Logit gradients and the returned 16-bit "
                                            "logits alive as backward starts (eager kernels; GiB).")
    kv_cache_gib: float | None = Field(None, description="Inference KV cache per GPU (GiB).")
    framework_overhead_gib: float | None = Field(None, description="CUDA context + allocator slack (GiB).")
    nccl_buffers_gib: float | None = Field(None, description="NCCL communicator buffers (GiB).")
    pipeline_stage: str | None = Field(None, description="Stage the breakdown is for: only | first | last.")
    params_total: int | None = Field(None, description="Parameters of the whole model.")
    params_per_gpu: int | None = Field(None, description="Parameters held per GPU before ZeRO/FSDP sharding.")
    model_state_bytes_per_param: float | None = Field(None, description="Unsharded training bytes per parameter.")
    kv_cache_bytes_per_token: float | None = Field(None, description="KV cache bytes per token per GPU.")
    world_size: int | None = Field(None, description="tp x pp x dp x cp GPUs.")
    accelerator: str | None = Field(None, description="Accelerator the fit was checked against.")
    capacity_gib: float | None = Field(None, description="Memory the fit was checked against (GiB).")
    fits: bool | None = Field(None, description="Total <= capacity (None without an accelerator).")
    max_micro_batch: int | None = Field(None, description="Largest micro batch (inference: sequences) that fits.")
    changes_to_fit: list[str] = Field(default_factory=list, description="Changes (single, else pairs) that make "
                                      "it fit, least disruptive first, each with its new total.")


def setup_from(p: MemoryParams) -> mm.Setup:
    fields = {k: getattr(p, k) for k in ("mode", "precision", "optimizer", "fp32_grads", "sharding",
                                          "shard_group_size", "tp", "pp", "dp", "cp", "seq_len", "micro_batch",
                                          "activation_checkpointing", "flash_attention", "kernels", "sequence_parallel",
                                          "dropout", "kv_dtype")}
    return mm.Setup(arch=p.architecture(), total_params=p.total_params(), **fields)


MAX_TP = 8  # tensor parallelism beyond one NVLink domain (8 GPUs) is slow: not suggested


def candidate_changes(p: MemoryParams) -> list[tuple[str, dict]]:
    """Single changes worth trying, least disruptive first."""
    if p.mode == "inference":
        changes = [("kv_dtype=fp8", {"kv_dtype": "fp8"}), ("precision=fp8 (fp8 weights)", {"precision": "fp8"})]
        changes += [(f"tp={p.tp * k}", {"tp": p.tp * k}) for k in (2, 4) if p.tp * k <= MAX_TP]
        return changes
    changes = []
    if p.activation_checkpointing == "none" and not p.flash_attention:  # with flash it saves nothing more
        changes += [("activation_checkpointing=selective", {"activation_checkpointing": "selective"})]
    if not p.flash_attention:
        changes += [("flash_attention=true", {"flash_attention": True})]
    if p.kernels == "eager":
        changes += [("kernels=fused", {"kernels": "fused"})]
    if p.activation_checkpointing != "full":
        changes += [("activation_checkpointing=full", {"activation_checkpointing": "full"})]
    order = ["none", "zero1", "zero2", "zero3"]
    if p.dp * p.cp > 1 and p.sharding in order[:-1]:
        changes += [(f"sharding={s}", {"sharding": s}) for s in order[order.index(p.sharding) + 1:]]
    if p.optimizer in ("adam", "adamw"):
        changes += [("optimizer=adam_8bit", {"optimizer": "adam_8bit"})]
    changes += [(f"tp={p.tp * 2}", {"tp": p.tp * 2})] if p.tp * 2 <= MAX_TP else []
    changes += [(f"pp={p.pp * 2}", {"pp": p.pp * 2})]
    if p.sharding in ("zero3", "fsdp_full_shard"):
        changes += [(f"dp={p.dp * 2} (more GPUs to shard over)", {"dp": p.dp * 2})]
    return changes


def changes_that_fit(p: MemoryParams, capacity_bytes: float) -> list[str]:
    """Single changes that fit; when none does, pairs of them."""
    singles = candidate_changes(p)
    found = _fitting(p, singles, capacity_bytes)
    if not found:
        pairs = [(f"{a} + {b}", {**ua, **ub}) for i, (a, ua) in enumerate(singles) for b, ub in singles[i + 1:]
                 if not ua.keys() & ub.keys()]
        found = _fitting(p, pairs, capacity_bytes)
    return found


def _fitting(p: MemoryParams, changes: list[tuple[str, dict]], capacity_bytes: float) -> list[str]:
    found = []
    for label, update in changes:
        try:
            q = MemoryParams(**{**p.model_dump(exclude_unset=True), **update})
        except ValidationError:  # e.g. tp that no longer divides the heads
            continue
        total = mm.total_bytes(setup_from(q))
        if total <= capacity_bytes:
            found.append(f"{label}: {total / GIB:.1f} GiB")
    return found


def run(params: MemoryParams, progress: Progress) -> MemoryResult:
    s = setup_from(params)
    arch = s.arch
    stage, parts = mm.breakdown(s)
    total = sum(parts.values())
    res = MemoryResult(total_gib=gib(total), pipeline_stage=stage, params_total=s.total_params,
                       world_size=s.world_size, **{f"{k}_gib": gib(v) for k, v in parts.items()})
    res.params_per_gpu = int(max(mm.stage_params(s, st) for st in mm.stages(s)))
    if s.mode == "train":
        res.model_state_bytes_per_param = round(sum(mm.model_state_bytes_per_param(s).values()), 3)
    elif arch is not None:
        res.kv_cache_bytes_per_token = mm.kv_cache_bytes_per_token(s)

    top = sorted(((v, k) for k, v in parts.items() if v > 0), reverse=True)[:4]
    where = f" ({'most loaded stage: ' + stage if stage != 'only' else 'no pipeline'})" if s.pp > 1 else ""
    res.findings.append(f"Estimated peak per GPU{where}: {total / GIB:.1f} GiB; largest parts: "
                        + ", ".join(f"{k.replace('_', ' ')} {v / GIB:.1f} GiB" for v, k in top) + ".")
    if s.mode == "train" and res.model_state_bytes_per_param:
        res.findings.append(f"Model states: {res.model_state_bytes_per_param:g} bytes per parameter before "
                            f"sharding; {s.total_params / 1e9:.2f} B parameters in all.")
    if s.mode == "inference" and arch is not None:
        res.findings.append(f"KV cache: {res.kv_cache_bytes_per_token / 1024:.0f} KiB per token per GPU "
                            f"({params.kv_dtype}), {parts['kv_cache'] / GIB:.1f} GiB for {s.micro_batch} x "
                            f"{s.seq_len} tokens.")
    if arch is None:
        res.findings.append("Only params_b was given: activations, logits and KV cache are not included; "
                            "give a model preset or layers/hidden/heads to include them.")
    if s.sharding != "none" and s.shard_degree() == 1:
        res.findings.append(f"{s.sharding} with dp x cp = 1 shards over a single GPU: it saves no memory.")
    _judge_fit(params, s, total, res)
    res.next = ["knowledge://training/memory-math.md", "knowledge://debugging/oom.md"]
    if s.mode == "inference":
        res.next.append("knowledge://inference/kv-cache.md")
    return res


def _judge_fit(params: MemoryParams, s: mm.Setup, total: float, res: MemoryResult) -> None:
    if params.gpu_memory_gib is not None:
        res.accelerator, res.capacity_gib = "given", params.gpu_memory_gib
    elif params.accelerator:
        acc = find_accelerator(params.accelerator)
        res.accelerator, res.capacity_gib = acc["name"], round(capacity_gib(acc), 2)
    else:
        res.findings.append("No accelerator given: set accelerator (e.g. h100) to check the fit.")
        return
    cap = res.capacity_gib * GIB
    res.fits = total <= cap
    res.max_micro_batch = mm.max_micro_batch(s, cap) if s.arch is not None else None
    if res.fits:
        res.verdict = "ok" if total <= 0.9 * cap else "warn"
        res.findings.insert(0, f"Fits: {total / GIB:.1f} of {res.capacity_gib:.1f} GiB on {res.accelerator} "
                            f"({100 * total / cap:.0f}%).")
        if res.verdict == "warn":
            res.findings.append("Less than 10% headroom: allocator fragmentation or a longer batch can still OOM.")
    else:
        res.verdict = "fail"
        res.findings.insert(0, f"Does not fit: {total / GIB:.1f} GiB needed, {res.capacity_gib:.1f} GiB on "
                            f"{res.accelerator}.")
        res.changes_to_fit = changes_that_fit(params, cap)
        if res.changes_to_fit:
            res.findings.append("Changes that fit: " + "; ".join(res.changes_to_fit[:4]) + ".")
        else:
            res.findings.append("No single change or pair fits: add GPUs (tp/pp/dp), combine more, or offload to CPU.")
    if res.max_micro_batch == 0:
        res.findings.append("Even a micro batch of 1 sequence does not fit.")
    elif res.max_micro_batch is not None:
        what = "Most concurrent sequences that fit" if s.mode == "inference" else "Largest micro batch that fits"
        res.findings.append(f"{what}: {res.max_micro_batch}.")


SPEC = ToolSpec(
    name="memory_estimate",
    summary="Per-GPU memory for training or inference of a transformer: breakdown, fit, largest batch.",
    description=(
        "Use before launching a run or after an OOM to ask 'will it fit?': estimates per-GPU memory from a "
        "model preset (llama-3-8b, llama-3-70b, ...), an architecture or a parameter count, with precision, "
        "optimizer, ZeRO/FSDP sharding, TP/PP/DP/CP, sequence length, micro batch, activation "
        "checkpointing and flash attention; inference mode adds a KV cache. Returns the breakdown (weights, "
        "gradients, optimizer, master weights, activations, logits and their gradients, KV cache, overhead), "
        "whether it fits on an accelerator, the largest micro batch that fits and single changes that make it fit. "
        "Pure arithmetic: instant, no GPU. It is an estimate (~10%): measure with torch.cuda.max_memory_allocated "
        "when the exact figure matters. Dense decoder-only models only (no MoE)."),
    Params=MemoryParams, Result=MemoryResult, run=run, runs="in_process", store=False,
)
