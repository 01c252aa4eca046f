"""Peak GPU memory of one optimizer step of a Hugging Face Llama, against memory_estimate.

Builds transformers' LlamaForCausalLM from a LlamaConfig with random weights (nothing is downloaded;
without transformers it falls back to the repository's own Llama in tools/shared/tiny_llama.py), with a
128K vocabulary so that the logits and the loss count, and for each of four recipes

    fp32                     fp32 weights and activations, AdamW (16 B/param)
    bf16 autocast            fp32 weights, torch.autocast(bfloat16) (amp_bf16)
    ... each with and without gradient checkpointing (every decoder layer: full recomputation)

runs two warm-up steps (the optimizer states exist from the first), then measures one step:
torch.cuda.max_memory_reserved and max_memory_allocated, printed beside memory_estimate's
torch_reserved_gib / torch_allocated_gib for the same setup (eager kernels, eager loss,
flash attention via SDPA). One JSON line per recipe; --json also writes them to a file.

    python bench/memory_vs_estimate.py --json memory_h200.json
    python bench/memory_vs_estimate.py --cpu-smoke          # tiny model on the CPU: the plumbing only
"""

import argparse
import gc
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

GIB = 2**30
GPU_ARCH = dict(layers=16, hidden=2048, heads=16, kv_heads=8, ffn=8192, vocab=128256)
SMOKE_ARCH = dict(layers=2, hidden=128, heads=4, kv_heads=2, ffn=256, vocab=4096)
RECIPES = [("fp32", False), ("fp32", True), ("amp_bf16", False), ("amp_bf16", True)]


def build_model(arch: dict, device: str, checkpointing: bool):
    """(model, which implementation): transformers' Llama when importable, else tools/shared/tiny_llama.py."""
    import torch

    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        from tools.memory_estimate import MemoryParams
        from tools.shared.tiny_llama import build

        model = build(MemoryParams(**arch).architecture(), device=device, recompute=checkpointing)
        return model, "tools/shared/tiny_llama.py (transformers not importable)"
    config = LlamaConfig(vocab_size=arch["vocab"], hidden_size=arch["hidden"], intermediate_size=arch["ffn"],
                         num_hidden_layers=arch["layers"], num_attention_heads=arch["heads"],
                         num_key_value_heads=arch["kv_heads"], tie_word_embeddings=False,
                         attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(device=device, dtype=torch.float32)
    if checkpointing:  # every decoder layer recomputed in backward (transformers 5 renames it; same kwargs)
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    import transformers

    return model, f"transformers {transformers.__version__} LlamaForCausalLM"


def step(model, tokens, opt, autocast: bool, hf: bool):
    """One training step the way users write it: a Hugging Face model computes its own loss
    (logits.float() then cross-entropy); the tiny Llama's train_step does the same by hand."""
    import torch

    if not hf:
        from tools.shared.tiny_llama import train_step

        return train_step(model, tokens, opt, autocast_dtype=torch.bfloat16 if autocast else None)
    with torch.autocast(tokens.device.type, dtype=torch.bfloat16, enabled=autocast):
        out = model(tokens, labels=tokens)
    out.loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return out.loss.detach()


def measure(arch: dict, precision: str, checkpointing: bool, batch: int, seq: int, device: str) -> dict:
    import torch

    gc.collect()
    model, impl = build_model(arch, device, checkpointing)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device == "cuda")
    tokens = torch.randint(0, arch["vocab"], (batch, seq), device=device)
    hf = impl.startswith("transformers")
    for _ in range(2):
        step(model, tokens, opt, precision == "amp_bf16", hf)
    row = {"implementation": impl, "precision": precision, "checkpointing": checkpointing, "batch": batch,
           "seq_len": seq, "params": sum(p.numel() for p in model.parameters())}
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step(model, tokens, opt, precision == "amp_bf16", hf)
        torch.cuda.synchronize()
        row["peak_reserved_gib"] = round(torch.cuda.max_memory_reserved() / GIB, 3)
        row["peak_allocated_gib"] = round(torch.cuda.max_memory_allocated() / GIB, 3)
        row["gpu"] = torch.cuda.get_device_name()
    row["torch"] = torch.__version__
    del model, opt, tokens
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return row


def estimate(arch: dict, precision: str, checkpointing: bool, batch: int, seq: int) -> dict:
    from tools.memory_estimate import MemoryParams, run, setup_from
    from tools.memory_estimate.memory_math import breakdown

    p = MemoryParams(**arch, precision=precision, seq_len=seq, micro_batch=batch, kernels="eager",
                     activation_checkpointing="full" if checkpointing else "none")
    r = run(p, lambda f, m: None)
    parts = breakdown(setup_from(p))[1]
    return {"estimate_torch_reserved_gib": r.torch_reserved_gib, "estimate_torch_allocated_gib": r.torch_allocated_gib,
            "estimate_total_gib": r.total_gib, "estimate_parts_bytes": {k: int(v) for k, v in parts.items() if v}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq-len", type=int, default=4096)
    ap.add_argument("--json", type=Path, help="also write the rows to this file (one JSON list)")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny model on the CPU: the plumbing only")
    args = ap.parse_args(argv)
    import torch

    if args.cpu_smoke:
        arch, device, batch, seq = SMOKE_ARCH, "cpu", 1, 64
    elif not torch.cuda.is_available():
        print("no CUDA GPU: run with --cpu-smoke to check the plumbing", file=sys.stderr)
        return 2
    else:
        arch, device, batch, seq = GPU_ARCH, "cuda", args.batch, args.seq_len
    rows = []
    for precision, checkpointing in RECIPES:
        row = measure(arch, precision, checkpointing, batch, seq, device)
        row.update(estimate(arch, precision, checkpointing, batch, seq))
        if "peak_reserved_gib" in row:
            row["reserved_over_estimate"] = round(row["peak_reserved_gib"] / row["estimate_torch_reserved_gib"], 3)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
