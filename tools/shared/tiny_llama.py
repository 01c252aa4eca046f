"""A Llama-style decoder in plain torch, built from an Architecture with random weights (no downloads).

Used to check memory_estimate and mfu_calc against what torch really allocates and counts:
RMSNorm, grouped-query attention through scaled_dot_product_attention (flash on GPUs), SwiGLU MLP,
untied output head. Not a tool (no SPEC); torch is imported inside the functions.
"""

from .transformer_math import Architecture


def build(arch: Architecture, device: str = "cpu", dtype=None, recompute: bool = False, expand_kv: bool = False):
    """The model; recompute=True checkpoints every block (full activation recomputation).
    expand_kv=True repeats the K/V heads up to the query heads before attention instead of passing
    enable_gqa: the same result and the same attention FLOPs, in shapes torch's FLOP counter accepts
    (torch 2.11 rejects GQA shapes in its scaled_dot_product_attention formulas)."""
    import torch
    import torch.utils.checkpoint
    from torch import nn
    from torch.nn import functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            h, kv = arch.hidden, arch.kv_dim
            self.attn_norm, self.mlp_norm = nn.RMSNorm(h), nn.RMSNorm(h)
            self.q, self.k, self.v = nn.Linear(h, h, bias=False), nn.Linear(h, kv, bias=False), nn.Linear(h, kv, bias=False)
            self.o = nn.Linear(h, h, bias=False)
            self.gate, self.up = nn.Linear(h, arch.ffn, bias=False), nn.Linear(h, arch.ffn, bias=False)
            self.down = nn.Linear(arch.ffn, h, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            y = self.attn_norm(x)
            q = self.q(y).view(b, s, arch.heads, arch.head_dim).transpose(1, 2)
            k = self.k(y).view(b, s, arch.kv_heads, arch.head_dim).transpose(1, 2)
            v = self.v(y).view(b, s, arch.kv_heads, arch.head_dim).transpose(1, 2)
            gqa = arch.kv_heads != arch.heads
            if gqa and expand_kv:
                group = arch.heads // arch.kv_heads
                k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa and not expand_kv)
            x = x + self.o(att.transpose(1, 2).reshape(b, s, arch.hidden))
            y = self.mlp_norm(x)
            return x + self.down(F.silu(self.gate(y)) * self.up(y))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(arch.vocab, arch.hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(arch.layers))
            self.norm = nn.RMSNorm(arch.hidden)
            self.head = nn.Linear(arch.hidden, arch.vocab, bias=False)

        def forward(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                if recompute:
                    x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
            return self.head(self.norm(x))

    torch.manual_seed(0)
    return Model().to(device=device, dtype=dtype)


def train_step(model, tokens, optimizer=None, autocast_dtype=None):
    """One forward + backward (+ optimizer step) with next-token cross-entropy; returns the loss."""
    import torch
    from torch.nn import functional as F

    device_type = tokens.device.type
    with torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
        logits = model(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens.roll(-1, dims=1).flatten())
    loss.backward()
    if optimizer is not None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def saved_activation_bytes(model, tokens) -> int:
    """Bytes autograd saves for backward during one forward + loss (each storage once, weights excluded):
    the activations a training step holds at the start of the backward pass."""
    import torch
    from torch.nn import functional as F

    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in weights:
            saved.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(tokens)
        F.cross_entropy(logits.flatten(0, 1).float(), tokens.roll(-1, dims=1).flatten())
    return sum(saved.values())


def peak_new_bytes(fn) -> tuple[int, str]:
    """Run fn() and return (largest total of tensor storages created inside it and alive at once, the op
    after which that was reached). Tracks every op's outputs, backward included, through a dispatch mode;
    works on CPU, where torch has no allocator statistics. Scratch memory inside one kernel is not seen."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Live(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.live: dict[int, tuple] = {}
            self.outside: set[int] = set()
            self.peak, self.at = 0, ""

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            for t in tree_flatten((args, kwargs))[0]:  # tensors made before fn (weights): never counted
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in self.live:
                    self.outside.add(t.untyped_storage().data_ptr())
            out = func(*args, **(kwargs or {}))
            for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
                del self.live[key]  # first: a new output may reuse a freed address
            for t in tree_flatten(out)[0]:
                known = self.live.keys() | self.outside
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in known:
                    storage = t.untyped_storage()
                    if storage.data_ptr():
                        self.live[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
            now = sum(n for _, n in self.live.values())
            if now > self.peak:
                self.peak, self.at = now, str(func)
            return out

    mode = Live()
    with mode:
        fn()
    return mode.peak, mode.at
