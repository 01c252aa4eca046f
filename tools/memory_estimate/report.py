"""memory_estimate's result fields and findings from a breakdown (no SPEC: not a tool)."""

from .activations import kv_cache_bytes_per_token
from .memory_math import (FRAGMENTATION, adapter_params, host_ram_per_node, model_state_bytes_per_param,
                          nvme_bytes_per_node, stage_params, stages)
from .setup import Setup
from ..shared.planning import GIB, gib

OVERHEADS = ("framework_overhead", "nccl_buffers")
STATES = ("weights", "gradients", "master_weights", "optimizer_states", "gathered_params")


def fill(params, s: Setup, stage: str, parts: dict[str, float], res) -> None:
    total = sum(parts.values())
    tensors = sum(v for k, v in parts.items() if k not in OVERHEADS)
    res.total_gib, res.pipeline_stage = gib(total), stage
    for k, v in parts.items():
        setattr(res, f"{k}_gib", gib(v))
    res.torch_allocated_gib = gib(tensors)
    res.torch_reserved_gib = gib(tensors * (1 + FRAGMENTATION))
    res.model_states_gib = gib(sum(parts[k] for k in STATES))
    res.params_per_gpu = int(max(sum(stage_params(s, st)) for st in stages(s)))
    if s.mode == "train":
        res.model_state_bytes_per_param = round(sum(model_state_bytes_per_param(s).values()), 3)
        if s.finetune != "full":
            res.trainable_params = int(sum(adapter_params(s.arch, s.arch.is_moe_layer(i), s.lora_rank)
                                           for i in range(s.arch.layers)))
    elif s.arch is not None:
        res.kv_cache_bytes_per_token = kv_cache_bytes_per_token(s)
    if s.offload != "none":
        res.host_ram_per_node_gib = gib(host_ram_per_node(s))
        res.nvme_per_node_gib = gib(nvme_bytes_per_node(s)) if s.offload_device == "nvme" else None
    _findings(params, s, stage, parts, total, res)


def _findings(params, s: Setup, stage: str, parts: dict[str, float], total: float, res) -> None:
    top = sorted(((v, k) for k, v in parts.items() if v > 0), reverse=True)[:4]
    where = f" ({'most loaded stage: ' + stage if stage != 'only' else 'no pipeline'})" if s.pp > 1 else ""
    res.findings.append(f"Estimated peak per GPU{where}: {total / GIB:.1f} GiB ({res.torch_reserved_gib:.1f} GiB as "
                        "torch.cuda.max_memory_reserved would show it); largest parts: "
                        + ", ".join(f"{k.replace('_', ' ')} {v / GIB:.1f} GiB" for v, k in top) + ".")
    a = s.arch
    if a is not None and a.moe:
        res.findings.append(f"Mixture of experts: {a.experts} experts, top-{a.top_k}"
                            + (f" + {a.shared_experts} shared" if a.shared_experts else "")
                            + f"; {res.params_total / 1e9:.1f} B parameters in all, {res.params_active / 1e9:.1f} B "
                            f"active per token; ep={s.ep} splits the experts over {s.ep} GPUs.")
    if s.mode == "train" and res.model_state_bytes_per_param:
        res.findings.append(f"Model states: {res.model_state_bytes_per_param:g} bytes per trainable parameter before "
                            f"sharding; {s.total_params / 1e9:.2f} B parameters in all.")
    if s.finetune != "full":
        base = "4-bit NF4" if s.finetune == "qlora" else "16-bit"
        res.findings.append(f"{s.finetune.upper()}: frozen {base} base weights, {res.trainable_params / 1e6:.1f} M "
                            f"adapter parameters (rank {s.lora_rank}, every linear layer) trained.")
    if s.offload != "none":
        where = "NVMe" if s.offload_device == "nvme" else "host RAM"
        res.findings.append(f"Offload ({s.offload}) to {where}: host RAM per node {res.host_ram_per_node_gib:.1f} GiB "
                            "(DeepSpeed's 1.5x buffer factor included)"
                            + (f", NVMe {res.nvme_per_node_gib:.1f} GiB per node" if res.nvme_per_node_gib else "") + ".")
    if s.mode == "inference" and a is not None:
        res.findings.append(f"KV cache: {res.kv_cache_bytes_per_token / 1024:.0f} KiB per token per GPU "
                            f"({params.kv_dtype}), {parts['kv_cache'] / GIB:.1f} GiB for {s.micro_batch} x "
                            f"{s.seq_len} tokens.")
    if a is None:
        res.findings.append("Only params_b was given: activations, logits and KV cache are not included; "
                            "give a model preset or layers/hidden/heads to include them.")
    if s.mode == "train" and s.activation_checkpointing == "selective" and s.flash_attention:
        res.findings.append("activation_checkpointing=selective is Megatron's (recompute the attention scores), which "
                            "flash attention never stores: it saves nothing here. PyTorch/torchtitan per-op selective "
                            "checkpointing is op_selective.")
    if s.sharding != "none" and s.shard_degree() == 1:
        res.findings.append(f"{s.sharding} with dp x cp = 1 shards over a single GPU: it saves no memory.")
    if s.keeps_unsharded() and s.zero_stage() >= 3 and s.shard_degree() > 1:
        res.findings.append("FSDP/ZeRO-3 without resharding after forward (the default under pipelining): each GPU "
                            "holds its whole stage unsharded, and its gradients accumulated in fp32 across micro batches.")
    res.next = ["knowledge://training/memory-math.md", "knowledge://debugging/oom.md"]
    if s.mode == "inference":
        res.next.append("knowledge://inference/kv-cache.md")
