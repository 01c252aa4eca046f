"""Decoder-only transformer arithmetic shared by memory_estimate and mfu_calc (no SPEC: not a tool).

- `Architecture`: layers, hidden, heads, ... with parameter counting that matches the published
  totals of the presets in `knowledge/data/model_presets.toml` (tests check this).
- `ModelParams`: the model-describing fields both tools accept (a preset id, a bare parameter count,
  or an architecture; explicit fields override the preset), validated at construction.
- `flops_per_token`: training FLOPs per token, 6 x matmul parameters plus the attention term
  (PaLM appendix B, arXiv 2204.02311; Megatron-LM, arXiv 2104.04473 eq. 3).
"""

import dataclasses
from typing import Literal

from pydantic import ConfigDict, model_validator

from ..engine.spec import SELF_EVIDENT, Field, Params, ToolFailure, present
from ..engine.data import load_data


@dataclasses.dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer. Dense by default; `experts` > 0 makes the MLP of every layer after
    the first `dense_layers` a mixture of experts (top_k routed + shared_experts always on, each of
    width moe_ffn); kv_lora_rank > 0 is multi-head latent attention (DeepSeek-V2/V3)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    tied_embeddings: bool = False
    gated_mlp: bool = True
    linear_bias: bool = False
    head_dim_override: int | None = None  # when heads x head_dim != hidden (Qwen3, Gemma)
    experts: int = 0
    top_k: int = 0
    shared_experts: int = 0
    moe_ffn: int = 0
    dense_layers: int = 0
    q_lora_rank: int = 0  # MLA: low-rank query (0: full query projection)
    kv_lora_rank: int = 0  # MLA: the latent that the KV cache holds
    rope_head_dim: int = 0  # MLA: decoupled RoPE part of each query/key head
    v_head_dim: int = 0  # MLA: value head size

    @property
    def head_dim(self) -> int:
        return self.head_dim_override or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        return self.heads * (self.head_dim + self.rope_head_dim)

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe(self) -> bool:
        return self.experts > 0

    def is_moe_layer(self, index: int) -> bool:
        return self.moe and index >= self.dense_layers

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.moe else 0

    def attention_params(self) -> int:
        """q, k, v, o projections (MLA: the low-rank down/up projections and their norms)."""
        h = self.hidden
        if not self.mla:
            return 2 * h * self.heads * self.head_dim + 2 * h * self.kv_dim
        q = h * self.q_dim if not self.q_lora_rank else self.q_lora_rank * (h + 1 + self.q_dim)
        kv = h * (self.kv_lora_rank + self.rope_head_dim) + self.kv_lora_rank * (
            1 + self.heads * (self.head_dim + self.v_head_dim))
        return q + kv + self.heads * self.v_head_dim * h

    def mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    def expert_params(self) -> int:
        return self.mlp_matrices() * self.hidden * self.moe_ffn

    def mlp_params(self, moe: bool, active: bool = False) -> int:
        """One layer's MLP: dense, or the experts (all, or the top_k a token uses) + shared + router."""
        if not moe:
            return self.mlp_matrices() * self.hidden * self.ffn
        routed = self.top_k if active else self.experts
        return (routed + self.shared_experts) * self.expert_params() + self.hidden * self.experts

    def layer_matmul_params(self, moe: bool = False, active: bool = False) -> int:
        """Weights of the attention and MLP matrices of one layer."""
        return self.attention_params() + self.mlp_params(moe, active)

    def layer_params(self, moe: bool = False, active: bool = False) -> int:
        norms = 2 * self.hidden * (2 if self.linear_bias else 1)  # RMSNorm scale (+ LayerNorm bias)
        biases = 0
        if self.linear_bias:
            biases = 3 * self.hidden + 2 * self.kv_dim + self.ffn * (2 if self.gated_mlp else 1)
        return self.layer_matmul_params(moe, active) + norms + biases

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def head_params(self) -> int:
        """Output projection weights held apart from the embedding (0 when tied)."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    def final_norm_params(self) -> int:
        return self.hidden * (2 if self.linear_bias else 1)

    def _layers_sum(self, per_layer) -> int:
        dense = self.layers - self.moe_layers
        return dense * per_layer(False) + self.moe_layers * per_layer(True)

    def total_params(self, active: bool = False) -> int:
        """All parameters, or (active=True) those one token uses: its top_k experts of each MoE layer."""
        layers = self._layers_sum(lambda moe: self.layer_params(moe, active))
        return self.embedding_params() + layers + self.final_norm_params() + self.head_params()

    def matmul_params(self) -> int:
        """Parameters that take part in a matmul for every token: all layers (MoE: the active experts)
        plus the output head (the embedding lookup is not a matmul, but a tied head still is one)."""
        return self._layers_sum(lambda moe: self.layer_matmul_params(moe, active=True)) + self.vocab * self.hidden

    def kv_elements_per_token_layer(self, tp: int = 1) -> float:
        """KV-cache elements one token needs in one layer on one GPU. MLA caches the latent and the
        RoPE key once per token (replicated across TP ranks); GQA caches K and V per KV head, one head
        per rank at least when there are fewer KV heads than ranks."""
        if self.mla:
            return self.kv_lora_rank + self.rope_head_dim
        heads_here = self.kv_heads / tp if self.kv_heads >= tp else 1
        return 2 * heads_here * self.head_dim


def presets() -> dict[str, dict]:
    return {m["id"]: m for m in load_data("model_presets")["model"]}


def preset_id(model: str) -> str | None:
    """The preset a model name means: a preset id, or a Hugging Face id its `hf_ids` list (any case, with or
    without https://huggingface.co/); None when neither."""
    key = model.strip().lower().removeprefix("https://").removeprefix("huggingface.co/").strip("/")
    for pid, preset in presets().items():
        if key == pid or key in (h.lower() for h in preset.get("hf_ids", [])):
            return pid
    return None


ARCH_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "tied_embeddings", "gated_mlp",
               "head_dim", "experts", "top_k", "shared_experts", "moe_ffn", "dense_layers")
