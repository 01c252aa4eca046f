"""Per-GPU memory arithmetic for memory_estimate: model states, pipeline stages, the breakdown (no SPEC).

All sizes in bytes. Model states follow the ZeRO paper's accounting (arXiv 1910.02054, section 3.1):
half-precision weights and gradients plus fp32 master weights and two Adam moments, 16 bytes per
parameter, 18 with Megatron-LM's fp32 gradient buffer; DeepSpeed's ZeRO-1/2 keep a 16-bit gradient
and an fp32 gradient partition (deepspeed/runtime/zero/stage_1_and_2.py, 2P + 18P/N). PyTorch AMP
and FSDP2 mixed precision keep fp32 parameters (16 B/param with Adam) and compute on 16-bit copies.
Activations and the loss: activations.py. Published figures they were checked against:
docs/memory_estimate_validation.md and knowledge/data/memory_validation.toml.
"""

import dataclasses
import math

from .activations import inference_activation_bytes, kv_cache_bytes_per_token, training_activation_parts
from .setup import Setup
from ..shared.transformer_math import Architecture

GIB = 2**30

INFERENCE_WEIGHT_BYTES = {"fp32": 4, "bf16_mixed": 2, "fp16_mixed": 2, "fp8": 1, "amp_bf16": 2, "amp_fp8": 1}
OPTIMIZER_BYTES = {"adamw": 8.0, "adam": 8.0, "adam_8bit": 2.0, "sgd_momentum": 4.0}
AMP = ("amp_bf16", "amp_fp8")
QLORA_BYTES = 0.5 + 0.127 / 8  # NF4 + double-quantised block constants (QLoRA, arXiv 2305.14314, section 3)
CUDA_CONTEXT_BYTES = 0.5 * GIB     # CUDA context + cuBLAS/cuDNN workspaces, lazy module loading on
NCCL_FIRST_GROUP_BYTES = 1.0 * GIB  # buffers of the first communicator (figures.md: ~1-1.5 GiB)
NCCL_EXTRA_GROUP_BYTES = 0.25 * GIB  # each further parallel dimension (TP, PP, CP, EP) adds communicators
FRAGMENTATION = 0.05                # caching-allocator slack on top of the tensors
OFFLOAD_BUFFER = 1.5                # DeepSpeed's additional_buffer_factor for host RAM (memory.rst)


def model_state_bytes_per_param(s: Setup) -> dict[str, float]:
    """Unsharded bytes per trainable parameter for weights, gradients, master weights, optimizer states."""
    if s.optimizer == "adafactor":  # factored second moment: rows + columns per matrix, no momentum
        optim = 8.0 / (s.arch.hidden if s.arch else 4096)
    else:
        optim = OPTIMIZER_BYTES[s.optimizer]
    if s.precision == "fp32" or s.precision in AMP:  # fp32 parameters are the master copy
        return {"weights": 4, "gradients": 4, "master_weights": 0, "optimizer_states": optim}
    if s.finetune != "full":  # adapters in the 16-bit compute dtype, no master copy (QLoRA's qlora.py)
        return {"weights": 2, "gradients": 2, "master_weights": 0, "optimizer_states": optim}
    weights = 2 + (1 if s.precision == "fp8" else 0)  # Transformer Engine caches an fp8 copy
    return {"weights": weights, "gradients": 4 if s.fp32_grads else 2, "master_weights": 4,
            "optimizer_states": optim}


@dataclasses.dataclass
class Stage:
    """One pipeline stage as seen by one of its GPUs."""

    label: str
    first_layer: int
    layers: int
    embedding: bool
    head: bool
    inflight_microbatches: int


def stages(s: Setup) -> list[Stage]:
    layers = s.arch.layers if s.arch else 0
    per_stage = math.ceil(layers / s.pp)
    if s.pp == 1:
        return [Stage("only", 0, per_stage, True, True, 1)]
    last_layers = max(layers - (s.pp - 1) * per_stage, 0)
    microbatches = s.pp_microbatches or s.pp
    # 1F1B: the first stage holds min(pp, micro batches) in flight, the last one; GPipe holds them all.
    first_inflight = microbatches if s.pipeline_schedule == "gpipe" else min(s.pp, microbatches)
    last_inflight = microbatches if s.pipeline_schedule == "gpipe" else 1
    return [Stage("first", 0, per_stage, True, False, first_inflight),
            Stage("last", layers - last_layers, last_layers, False, True, last_inflight)]


