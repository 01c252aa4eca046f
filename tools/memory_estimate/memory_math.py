"""Per-GPU memory arithmetic for memory_estimate (no SPEC: not a tool). All sizes in bytes.

Model states follow the ZeRO paper's accounting (arXiv 1910.02054, section 3.1): half-precision
weights and gradients plus fp32 master weights and two Adam moments, 16 bytes per parameter, or 18
with Megatron-LM's fp32 gradient buffer. Activations follow Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models" (arXiv 2205.05198, section 4): per layer
s*b*h*(34 + 5*a*s/h) bytes for GPT with dropout, generalised here to grouped-query attention,
gated MLPs, no dropout and flash attention; the GPT case reproduces their formula exactly (tested).
"""

import dataclasses
import math

from ..shared.transformer_math import Architecture

GIB = 2**30

WEIGHT_BYTES = {"fp32": 4, "bf16_mixed": 2, "fp16_mixed": 2, "fp8": 2}
INFERENCE_WEIGHT_BYTES = {"fp32": 4, "bf16_mixed": 2, "fp16_mixed": 2, "fp8": 1}
KV_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
# Optimizer state bytes per parameter (fp32 unless the optimizer says otherwise).
OPTIMIZER_BYTES = {"adamw": 8.0, "adam": 8.0, "adam_8bit": 2.0, "sgd_momentum": 4.0}
CUDA_CONTEXT_BYTES = 0.5 * GIB     # CUDA context + cuBLAS/cuDNN workspaces, lazy module loading on
NCCL_FIRST_GROUP_BYTES = 1.0 * GIB  # buffers of the first communicator (figures.md: ~1-1.5 GiB)
NCCL_EXTRA_GROUP_BYTES = 0.25 * GIB  # each further parallel dimension (TP, PP, CP) adds communicators
PREFILL_CHUNK_TOKENS = 8192       # tokens prefilled at once in inference mode
FRAGMENTATION = 0.05                # caching-allocator slack on top of the tensors


@dataclasses.dataclass
class Setup:
    """Everything the arithmetic needs, already validated (see memory_estimate.MemoryParams)."""

    arch: Architecture | None
    total_params: int
    mode: str = "train"
    precision: str = "bf16_mixed"
    optimizer: str = "adamw"
    fp32_grads: bool = True
    sharding: str = "none"
    shard_group_size: int = 8
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    seq_len: int = 4096
    micro_batch: int = 1
    activation_checkpointing: str = "none"
    flash_attention: bool = True
    kernels: str = "fused"
    sequence_parallel: bool = True
    dropout: bool = False
    kv_dtype: str = "bf16"

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def shard_degree(self) -> int:
        """GPUs that share one copy of the sharded model states (ZeRO/FSDP runs over DP x CP)."""
        if self.sharding == "none":
            return 1
        group = self.dp * self.cp
        return min(self.shard_group_size, group) if self.sharding == "fsdp_hybrid_shard" else group

    def zero_stage(self) -> int:
        return {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp_full_shard": 3,
                "fsdp_hybrid_shard": 3}[self.sharding]


def model_state_bytes_per_param(s: Setup) -> dict[str, float]:
    """Unsharded bytes per parameter for weights, gradients, master weights and optimizer states."""
    mixed = s.precision != "fp32"
    weights = WEIGHT_BYTES[s.precision] + (1 if s.precision == "fp8" else 0)  # + cached fp8 copy
    grads = 4 if (not mixed or s.fp32_grads) else 2
    if s.optimizer == "adafactor":  # factored second moment: rows + columns per matrix, no momentum
        optim = 8.0 / (s.arch.hidden if s.arch else 4096)
    else:
        optim = OPTIMIZER_BYTES[s.optimizer]
    return {"weights": weights, "gradients": grads, "master_weights": 4 if mixed else 0,
            "optimizer_states": optim}


@dataclasses.dataclass
class Stage:
    """One pipeline stage as seen by one of its GPUs."""

    label: str
    layers: int
    embedding: bool
    head: bool
    inflight_microbatches: int


