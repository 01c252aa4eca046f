"""memory_estimate for serving with a paged KV cache, the way vLLM sizes it (no SPEC: not a tool).

vLLM takes gpu_memory_utilization x the GPU's memory, subtracts the weights, the activation peak of a
profiling forward pass of max_num_batched_tokens tokens and the memory outside torch (CUDA context,
NCCL, CUDA graphs), and gives the rest to KV blocks of 16 tokens; it logs that as "GPU KV cache size:
N tokens" and "Maximum concurrency for max_model_len tokens per request: Nx", and refuses to start
when one max_model_len request does not fit (vllm/v1/core/kv_cache_utils.py; PR 13596 and 12569).
"""

from .activations import inference_activation_bytes, kv_cache_bytes_per_token
from .memory_math import CUDA_CONTEXT_BYTES, INFERENCE_WEIGHT_BYTES, NCCL_FIRST_GROUP_BYTES, stage_params, stages
from .setup import Setup
from ..shared.planning import GIB, capacity_gib, find_accelerator, gib
from ..engine.spec import ToolFailure

BLOCK_TOKENS = 16  # vLLM's default block_size on CUDA


def run_paged(params, s: Setup, res):
    cap_gib, name = _capacity(params)
    st = stages(s)[0]
    dense, expert, root = stage_params(s, st)
    weights = (dense + expert + root) * INFERENCE_WEIGHT_BYTES[s.precision]
    acts = inference_activation_bytes(s, min(params.max_num_seqs or 1, params.max_num_batched_tokens),
                                         params.max_num_batched_tokens) if s.arch else 0.0
    outside = CUDA_CONTEXT_BYTES + (NCCL_FIRST_GROUP_BYTES if s.world_size > 1 else 0.0)
    budget = params.gpu_memory_utilization * cap_gib * GIB
    kv_memory = budget - weights - acts - outside
    per_token = kv_cache_bytes_per_token(s)
    res.accelerator, res.capacity_gib = name, round(cap_gib, 2)
    res.weights_gib, res.activations_gib, res.kv_cache_bytes_per_token = gib(weights), gib(acts), per_token
    res.framework_overhead_gib = gib(outside)
    if kv_memory <= 0:
        res.fits, res.verdict, res.kv_cache_tokens, res.max_concurrency = False, "fail", 0, 0.0
        res.findings.append(f"Does not start: weights {weights / GIB:.1f} GiB + activations {acts / GIB:.1f} GiB + "
                            f"{outside / GIB:.1f} GiB outside torch exceed gpu_memory_utilization "
                            f"{params.gpu_memory_utilization:g} x {cap_gib:.1f} GiB = {budget / GIB:.1f} GiB.")
        return res
    blocks = int(kv_memory // (per_token * BLOCK_TOKENS))
    res.kv_cache_tokens = blocks * BLOCK_TOKENS
    res.kv_cache_gib = gib(res.kv_cache_tokens * per_token)
    res.max_concurrency = round(res.kv_cache_tokens / s.seq_len, 2)
    res.total_gib = gib(budget)
    res.fits = res.kv_cache_tokens >= s.seq_len
    res.verdict = "ok" if res.fits else "fail"
    res.findings.append(f"GPU KV cache size: {res.kv_cache_tokens:,} tokens ({kv_memory / GIB:.2f} GiB at "
                        f"{per_token / 1024:.0f} KiB per token per GPU, {params.kv_dtype}); maximum concurrency for "
                        f"{s.seq_len:,} tokens per request: {res.max_concurrency:.2f}x.")
    if not res.fits:
        res.findings.insert(0, f"Does not start: max_model_len {s.seq_len:,} is more than the {res.kv_cache_tokens:,} "
                            "tokens the KV cache holds (vLLM refuses it): lower max_model_len, raise "
                            "gpu_memory_utilization, use kv_dtype=fp8 or more tensor parallelism.")
    elif params.max_num_seqs and params.max_num_seqs * s.seq_len > res.kv_cache_tokens:
        res.findings.append(f"max_num_seqs {params.max_num_seqs} sequences of {s.seq_len:,} tokens need "
                            f"{params.max_num_seqs * s.seq_len:,} tokens: when that many run long, vLLM preempts "
                            "(recomputes) some of them.")
    res.next = ["knowledge://inference/kv-cache.md", "knowledge://training/memory-math.md"]
    return res


def _capacity(params) -> tuple[float, str]:
    if params.gpu_memory_gib is not None:
        return params.gpu_memory_gib, "given"
    if params.accelerator:
        acc = find_accelerator(params.accelerator)
        return capacity_gib(acc), acc["name"]
    raise ToolFailure("gpu_memory_utilization needs the GPU's memory: give accelerator (e.g. h100) or gpu_memory_gib")
