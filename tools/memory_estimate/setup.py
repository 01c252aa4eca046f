"""What memory_estimate's arithmetic needs about a setup, and the setups it has no number for (no SPEC)."""

import dataclasses

from ..shared.transformer_math import Architecture


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
    ep: int = 1
    seq_len: int = 4096
    micro_batch: int = 1
    activation_checkpointing: str = "none"
    flash_attention: bool = True
    kernels: str = "fused"
    compile: str = "none"
    loss_parallel: bool = True
    sequence_parallel: bool = True
    dropout: bool = False
    kv_dtype: str = "bf16"
    reshard_after_forward: str = "auto"
    pp_microbatches: int | None = None
    pipeline_schedule: str = "1f1b"
    finetune: str = "full"
    lora_rank: int = 16
    offload: str = "none"
    offload_device: str = "cpu"
    gpus_per_node: int = 8

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def shard_degree(self, expert: bool = False) -> int:
        """GPUs that share one copy of the sharded states (ZeRO/FSDP over dp x cp; experts over that / ep)."""
        if self.sharding == "none":
            return 1
        group = self.dp * self.cp
        group = min(self.shard_group_size, group) if self.sharding == "fsdp_hybrid_shard" else group
        return max(group // self.ep, 1) if expert else group

    def zero_stage(self) -> int:
        return {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3, "fsdp_full_shard": 3,
                "fsdp_hybrid_shard": 3}[self.sharding]

    @property
    def fsdp(self) -> bool:
        return self.sharding.startswith("fsdp")

    def keeps_unsharded(self) -> bool:
        """FSDP/ZeRO-3 without resharding after forward: torchtitan (and FSDP2's advice) under PP."""
        return {"auto": self.pp > 1, "never": True, "after_forward": False}[self.reshard_after_forward]



SETUP_FIELDS = ("mode", "precision", "optimizer", "fp32_grads", "sharding", "shard_group_size", "tp", "pp", "dp", "cp",
                "ep", "seq_len", "micro_batch", "activation_checkpointing", "flash_attention", "kernels", "compile",
                "loss_parallel", "sequence_parallel", "dropout", "kv_dtype", "reshard_after_forward", "pp_microbatches",
                "pipeline_schedule", "finetune", "lora_rank", "offload", "offload_device", "gpus_per_node")


def setup_from(p) -> Setup:
    """The arithmetic's view of validated MemoryParams."""
    fields = {k: getattr(p, k) for k in SETUP_FIELDS}
    if fields["flash_attention"] is None:  # no flash kernel for fp32 attention on NVIDIA GPUs (see the Params field)
        fields["flash_attention"] = p.precision != "fp32"
    return Setup(arch=p.architecture(), total_params=p.total_params(), **fields)


def unmodelled(s: Setup) -> list[str]:
    """Setups the arithmetic has no honest number for."""
    reasons = []
    if s.pp > 1 and s.pipeline_schedule == "interleaved_1f1b":
        reasons.append("interleaved 1F1B (virtual pipeline stages): how many micro batches each virtual stage "
                       "holds depends on the schedule's warm-up order")
    if s.finetune == "qlora" and s.zero_stage() >= 3:
        reasons.append("QLoRA with ZeRO-3/FSDP: how the 4-bit storage is sharded depends on bitsandbytes' "
                       "quant_storage setting")
    if s.mode == "train" and s.arch is not None and s.arch.mla and s.activation_checkpointing == "op_selective":
        reasons.append("per-op selective checkpointing of multi-head latent attention")
    return reasons