def stage_params(s: Setup, st: Stage) -> tuple[float, float, float]:
    """(dense, expert, root) parameters one GPU of this stage holds, after TP/PP/EP splits. Root: the
    embedding, final norm and output head, which FSDP2 keeps in its root module."""
    a = s.arch
    if a is None:
        return s.total_params / (s.tp * s.pp), 0.0, 0.0
    dense = expert = 0.0
    for i in range(st.first_layer, st.first_layer + st.layers):
        moe = a.is_moe_layer(i)
        routed = a.experts * a.expert_params() if moe else 0
        dense += a.layer_params(moe) - routed
        expert += routed
    root = a.embedding_params() if st.embedding else 0
    if st.head:
        root += a.final_norm_params() + (a.head_params() if s.pp == 1 else a.vocab * a.hidden)
    return dense / s.tp, expert / (s.tp * s.ep), root / s.tp


def _frozen_and_trainable(s: Setup, st: Stage) -> tuple[float, float, float]:
    """(frozen weight bytes, trainable parameters, trainable expert parameters) of one GPU's stage."""
    dense, expert, root = stage_params(s, st)
    if s.finetune == "full":
        return 0.0, dense + root, expert
    a = s.arch
    matrices = dense + expert  # LoRA adapts every linear layer (QLoRA's recipe): r x (in + out) each
    adapters = sum(adapter_params(a, a.is_moe_layer(i), s.lora_rank)
                   for i in range(st.first_layer, st.first_layer + st.layers)) / s.tp
    base = QLORA_BYTES if s.finetune == "qlora" else INFERENCE_WEIGHT_BYTES[s.precision]
    return matrices * base + root * 2, adapters, 0.0


def adapter_params(a: Architecture, moe: bool, r: int) -> float:
    h = a.hidden
    attention = 2 * r * (h + a.heads * a.head_dim) + 2 * r * (h + a.kv_dim)  # q and o, k and v
    width, count = (a.moe_ffn, a.experts + a.shared_experts) if moe else (a.ffn, 1)
    return attention + count * a.mlp_matrices() * r * (h + width)


def model_states(s: Setup, st: Stage) -> dict[str, float]:
    """Weights, gradients, master weights, optimizer states and gathered/unsharded parameters."""
    per = model_state_bytes_per_param(s)
    frozen, trainable, expert = _frozen_and_trainable(s, st)
    stage_ = s.zero_stage()
    shard = lambda n, sharded: n / s.shard_degree() if sharded else n  # noqa: E731
    eshard = lambda n, sharded: n / s.shard_degree(expert=True) if sharded else n  # noqa: E731
    both = lambda k, at: shard(trainable * per[k], stage_ >= at) + eshard(expert * per[k], stage_ >= at)  # noqa: E731
    out = {"weights": both("weights", 3) + (frozen / s.shard_degree() if stage_ >= 3 else frozen),
           "gradients": both("gradients", 2), "master_weights": both("master_weights", 1),
           "optimizer_states": both("optimizer_states", 1)}
    if 1 <= stage_ <= 2 and s.precision not in AMP and s.precision != "fp32" and s.fp32_grads:
        # DeepSpeed ZeRO-1/2: the 16-bit gradients (partitioned at stage 2) and an fp32 partition for the step
        sixteen = 2 * (trainable + expert)
        fp32_partition = 4 * (trainable + expert) / s.shard_degree()
        out["gradients"] = (sixteen / s.shard_degree() if stage_ == 2 else sixteen) + fp32_partition
    _offload(s, out)
    out["gathered_params"] = gathered_params(s, st) if stage_ >= 3 and s.shard_degree() > 1 else 0.0
    return out


def _offload(s: Setup, out: dict[str, float]) -> None:
    """ZeRO-Offload / FSDP CPUOffload: optimizer states, master weights and gradients live on the host
    (DeepSpeed streams the 16-bit gradients there); with optimizer_and_params the sharded weights too."""
    if s.offload == "none":
        return
    moved = ("master_weights", "optimizer_states", "gradients")
    for k in moved + (("weights",) if s.offload == "optimizer_and_params" else ()):
        out[k] = 0.0


def offloaded_bytes_per_gpu(s: Setup, st: Stage) -> float:
    """What one GPU's offload puts on the host (or NVMe): its master and optimizer partition, an fp32
    gradient partition, and with optimizer_and_params its 16-bit weight partition."""
    if s.offload == "none":
        return 0.0
    kept = model_states(dataclasses.replace(s, offload="none"), st)
    _, trainable, expert = _frozen_and_trainable(s, st)
    moved = kept["master_weights"] + kept["optimizer_states"] + 4 * (trainable + expert) / s.shard_degree()
    return moved + (kept["weights"] if s.offload == "optimizer_and_params" else 0.0)


def host_ram_per_node(s: Setup) -> float:
    """Host RAM per node: the offloaded states of its GPUs and, without ZeRO-3's zero.Init, every rank
    loading the whole model in fp32 first (DeepSpeed memory.rst: 4 x n_gpus x params), times
    DeepSpeed's 1.5 buffer factor for pinned staging buffers."""
    per_node = min(s.gpus_per_node, s.world_size)
    states = offloaded_bytes_per_gpu(s, stages(s)[0]) * per_node if s.offload_device == "cpu" else 0.0
    load = 4 * s.total_params * per_node if s.zero_stage() < 3 else 0.0
    return max(states, load) * OFFLOAD_BUFFER