PRESET_ONLY = ("linear_bias", "q_lora_rank", "kv_lora_rank", "rope_head_dim", "v_head_dim")


def _preset_enum(schema: dict) -> None:
    """The model field's schema lists the preset ids (read from knowledge data when the schema is built), and
    takes an org/name Hugging Face id too: the presets' `hf_ids` map it (not listed: every session would read them)."""
    for option in schema.get("anyOf", []):
        if option.get("type") == "string":
            option["enum"] = sorted(presets())
    schema.setdefault("anyOf", []).insert(1, {"type": "string", "pattern": "^[^/]+/[^/]+$", "maxLength": 128})


# A model is described by a preset, by layers + hidden + heads, or by params_b alone (then with no
# architecture field, which would need the other two).
MODEL_DESCRIBED = {"anyOf": [present("model"), {"allOf": [present("layers"), present("hidden"), present("heads")]},
                              {"allOf": [present("params_b"), *({"not": present(f)} for f in ARCH_FIELDS)]}]}


class ModelParams(Params):
    """The model description shared by memory_estimate and mfu_calc."""

    model_config = ConfigDict(json_schema_extra=MODEL_DESCRIBED)

    model: str | None = Field(
        None, max_length=128, json_schema_extra=_preset_enum, description=(
            "A preset or its Hugging Face id; or layers + hidden + heads, or params_b; given fields override it."))
    params_b: float | None = Field(
        None, gt=0, le=100000, description=(
            "Billions, if the architecture is unknown (no activations, KV cache, attention)."))
    layers: int | None = Field(None, ge=1, le=1000, json_schema_extra=SELF_EVIDENT, description="Transformer layers.")
    hidden: int | None = Field(None, ge=1, le=1_000_000, json_schema_extra=SELF_EVIDENT, description="Hidden size.")
    heads: int | None = Field(None, ge=1, le=10000, description="Query heads.")
    kv_heads: int | None = Field(
        None, ge=1, le=10000, description="GQA; default heads.")
    ffn: int | None = Field(None, ge=1, le=10_000_000, description="MLP size; default 4 x hidden.")
    vocab: int | None = Field(None, ge=1, le=10_000_000, description="Default 32000.")
    tied_embeddings: bool | None = Field(
        None, description="Embedding shared with the head; default false.")
    gated_mlp: bool | None = Field(
        None, description="SwiGLU (3 matrices); default true.")
    head_dim: int | None = Field(None, ge=1, le=4096, description="When heads x head_dim != hidden (Qwen3: 128).")
    experts: int | None = Field(None, ge=0, le=100000, description="MoE routed experts per layer (0: dense).")
    top_k: int | None = Field(None, ge=1, le=1024, description="MoE experts per token.")
    shared_experts: int | None = Field(None, ge=0, le=64, description="MoE always-on experts; default 0.")
    moe_ffn: int | None = Field(None, ge=1, le=1_000_000, description="MoE expert MLP size; default ffn.")
    dense_layers: int | None = Field(None, ge=0, le=1000, description="MoE leading dense layers; default 0.")

    @model_validator(mode="after")
    def _check_model(self):
        self.architecture()  # raises ValueError naming the field when the description is unusable
        return self

    def architecture(self) -> Architecture | None:
        """The resolved architecture, or None when only params_b describes the model."""
        base: dict = {}
        name = "custom"
        if self.model is not None:
            table = presets()
            key = preset_id(self.model)
            if key is None:
                raise ValueError(f"model {self.model!r} is not a known preset or Hugging Face id; known: "
                                 f"{', '.join(sorted(table))}. Give params_b, or layers, hidden and heads (from its "
                                 "config.json: num_hidden_layers, hidden_size, num_attention_heads) instead.")
            base = {k: table[key][k] for k in (*ARCH_FIELDS, *PRESET_ONLY) if k in table[key]}
            name = table[key]["name"]
        given = {k: getattr(self, k) for k in ARCH_FIELDS if getattr(self, k) is not None}
        merged = {**base, **given}
        if not {"layers", "hidden", "heads"} <= merged.keys():
            if self.params_b is None:
                raise ValueError("describe the model: give model (a preset id), params_b, or at least "
                                 "layers, hidden and heads")
            if given:
                raise ValueError(f"architecture fields {sorted(given)} need layers, hidden and heads as well")
            return None
        merged.setdefault("kv_heads", merged["heads"])
        merged.setdefault("ffn", 4 * merged["hidden"])
        merged.setdefault("vocab", 32000)
        merged.setdefault("tied_embeddings", False)
        merged.setdefault("gated_mlp", True)
        merged["head_dim_override"] = merged.pop("head_dim", None)
        if merged.get("experts"):
            if not merged.get("top_k"):
                raise ValueError("experts > 0 needs top_k (routed experts per token)")
            if merged["top_k"] > merged["experts"]:
                raise ValueError(f"top_k={merged['top_k']} is more than experts={merged['experts']}")
            merged.setdefault("moe_ffn", merged["ffn"])
            if merged.get("dense_layers", 0) > merged["layers"]:
                raise ValueError(f"dense_layers={merged['dense_layers']} is more than layers={merged['layers']}")
        arch = Architecture(name=name, **merged)
        if arch.head_dim_override is None and arch.hidden % arch.heads:
            raise ValueError(f"hidden={arch.hidden} is not divisible by heads={arch.heads}")
        if arch.heads % arch.kv_heads:
            raise ValueError(f"heads={arch.heads} is not a multiple of kv_heads={arch.kv_heads}")
        return arch

    def total_params(self) -> int:
        """params_b when given (the user's figure wins), else the count from the architecture."""
        if self.params_b is not None:
            return int(self.params_b * 1e9)
        arch = self.architecture()
        if arch is None:
            raise ToolFailure("no parameter count: give params_b, a model preset or the architecture")
        return arch.total_params()

    def active_params(self) -> int:
        """Parameters one token uses (= total for a dense model or a bare params_b)."""
        arch = self.architecture()
        return self.total_params() if arch is None or self.params_b is not None else arch.total_params(active=True)


