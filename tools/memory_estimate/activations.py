"""Activation, loss and KV-cache bytes for memory_estimate (no SPEC: not a tool). All sizes in bytes.

Per layer, Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
(arXiv 2205.05198, section 4): s*b*h*(34 + 5*a*s/h) bytes for GPT with dropout, generalised to
grouped-query attention, gated MLPs, mixture-of-experts MLPs, no dropout, flash attention and two
kernel styles (the GPT case reproduces their formula exactly; tested). Checkpointing modes:
  selective     Megatron's: recompute the attention scores (nothing more to save under flash attention)
  op_selective  torchtitan's per-op policy: keep the outputs of every other matmul and of attention,
                recompute the rest (torchtitan/models/llama3/parallelize_llama.py, _save_list)
  full          keep each layer's input, re-run one layer at a time
Kernel styles: fused (Megatron / Transformer Engine: the paper's accounting, sequence parallelism
re-gathers linear inputs in backward) and eager (PyTorch modules and DTensor tensor parallelism, which
keep the gathered linear inputs; eager norms keep fp32 copies unless the blocks are compiled).
"""

import math

KV_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
PREFILL_CHUNK_TOKENS = 8192  # tokens prefilled at once in inference mode (vLLM's max_num_batched_tokens)


def _fused_blocks(s) -> bool:
    return s.kernels == "fused" or s.compile != "none"


def _dtensor_tp(s) -> bool:
    """PyTorch tensor parallelism with sequence parallelism: the all-gathered input of each
    column-parallel linear is what autograd saves (Megatron saves its shard and re-gathers)."""
    return s.tp > 1 and s.sequence_parallel and s.kernels != "fused"


def norm_bytes(s) -> int:
    """Bytes a norm saves per element: its 16-bit input when fused or compiled; eager PyTorch RMSNorm
    upcasts and keeps two fp32 tensors (the input copy and the normalised product)."""
    return 2 if _fused_blocks(s) else 8


def _residual_bytes(s) -> int:
    """torch.autocast without FSDP keeps the residual stream in fp32 (fp32 weights); FSDP2 mixed
    precision and bf16 models keep it in 16 bits."""
    if s.precision == "fp32" or (s.precision in ("amp_bf16", "amp_fp8") and not s.sharding.startswith("fsdp")):
        return 4
    return 2


def _mlp_split_bytes(s, seq: float, b: int, moe: bool) -> float:
    """Saved MLP tensors that tensor parallelism splits: gate and up outputs and their product (eager
    autograd also keeps silu(gate)), or the activation's input and output without a gate. A MoE layer
    runs top_k experts per token plus the shared ones, and keeps its router probabilities and the
    permuted token copies going to and coming from the experts."""
    a = s.arch
    per_width = ((6 if _fused_blocks(s) else 8) if a.gated_mlp else 4) * seq * b
    if not moe:
        return per_width * a.ffn
    tokens_per_token = a.top_k + a.shared_experts
    routing = 8 * seq * b * a.experts + 2 * 2 * seq * b * a.top_k * a.hidden
    return per_width * a.moe_ffn * tokens_per_token + routing


def layer_activation_bytes(s, micro_batch: int, moe: bool = False) -> tuple[float, float]:
    """(saved activations of one layer with no recomputation beyond the mode's, its layer input alone)
    per micro batch on one GPU."""
    a = s.arch
    seq, b, h, t = s.seq_len / s.cp, micro_batch, a.hidden, s.tp
    sbh = seq * b * h
    if s.activation_checkpointing == "op_selective":
        return _op_selective_layer(s, seq, b, moe), _layer_input(s, seq, b)
    kv = 2 * seq * b * a.kv_dim
    split = 2 * seq * b * a.q_dim + 2 * kv + 2 * seq * b * a.heads * (a.v_head_dim or a.head_dim)  # q, k, v, attn out
    split += _mlp_split_bytes(s, seq, b, moe)
    flash = s.flash_attention   # setup_from turns it off for fp32 unless asked (no fp32 flash kernel on GPUs)
    keep_scores = not flash and s.activation_checkpointing == "none"
    if keep_scores:  # softmax output (2 bytes), + mask (1) and dropout output (2) with dropout
        split += (5 if s.dropout else 2) * a.heads * seq * seq * b
    elif flash:
        split += 4 * seq * b * a.heads  # fp32 log-sum-exp per row
    norms = 2 * norm_bytes(s) * sbh
    linear_inputs = 2 * sbh + 2 * sbh  # the qkv and mlp inputs (fp8 linears: their 8-bit casts)
    if s.precision == "amp_fp8":
        linear_inputs /= 2
    dropout = 2 * sbh if s.dropout else 0
    sp = s.sequence_parallel and t > 1
    scale = 2 if s.precision == "fp32" else 1  # activations in fp32 rather than 16-bit
    replicated = norms + dropout + (0 if _dtensor_tp(s) else linear_inputs)
    layer = split / t + (replicated / t if sp else replicated) + (linear_inputs if _dtensor_tp(s) else 0)
    return scale * layer, _layer_input(s, seq, b)


def _layer_input(s, seq: float, b: int) -> float:
    sp = s.sequence_parallel and s.tp > 1
    return _residual_bytes(s) * seq * b * s.arch.hidden / (s.tp if sp else 1)