def nvme_bytes_per_node(s: Setup) -> float:
    if s.offload == "none" or s.offload_device != "nvme":
        return 0.0
    return offloaded_bytes_per_gpu(s, stages(s)[0]) * min(s.gpus_per_node, s.world_size)


def compute_weight_bytes(s: Setup) -> tuple[float, float]:
    """(bytes per matmul weight, per other weight) of the copies the forward computes with."""
    if s.precision == "fp32":
        return 4, 4
    if s.finetune == "qlora":
        return QLORA_BYTES, 2
    return (1 if s.precision == "amp_fp8" else 2), 2


def gathered_params(s: Setup, st: Stage) -> float:
    """ZeRO-3/FSDP unsharded parameters in flight. Resharding after forward: the current and the
    prefetched layer and one layer's gradients, plus (FSDP2) the root module's embedding and head,
    which stay unsharded from forward to backward. Without resharding (PP): the whole stage, and its
    gradients accumulated unsharded in fp32 across micro batches (FSDP2 with requires_gradient_sync off)."""
    if s.arch is None:
        return 0.0
    dense, expert, root = stage_params(s, st)
    matmul_b, other_b = compute_weight_bytes(s)
    root_bytes = root * other_b if s.fsdp else 0.0
    if s.keeps_unsharded():
        grads = 4 if (s.pp_microbatches or s.pp) > 1 else 2
        trainable = dense + expert + root if s.finetune == "full" else 0.0
        return (dense + expert) * matmul_b + root * other_b + trainable * grads
    layer = (dense + expert) / max(st.layers, 1)
    grads = 2 if s.finetune == "full" else 0
    return layer * (2 * matmul_b + grads) + root_bytes


def breakdown(s: Setup, micro_batch: int | None = None) -> tuple[str, dict[str, float]]:
    """Bytes per GPU by category for the most loaded pipeline stage: (stage label, categories)."""
    mb = s.micro_batch if micro_batch is None else micro_batch
    best: tuple[str, dict[str, float]] | None = None
    for st in stages(s):
        parts = _stage_breakdown(s, st, mb)
        if best is None or sum(parts.values()) > sum(best[1].values()):
            best = (st.label, parts)
    return best


CATEGORIES = ("weights", "gradients", "master_weights", "optimizer_states", "gathered_params", "weight_copies",
              "activations", "logits", "loss_backward", "backward_working", "kv_cache")


def _stage_breakdown(s: Setup, st: Stage, mb: int) -> dict[str, float]:
    parts = dict.fromkeys(CATEGORIES, 0.0)
    if s.mode == "inference":
        dense, expert, root = stage_params(s, st)
        parts["weights"] = (dense + expert + root) * INFERENCE_WEIGHT_BYTES[s.precision]
        if s.arch is not None:
            parts["kv_cache"] = kv_cache_bytes_per_token(s) * s.seq_len * mb
            parts["activations"] = inference_activation_bytes(s, mb)
    else:
        parts.update(model_states(s, st))
        parts["weight_copies"] = weight_copy_bytes(s, st)
        parts.update(training_activation_parts(s, st, mb))
    tensors = sum(parts.values())
    parts["framework_overhead"] = CUDA_CONTEXT_BYTES + FRAGMENTATION * tensors
    extra_dims = sum(d > 1 for d in (s.tp, s.pp, s.cp, s.ep))
    parts["nccl_buffers"] = (NCCL_FIRST_GROUP_BYTES + NCCL_EXTRA_GROUP_BYTES * max(extra_dims - 1, 0)
                             if s.world_size > 1 else 0.0)
    return parts


def weight_copy_bytes(s: Setup, st: Stage) -> float:
    """torch.autocast without FSDP caches a 16-bit (torchao fp8: an 8-bit) copy of every matmul weight
    for the step, which backward keeps; FSDP2 mixed precision gathers those copies instead."""
    if s.precision not in AMP or s.fsdp or s.finetune != "full" or s.arch is None:
        return 0.0
    dense, expert, _ = stage_params(s, st)
    return (dense + expert) * compute_weight_bytes(s)[0]


def total_bytes(s: Setup, micro_batch: int | None = None) -> float:
    return sum(breakdown(s, micro_batch)[1].values())


def max_micro_batch(s: Setup, capacity_bytes: float, limit: int = 1 << 20) -> int:
    """Largest micro batch whose total fits in capacity (0 when even one sequence does not)."""
    if total_bytes(s, 1) > capacity_bytes:
        return 0
    if total_bytes(s, limit) <= capacity_bytes:
        return limit
    lo, hi = 1, limit  # total grows with the micro batch: bisect
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if total_bytes(s, mid) <= capacity_bytes else (lo, mid)
    return lo