def stages(s: Setup) -> list[Stage]:
    layers = s.arch.layers if s.arch else 0
    per_stage = math.ceil(layers / s.pp)
    if s.pp == 1:
        return [Stage("only", per_stage, True, True, 1)]
    last_layers = max(layers - (s.pp - 1) * per_stage, 0)
    # 1F1B: the first stage holds pp micro batches in flight, the last holds one.
    return [Stage("first", per_stage, True, False, s.pp), Stage("last", last_layers, False, True, 1)]


def stage_params(s: Setup, st: Stage) -> float:
    """Parameters held by one GPU of this stage, after tensor and pipeline parallel splits."""
    a = s.arch
    if a is None:
        return s.total_params / (s.tp * s.pp)
    held = st.layers * a.layer_params()
    if st.embedding:
        held += a.embedding_params()
    if st.head:
        held += a.final_norm_params()
        held += a.head_params() if s.pp == 1 else a.vocab * a.hidden  # a tied head is a copy on the last stage
    return held / s.tp


def layer_activation_bytes(s: Setup, micro_batch: int) -> tuple[float, float]:
    """(saved activations of one layer, its layer input alone) per micro batch on one GPU."""
    a = s.arch
    seq, b, h, t = s.seq_len / s.cp, micro_batch, a.hidden, s.tp
    sbh = seq * b * h
    kv = 2 * seq * b * a.kv_dim
    eager = s.kernels == "eager"
    split = 2 * sbh + 2 * kv + 2 * sbh  # q, k and v, the attention output (o-proj input)
    # Gated: gate and up outputs + their product (eager autograd also keeps silu(gate)); else act in/out.
    split += ((8 if eager else 6) if a.gated_mlp else 4) * seq * b * a.ffn
    keep_scores = not s.flash_attention and s.activation_checkpointing == "none"
    if keep_scores:  # softmax output (2 bytes), + mask (1) and dropout output (2) with dropout
        split += (5 if s.dropout else 2) * a.heads * seq * seq * b
    elif s.flash_attention:
        split += 4 * seq * b * a.heads  # fp32 log-sum-exp per row
    # 2 norms, the qkv and mlp inputs, and the two dropout masks (1 byte each) when dropout is on
    replicated = 2 * norm_bytes(s) * sbh + 2 * sbh + 2 * sbh + (2 * sbh if s.dropout else 0)
    sp = s.sequence_parallel and t > 1
    scale = 2 if s.precision == "fp32" else 1  # activations in fp32 rather than 16-bit
    layer = scale * (split / t + (replicated / t if sp else replicated))
    layer_input = scale * 2 * sbh / (t if sp else 1)
    return layer, layer_input


def norm_bytes(s: Setup) -> int:
    """Bytes a norm saves per element: its bf16 input when fused; eager PyTorch RMSNorm upcasts and
    keeps two fp32 tensors (the input copy and the normalised product)."""
    return 8 if s.kernels == "eager" else 2


def activation_bytes(s: Setup, st: Stage, micro_batch: int) -> tuple[float, float]:
    """(activations, logits) held by one GPU of this stage at the peak of the backward pass."""
    a = s.arch
    if a is None or s.mode != "train":
        return 0.0, 0.0
    layer, layer_input = layer_activation_bytes(s, micro_batch)
    if s.activation_checkpointing == "full":
        # Only each layer's input is kept; one layer is recomputed in full at a time.
        held = st.layers * layer_input * st.inflight_microbatches + layer
    else:
        held = st.layers * layer * st.inflight_microbatches
    logits = 0.0
    if st.head:
        seq = s.seq_len / s.cp
        # final norm + output-head input
        held += (norm_bytes(s) + 2) * seq * micro_batch * a.hidden / (s.tp if s.sequence_parallel and s.tp > 1 else 1)
        logits = 4 * seq * micro_batch * a.vocab / s.tp  # fp32 logits for the loss (Korthikanti's 4sbv)
    return held, logits