def _op_selective_layer(s, seq: float, b: int, moe: bool) -> float:
    """torchtitan's per-op policy on a Llama block: the layer input, the outputs of matmuls 1, 3, 5, 7
    (wq, wv, w1, w2), the attention output and its log-sum-exp."""
    if moe:
        raise NotModelled("per-op selective checkpointing of a MoE layer (grouped expert matmuls are not in "
                          "torchtitan's save list; what it keeps depends on the model's MoE code)")
    a, t = s.arch, s.tp
    saved = 2 * seq * b * (a.q_dim + a.kv_dim + a.ffn + a.hidden + a.q_dim) + 4 * seq * b * a.heads
    return _layer_input(s, seq, b) + saved / t


class NotModelled(Exception):
    """A setup whose memory the estimator cannot give a number for; the message says what is missing."""


def backward_working_bytes(s, micro_batch: int, moe: bool) -> float:
    """Gradients alive inside one layer's backward: of the MLP's two widest tensors, of the (gathered)
    layer input, and the layer's 16-bit MLP weight gradients before they are reduced or accumulated."""
    a = s.arch
    seq, b, t = s.seq_len / s.cp, micro_batch, s.tp
    width = (a.top_k + a.shared_experts) * a.moe_ffn if moe else a.ffn
    weights = (a.experts / s.ep + a.shared_experts) * a.moe_ffn if moe else a.ffn
    gathered = 2 * seq * b * a.hidden / (1 if _dtensor_tp(s) else t)
    return 2 * 2 * seq * b * width / t + gathered + a.mlp_matrices() * a.hidden * weights * 2 / t


def loss_bytes_per_logit(s) -> tuple[float, float]:
    """(bytes per logit saved for the loss, bytes per logit more alive as its backward runs).
    compiled (torch.compile of the loss): keeps the 16-bit logits, writes a 16-bit gradient.
    fused (Megatron's vocab-parallel cross-entropy, Liger): fp32 softmax saved (Korthikanti's 4sbv),
    the gradient written into it. DTensor loss_parallel (tp > 1): fp32 log-probabilities saved, then
    zeros, exp and their sum (3 x 4 B) and the 16-bit logits. Eager F.cross_entropy(logits.float()):
    fp32 log-probabilities saved, two fp32 gradients (4 + 4) and the 16-bit logits the loop holds (2)."""
    logit = 4 if s.precision == "fp32" else 2
    if s.compile == "full":
        return logit, logit
    if s.kernels == "fused":
        return 4, 0
    if s.tp > 1 and s.loss_parallel:
        return 4, 12 + logit
    return 4, 8 + logit


def training_activation_parts(s, st, micro_batch: int) -> dict[str, float]:
    """activations (saved), logits (saved for the loss), loss_backward and backward_working. Backward
    peaks in one of two phases: at the loss (saved activations + logits + the loss's extra), or inside a
    layer's backward once the loss tensors are freed (saved activations + that layer's working set and,
    with full recomputation, the layer rebuilt). backward_working is what the second adds beyond the
    first, so that the categories sum to the larger."""
    a = s.arch
    if a is None:
        return {}
    layers = range(st.first_layer, st.first_layer + st.layers)
    per_layer = {moe: layer_activation_bytes(s, micro_batch, moe) for moe in {a.is_moe_layer(i) for i in layers}}
    rebuilt = 0.0
    if s.activation_checkpointing == "full":
        held = sum(per_layer[a.is_moe_layer(i)][1] for i in layers) * st.inflight_microbatches
        rebuilt = max((v[0] for v in per_layer.values()), default=0) + _context_parallel_bytes(s, micro_batch)
    else:
        held = sum(per_layer[a.is_moe_layer(i)][0] for i in layers) * st.inflight_microbatches
    in_layer = rebuilt + max((backward_working_bytes(s, micro_batch, moe) for moe in per_layer), default=0.0)
    logits = extra = 0.0
    if st.head:
        seq = s.seq_len / s.cp
        sp = s.sequence_parallel and s.tp > 1
        held += (norm_bytes(s) + 2) * seq * micro_batch * a.hidden / (s.tp if sp else 1)  # final norm + head input
        logits, extra = (seq * micro_batch * a.vocab / s.tp * x for x in loss_bytes_per_logit(s))
    return {"activations": held, "logits": logits, "loss_backward": extra,
            "backward_working": max(in_layer - logits - extra, 0.0)}


def _context_parallel_bytes(s, micro_batch: int) -> float:
    """Ring / all-gather context parallelism, in the layer being recomputed: K and V gathered over the
    whole sequence and their fp32 gradient accumulators."""
    if s.cp == 1:
        return 0.0
    kv = 2 * s.seq_len * micro_batch * s.arch.kv_dim / s.tp
    return kv * (2 + 4)


def kv_cache_bytes_per_token(s) -> float:
    """KV cache per token (all layers of the most loaded stage) on one GPU."""
    a = s.arch
    layers_here = math.ceil(a.layers / s.pp)
    return layers_here * a.kv_elements_per_token_layer(s.tp) * KV_BYTES[s.kv_dtype]


def inference_activation_bytes(s, micro_batch: int, chunk_tokens: int = PREFILL_CHUNK_TOKENS) -> float:
    """Working set of one layer during prefill, plus fp32 logits of each sequence's last token.
    Serving engines prefill in chunks (vLLM's max_num_batched_tokens)."""
    a = s.arch
    tokens = min(micro_batch * s.seq_len, chunk_tokens)
    width = (a.top_k + a.shared_experts) * a.moe_ffn if a.moe else a.ffn
    mlp = (3 if a.gated_mlp else 2) * width / s.tp
    return 2 * tokens * (4 * a.hidden + mlp) + 4 * micro_batch * a.vocab / s.tp