AttentionFlops = Literal["full", "causal", "none"]
Recompute = Literal["none", "selective", "full"]


@dataclasses.dataclass(frozen=True)
class TokenFlops:
    model: float      # FLOPs per trained token the model needs (MFU numerator)
    hardware: float   # FLOPs per token the GPUs execute, recomputation included (HFU numerator)
    matmul: float     # the 6N part
    attention: float  # the attention-score part (QK^T and AV), forward + backward


def flops_per_token(matmul_params: int, arch: Architecture | None, seq_len: int,
                    attention: AttentionFlops = "full", recompute: Recompute = "none") -> TokenFlops:
    """Training FLOPs per token: 2 (forward) + 4 (backward) per matmul parameter, plus attention
    scores: forward QK^T and AV cost 4 x seq x heads x head_dim per layer and token, x3 with backward.
    'full' counts the whole score matrix (PaLM / Megatron convention); 'causal' half of it (what
    a causal flash kernel computes); 'none' leaves it out (the bare 6N rule).
    Recompute: full re-runs each layer's forward (+2N, +1/3 attention); selective only the attention scores.
    """
    matmul = 6.0 * matmul_params
    attn_fwd = 0.0
    if arch is not None and attention != "none":
        per_head = arch.head_dim + arch.rope_head_dim + (arch.v_head_dim or arch.head_dim)  # QK^T + AV widths
        attn_fwd = 2.0 * arch.layers * arch.heads * per_head * seq_len
        if attention == "causal":
            attn_fwd /= 2
    model = matmul + 3 * attn_fwd
    # Full recomputation re-runs every layer's forward, not the output head (Megatron-LM eq. 3).
    layer_matmul = matmul_params - (arch.vocab * arch.hidden if arch is not None else 0)
    extra = {"none": 0.0, "selective": attn_fwd, "full": 2.0 * layer_matmul + attn_fwd}[recompute]
    return TokenFlops(model=model, hardware=model + extra, matmul=matmul, attention=3 * attn_fwd)
