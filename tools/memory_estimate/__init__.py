"""memory_estimate — will this training or inference setup fit in GPU memory, and if not, what would.

Pure arithmetic, no GPU needed: per-GPU bytes for weights, gradients, master weights, optimizer
states, activations, logits, KV cache and framework / NCCL overhead, for the most loaded pipeline
stage, against an accelerator's memory; the largest micro batch that fits; changes that make it fit.
Formulas and the published figures they were checked against: docs/memory_estimate_validation.md.

How to run by hand (anywhere, it runs no GPU code):
    mleng run memory_estimate --model llama-3-8b --accelerator h100 --seq-len 8192
    mleng run memory_estimate --model llama-3-70b --tp 8 --pp 2 --dp 4 --sharding zero1 --json
    mleng run memory_estimate --model llama-3-70b --mode inference --tp 4 --micro-batch 32 --kv-dtype fp8
    mleng run memory_estimate --model llama-3-8b --precision amp_bf16 --sharding fsdp_full_shard --dp 8 \
        --seq-len 8192 --micro-batch 2 --activation-checkpointing op_selective --gpu-memory-gib 95   # torchtitan
    mleng run memory_estimate --model mixtral-8x7b --dp 8 --ep 8 --sharding zero3 --activation-checkpointing full
    mleng run memory_estimate --model llama-3-8b --mode inference --gpu-memory-utilization 0.9 --seq-len 32768 \
        --accelerator h100                                                                              # vLLM-style
"""

from typing import Literal

from pydantic import ConfigDict, model_validator

from . import activations as ma
from . import fit
from . import memory_math as mm
from . import paged
from . import report
from .setup import setup_from, unmodelled
from ..shared.transformer_math import MODEL_DESCRIBED, ModelParams
from ..engine.spec import SELF_EVIDENT, Field, Progress, Result, ToolSpec, present


SHARDED = ["zero3", "fsdp_full_shard", "fsdp_hybrid_shard"]