def loss_backward_bytes(s: Setup, st: Stage, micro_batch: int) -> float:
    """Logit-sized tensors alive, besides the saved ones, when backward starts (the step's peak).

    Eager PyTorch / Hugging Face (F.cross_entropy on logits.float()): the gradient of the loss with
    respect to the log-probabilities and with respect to the fp32 logits (4 + 4 bytes per logit), while
    the training loop still holds the 16-bit logits the model returned (2 bytes). Measured on CPU: the
    largest live set of a step is there, at log_softmax's backward. Fused losses (Megatron's
    vocab-parallel cross-entropy, Liger) write the gradient into the saved softmax: nothing extra."""
    a = s.arch
    if a is None or s.mode != "train" or not st.head or s.kernels != "eager":
        return 0.0
    return 10 * (s.seq_len / s.cp) * micro_batch * a.vocab / s.tp


def kv_cache_bytes_per_token(s: Setup) -> float:
    """KV cache per token (all layers) on one GPU: K and V for each KV head this GPU holds."""
    a = s.arch
    kv_heads_here = a.kv_heads / s.tp if a.kv_heads >= s.tp else 1  # fewer KV heads than TP: replicated
    layers_here = math.ceil(a.layers / s.pp)
    return 2 * layers_here * kv_heads_here * a.head_dim * KV_BYTES[s.kv_dtype]


def inference_activation_bytes(s: Setup, micro_batch: int) -> float:
    """Working set of one layer during prefill, plus fp32 logits of each sequence's last token.
    Serving engines prefill in chunks (vLLM's max_num_batched_tokens); PREFILL_CHUNK_TOKENS is assumed."""
    a = s.arch
    tokens = min(micro_batch * s.seq_len, PREFILL_CHUNK_TOKENS)
    mlp = (3 if a.gated_mlp else 2) * a.ffn / s.tp
    return 2 * tokens * (4 * a.hidden + mlp) + 4 * micro_batch * a.vocab / s.tp


def breakdown(s: Setup, micro_batch: int | None = None) -> tuple[str, dict[str, float]]:
    """Bytes per GPU by category for the most loaded pipeline stage: (stage label, categories)."""
    mb = s.micro_batch if micro_batch is None else micro_batch
    best: tuple[str, dict[str, float]] | None = None
    for st in stages(s):
        parts = _stage_breakdown(s, st, mb)
        if best is None or sum(parts.values()) > sum(best[1].values()):
            best = (st.label, parts)
    return best


def _stage_breakdown(s: Setup, st: Stage, mb: int) -> dict[str, float]:
    n = stage_params(s, st)
    parts = dict.fromkeys(("weights", "gradients", "master_weights", "optimizer_states", "gathered_params",
                           "activations", "logits", "loss_backward", "kv_cache"), 0.0)
    if s.mode == "inference":
        parts["weights"] = n * INFERENCE_WEIGHT_BYTES[s.precision]
        if s.arch is not None:
            parts["kv_cache"] = kv_cache_bytes_per_token(s) * s.seq_len * mb
            parts["activations"] = inference_activation_bytes(s, mb)
    else:
        per_param = model_state_bytes_per_param(s)
        shard, stage = s.shard_degree(), s.zero_stage()
        parts["weights"] = n * per_param["weights"] / (shard if stage >= 3 else 1)
        parts["gradients"] = n * per_param["gradients"] / (shard if stage >= 2 else 1)
        parts["master_weights"] = n * per_param["master_weights"] / (shard if stage >= 1 else 1)
        parts["optimizer_states"] = n * per_param["optimizer_states"] / (shard if stage >= 1 else 1)
        if stage >= 3 and shard > 1 and s.arch is not None:
            # Unsharded copies in flight: the current and the prefetched layer, and one layer's grads.
            layer = s.arch.layer_params() / s.tp
            parts["gathered_params"] = layer * (2 * per_param["weights"] + per_param["gradients"])
        parts["activations"], parts["logits"] = activation_bytes(s, st, mb)
        parts["loss_backward"] = loss_backward_bytes(s, st, mb)
    tensors = sum(parts.values())
    parts["framework_overhead"] = CUDA_CONTEXT_BYTES + FRAGMENTATION * tensors
    extra_dims = sum(d > 1 for d in (s.tp, s.pp, s.cp))
    parts["nccl_buffers"] = (NCCL_FIRST_GROUP_BYTES + NCCL_EXTRA_GROUP_BYTES * max(extra_dims - 1, 0)
                             if s.world_size > 1 else 0.0)
    return parts


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
