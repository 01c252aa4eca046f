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

from ..engine.spec import Field, Params, ToolFailure, present
from ..engine.data import load_data


@dataclasses.dataclass(frozen=True)
class Architecture:
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

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def layer_matmul_params(self) -> int:
        """Weights of the attention and MLP matrices of one layer."""
        attention = 2 * self.hidden * self.hidden + 2 * self.hidden * self.kv_dim  # q, o + k, v
        mlp = (3 if self.gated_mlp else 2) * self.hidden * self.ffn
        return attention + mlp

    def layer_params(self) -> int:
        norms = 2 * self.hidden * (2 if self.linear_bias else 1)  # RMSNorm scale (+ LayerNorm bias)
        biases = 0
        if self.linear_bias:
            biases = 3 * self.hidden + 2 * self.kv_dim + self.ffn * (2 if self.gated_mlp else 1)
        return self.layer_matmul_params() + norms + biases

    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    def head_params(self) -> int:
        """Output projection weights held apart from the embedding (0 when tied)."""
        return 0 if self.tied_embeddings else self.vocab * self.hidden

    def final_norm_params(self) -> int:
        return self.hidden * (2 if self.linear_bias else 1)

    def total_params(self) -> int:
        return (self.embedding_params() + self.layers * self.layer_params() + self.final_norm_params()
                + self.head_params())

    def matmul_params(self) -> int:
        """Parameters that take part in a matmul for every token: all layers plus the output head
        (the embedding lookup is not a matmul, but a tied head still is one)."""
        return self.layers * self.layer_matmul_params() + self.vocab * self.hidden


def presets() -> dict[str, dict]:
    return {m["id"]: m for m in load_data("model_presets")["model"]}


ARCH_FIELDS = ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "tied_embeddings", "gated_mlp")


def _preset_enum(schema: dict) -> None:
    """The model field's schema lists the preset ids (read from knowledge data when the schema is built)."""
    for option in schema.get("anyOf", []):
        if option.get("type") == "string":
            option["enum"] = sorted(presets())


# A model is described by a preset, by layers + hidden + heads, or by params_b alone (then with no
# architecture field, which would need the other two).
_DESCRIBED = {"anyOf": [present("model"), {"allOf": [present("layers"), present("hidden"), present("heads")]},
                        {"allOf": [present("params_b"), *({"not": present(f)} for f in ARCH_FIELDS)]}]}


class ModelParams(Params):
    """The model description shared by memory_estimate and mfu_calc."""

    model_config = ConfigDict(json_schema_extra=_DESCRIBED)

    model: str | None = Field(
        None, json_schema_extra=_preset_enum, description=(
            "Preset id of a well-known open model (e.g. llama-3-8b, llama-3-70b, llama-2-7b, mistral-7b, "
            "qwen2.5-7b, llama-3.1-405b, gpt3-175b, tinyllama-1.1b). Fields given below override it. Describe "
            "the model by model, by layers + hidden + heads, or by params_b alone; hidden must be a multiple "
            "of heads and heads of kv_heads."))
    params_b: float | None = Field(
        None, gt=0, le=100000, description="Total parameter count in billions, when the architecture is "
        "unknown. Without an architecture, activations, KV cache and the attention FLOPs cannot be estimated.")
    layers: int | None = Field(None, ge=1, le=1000, description="Number of transformer layers.")
    hidden: int | None = Field(None, ge=1, le=1_000_000, description="Hidden size (model width).")
    heads: int | None = Field(None, ge=1, le=10000, description="Attention (query) heads.")
    kv_heads: int | None = Field(
        None, ge=1, le=10000, description="Key/value heads (grouped-query attention); default: = heads.")
    ffn: int | None = Field(None, ge=1, le=10_000_000, description="MLP intermediate size; default 4 x hidden.")
    vocab: int | None = Field(None, ge=1, le=10_000_000, description="Vocabulary size; default 32000.")
    tied_embeddings: bool | None = Field(
        None, description="Input embedding and output head share one matrix; default false.")
    gated_mlp: bool | None = Field(
        None, description="SwiGLU-style MLP with 3 matrices (Llama, Mistral, Qwen); default true.")

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
            key = self.model.strip().lower()
            if key not in table:
                raise ValueError(f"model {self.model!r} is not a known preset; known: {', '.join(sorted(table))}. "
                                 "Give params_b or the architecture fields instead.")
            base = {k: table[key][k] for k in (*ARCH_FIELDS, "linear_bias")}
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
        arch = Architecture(name=name, **merged)
        if arch.hidden % arch.heads:
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
        attn_fwd = 4.0 * arch.layers * arch.heads * arch.head_dim * seq_len
        if attention == "causal":
            attn_fwd /= 2
    model = matmul + 3 * attn_fwd
    # Full recomputation re-runs every layer's forward, not the output head (Megatron-LM eq. 3).
    layer_matmul = matmul_params - (arch.vocab * arch.hidden if arch is not None else 0)
    extra = {"none": 0.0, "selective": attn_fwd, "full": 2.0 * layer_matmul + attn_fwd}[recompute]
    return TokenFlops(model=model, hardware=model + extra, matmul=matmul, attention=3 * attn_fwd)