class MemoryParams(ModelParams):
    model_config = ConfigDict(json_schema_extra={"allOf": [
        MODEL_DESCRIBED,
        {"anyOf": [{"not": present("offload", const="optimizer_and_params")}, present("sharding", enum=SHARDED)]},
        {"anyOf": [{"not": present("gpu_memory_utilization")}, present("mode", const="inference")]}]})

    mode: Literal["train", "inference"] = Field("train", description=(
        "train: states + activations; inference: weights + KV cache."))
    precision: Literal["fp32", "bf16_mixed", "fp16_mixed", "fp8", "amp_bf16", "amp_fp8"] = Field(
        "bf16_mixed", description=(
            "*_mixed: 16-bit + fp32 master (Megatron, DeepSpeed); amp_*: fp32 weights, autocast (FSDP2, torchtitan). "
            "Inference: weight dtype."))
    optimizer: Literal["adamw", "adam", "adam_8bit", "sgd_momentum", "adafactor"] = Field(
        "adamw", description="Bytes/param: Adam(W) 8, adam_8bit 2, sgd_momentum 4, adafactor ~0.")
    fp32_grads: bool = Field(True, description=(
        "16-bit precisions: fp32 grads (Megatron), else 16-bit (ZeRO)."))
    sharding: Literal["none", "zero1", "zero2", "zero3", "fsdp_full_shard", "fsdp_hybrid_shard"] = Field(
        "none", description="Over dp x cp (hybrid: within shard_group_size).")
    shard_group_size: int = Field(8, ge=1, le=100000, description="Hybrid shard group (usually GPUs per node).")
    reshard_after_forward: Literal["auto", "after_forward", "never"] = Field(
        "auto", description="ZeRO-3/FSDP; auto: never when pp > 1.")
    tp: int = Field(1, ge=1, le=1024, description="Tensor parallel (divides heads).")
    pp: int = Field(1, ge=1, le=1024, json_schema_extra=SELF_EVIDENT, description="Pipeline stages.")
    pp_microbatches: int | None = Field(None, ge=1, le=100000, description="With pp > 1; default pp.")
    pipeline_schedule: Literal["1f1b", "gpipe", "interleaved_1f1b"] = Field(
        "1f1b", description="1f1b: min(pp, micro batches) in flight; gpipe: all; interleaved: not modelled.")
    dp: int = Field(1, ge=1, le=1_000_000, json_schema_extra=SELF_EVIDENT, description="Data-parallel replicas.")
    num_gpus: int | None = Field(None, ge=1, le=1_000_000, description="All GPUs: sets dp = num_gpus / (tp x pp x cp).")
    cp: int = Field(1, ge=1, le=1024, json_schema_extra=SELF_EVIDENT, description="Context parallel (sequence split).")
    ep: int = Field(1, ge=1, le=100000, description="MoE expert parallel (divides experts and dp x cp).")
    seq_len: int = Field(4096, ge=1, le=10_000_000, description=(
        "Inference: context per sequence."))
    micro_batch: int = Field(1, ge=1, le=1_000_000, description=(
        "Per GPU; inference: concurrent sequences."))
    activation_checkpointing: Literal["none", "selective", "op_selective", "full"] = Field(
        "none", description=(
            "selective: Megatron; op_selective: torchtitan SAC; full: layer inputs only."))
    flash_attention: bool | None = Field(None, description="No seq x seq scores; default on (off with fp32).")
    kernels: Literal["fused", "eager"] = Field(
        "eager", description=(
            "eager: PyTorch / HF; fused: Megatron / TE."))
    compile: Literal["none", "blocks", "full"] = Field(
        "none", description="torch.compile; blocks: loss eager (torchtitan).")
    loss_parallel: bool = Field(True, description="tp > 1, eager: vocab-parallel loss.")
    sequence_parallel: bool = Field(True, description="tp > 1: split norm/dropout too.")
    dropout: bool = Field(False, description="Stores 1-byte masks.")
    finetune: Literal["full", "lora", "qlora"] = Field(
        "full", description="lora: frozen 16-bit base; qlora: 4-bit NF4 base.")
    lora_rank: int = Field(16, ge=1, le=65536, json_schema_extra=SELF_EVIDENT, description="Adapter rank r.")
    offload: Literal["none", "optimizer", "optimizer_and_params"] = Field(
        "none", description="To CPU: optimizer states, master, grads; +params (ZeRO-3): weights.")
    offload_device: Literal["cpu", "nvme"] = Field("cpu", description="nvme: ZeRO-Infinity.")
    gpus_per_node: int = Field(8, ge=1, le=1024, description="For host RAM per node.")
    kv_dtype: Literal["bf16", "fp16", "fp8", "fp32"] = Field("bf16", description="Inference KV cache.")
    gpu_memory_utilization: float | None = Field(
        None, gt=0, le=1, description="Paged KV (vLLM): fraction of GPU memory used.")
    max_num_seqs: int | None = Field(None, ge=1, le=1_000_000, description="Paged KV: vLLM --max-num-seqs.")
    max_num_batched_tokens: int = Field(8192, ge=1, le=10_000_000, description=(
        "Prefill chunk (vLLM)."))
    accelerator: str | None = Field(None, max_length=100, description="GPU to fit (h100, h200, mi300x...).")
    gpu_memory_gib: float | None = Field(None, gt=0, le=10000, description="Usable GPU GiB; overrides the datasheet.")

    @model_validator(mode="before")
    @classmethod
    def _dp_from_num_gpus(cls, data):
        """Users say "64 GPUs": dp is what tp x pp x cp leave of them."""
        if not isinstance(data, dict) or data.get("num_gpus") is None:
            return data
        try:
            gpus = int(data["num_gpus"])
            per_replica = int(data.get("tp") or 1) * int(data.get("pp") or 1) * int(data.get("cp") or 1)
            dp = int(data["dp"]) if data.get("dp") is not None else None
        except (TypeError, ValueError):
            return data   # the fields' own validators say what is wrong
        if per_replica < 1 or gpus % per_replica:
            raise ValueError(f"num_gpus={gpus} is not a multiple of tp x pp x cp = {per_replica}")
        if dp is not None and dp * per_replica != gpus:
            raise ValueError(f"num_gpus={gpus} and dp={dp} disagree: dp x tp x pp x cp = {dp * per_replica}; "
                             "give one of them")
        return {**data, "dp": gpus // per_replica}

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
            if self.ep > 1 and (not arch.moe or arch.experts % self.ep):
                raise ValueError(f"ep={self.ep} needs a MoE model whose experts ({arch.experts}) it divides")
        if self.ep > 1 and (self.dp * self.cp) % self.ep:
            raise ValueError(f"ep={self.ep} must divide dp x cp = {self.dp * self.cp} (experts are split over "
                             "data-parallel ranks)")
        if self.sharding == "fsdp_hybrid_shard" and (self.dp * self.cp) % self.shard_group_size:
            raise ValueError(f"shard_group_size={self.shard_group_size} must divide dp x cp = {self.dp * self.cp}")
        if self.offload == "optimizer_and_params" and self.sharding not in SHARDED:
            raise ValueError("offload=optimizer_and_params needs sharding zero3 or fsdp_* (parameter offload is ZeRO-3's)")
        if self.finetune != "full" and arch is None:
            raise ValueError(f"finetune={self.finetune} needs the architecture (a preset or layers/hidden/heads): "
                             "adapters are sized from the layer shapes")
        if self.gpu_memory_utilization is not None and self.mode != "inference":
            raise ValueError("gpu_memory_utilization is for mode=inference (paged KV cache)")
        return self


class MemoryResult(Result):
    total_gib: float | None = Field(None, description="Estimated peak per GPU, CUDA context and NCCL included (GiB); "
                                    "None when the setup is not modelled.")
    torch_reserved_gib: float | None = Field(None, description="What torch.cuda.max_memory_reserved would show: "
                                             "tensors + allocator slack, no CUDA context or NCCL (GiB).")
    torch_allocated_gib: float | None = Field(None, description="What torch.cuda.max_memory_allocated would show (GiB).")
    model_states_gib: float | None = Field(None, description="Weights + gradients + master + optimizer states + "
                                           "gathered parameters per GPU (GiB).")
    weights_gib: float | None = Field(None, description="Model weights per GPU (GiB; LoRA/QLoRA: the frozen base too).")
    gradients_gib: float | None = Field(None, description="Gradients per GPU (GiB).")
    optimizer_states_gib: float | None = Field(None, description="Optimizer states per GPU (GiB).")
    master_weights_gib: float | None = Field(None, description="fp32 master weights per GPU (GiB).")
    gathered_params_gib: float | None = Field(None, description="ZeRO-3/FSDP unsharded parameters (and, without "
                                              "resharding, accumulated gradients) in flight (GiB).")
    weight_copies_gib: float | None = Field(None, description="torch.autocast's 16-bit (fp8) weight copies (GiB).")
    activations_gib: float | None = Field(None, description="Saved activations at the backward peak (GiB).")
    logits_gib: float | None = Field(None, description="Logits saved for the loss (GiB).")
    loss_backward_gib: float | None = Field(None, description="Logit-sized tensors more as the loss backward runs (GiB).")
    backward_working_gib: float | None = Field(None, description="What a layer's backward adds beyond that (GiB).")
    kv_cache_gib: float | None = Field(None, description="Inference KV cache per GPU (GiB).")
    framework_overhead_gib: float | None = Field(None, description="CUDA context + allocator slack (GiB).")
    nccl_buffers_gib: float | None = Field(None, description="NCCL communicator buffers (GiB).")
    host_ram_per_node_gib: float | None = Field(None, description="Offload: host RAM per node, DeepSpeed's 1.5 "
                                                "buffer factor included (GiB).")
    nvme_per_node_gib: float | None = Field(None, description="Offload to NVMe: states per node on NVMe (GiB).")
    pipeline_stage: str | None = Field(None, description="Stage the breakdown is for: only | first | last.")
    params_total: int | None = Field(None, description="Parameters of the whole model (MoE: all experts).")
    params_active: int | None = Field(None, description="Parameters one token uses (MoE: its top_k experts).")
    params_per_gpu: int | None = Field(None, description="Parameters held per GPU before ZeRO/FSDP sharding.")
    trainable_params: int | None = Field(None, description="LoRA/QLoRA: adapter parameters of the whole model.")
    model_state_bytes_per_param: float | None = Field(None, description="Unsharded training bytes per parameter.")
    kv_cache_bytes_per_token: float | None = Field(None, description="KV cache bytes per token per GPU.")
    kv_cache_tokens: int | None = Field(None, description="Paged KV: tokens the KV cache holds per GPU (vLLM's "
                                        "'GPU KV cache size').")
    max_concurrency: float | None = Field(None, description="Paged KV: sequences of seq_len tokens that fit at once.")
    world_size: int | None = Field(None, description="tp x pp x dp x cp GPUs.")
    accelerator: str | None = Field(None, description="Accelerator the fit was checked against.")
    capacity_gib: float | None = Field(None, description="Memory the fit was checked against (GiB).")
    fits: bool | None = Field(None, description="Total <= capacity (None without an accelerator or when not modelled).")
    max_micro_batch: int | None = Field(None, description="Largest micro batch (inference: sequences) that fits.")
    changes_to_fit: list[str] = Field(default_factory=list, description="Changes (single, else pairs) that make "
                                      "it fit, least disruptive first, each with its new total.")
    not_modelled: list[str] = Field(default_factory=list, description="Why no number is given, when it is not.")


def run(params: MemoryParams, progress: Progress) -> MemoryResult:
    s = setup_from(params)
    reasons = unmodelled(s)
    try:
        stage, parts = (None, {}) if reasons else mm.breakdown(s)
    except ma.NotModelled as e:
        reasons, stage, parts = [str(e)], None, {}
    res = MemoryResult(params_total=s.total_params, params_active=params.active_params(), world_size=s.world_size)
    if reasons:
        res.not_modelled = reasons
        res.verdict = "info"
        res.findings = [f"Not modelled: {r}. No estimate is given rather than a wrong one." for r in reasons]
        res.next = ["knowledge://training/memory-math.md"]
        return res
    if params.mode == "inference" and params.gpu_memory_utilization is not None:
        return paged.run_paged(params, s, res)
    report.fill(params, s, stage, parts, res)
    fit.judge(params, s, sum(parts.values()), res)
    assumed = assumed_defaults(params)
    if assumed:
        res.findings.append(f"Assumed (not given): {assumed}; give them if the run differs.")
    return res


# The inputs that move the estimate most and that a question often leaves out: say when a default stood in.
ASSUMED_IF_MISSING = {"train": ("seq_len", "micro_batch", "activation_checkpointing"),
                      "inference": ("seq_len", "micro_batch")}


def assumed_defaults(params: MemoryParams) -> str:
    """'seq_len 4096, micro_batch 1, ...' for the defaults the caller did not give, or ''."""
    missing = [f for f in ASSUMED_IF_MISSING[params.mode] if f not in params.model_fields_set]
    return ", ".join(f"{f} {getattr(params, f)}" for f in missing)


SPEC = ToolSpec(
    name="memory_estimate",
    summary="Per-GPU memory for training or inference of a transformer: breakdown, fit, largest batch.",
    description=(
        "Use before a run or after a CUDA OOM to ask 'will it fit', 'how many GPUs do I need': per-GPU memory "
        "for training or serving a transformer from a preset (llama-3-70b, mixtral-8x7b, deepseek-v3...), an "
        "architecture (dense or mixture-of-experts: total vs active parameters per token) or a parameter "
        "count, with precision, optimizer, ZeRO/FSDP, offload, TP/PP/DP/CP/EP, checkpointing, "
        "LoRA/QLoRA; inference adds the KV cache per concurrent user (vLLM paged KV with gpu_memory_utilization). "
        "Returns the breakdown, what max_memory_reserved would show, whether it fits the GPU, the largest "
        "micro batch and changes that fit, and the defaults it assumed. Instant arithmetic."),
    Params=MemoryParams, Result=MemoryResult, run=run, runs="in_process", store=False,
)
