"""memory_estimate for the models of 2026: mixture of experts, LoRA/QLoRA, offload and paged KV serving,
each against published figures."""

import pytest
from pydantic import ValidationError

from tools.memory_estimate import memory_math as mm
from tools.shared.transformer_math import ModelParams, presets
from tools.memory_estimate import MemoryParams, run, setup_from

GIB = 2**30
MOE = sorted(k for k, v in presets().items() if v.get("experts"))


def estimate(**kw):
    return run(MemoryParams(**kw), lambda f, m: None)


def test_the_moe_presets_are_there():
    assert {"mixtral-8x7b", "deepseek-v3", "qwen3-30b-a3b", "qwen3-235b-a22b"} <= set(MOE)


@pytest.mark.parametrize("model_id", MOE)
def test_moe_total_and_active_parameters_match_published_counts(model_id):
    """Published: Mixtral 46.7B / 12.9B per token (Mistral), DeepSeek-V3 671B / 37B (arXiv 2412.19437),
    Qwen3 30.5B / 3.3B and 235B / 22B (model cards). Totals within 0.5%; active within 2% (DeepSeek's
    37B and Qwen's 3.3B are rounded)."""
    p = ModelParams(model=model_id)
    published = presets()[model_id]
    assert p.total_params() == pytest.approx(published["params_b"] * 1e9, rel=0.005)
    assert p.active_params() == pytest.approx(published["active_params_b"] * 1e9, rel=0.02)


def test_expert_parallelism_splits_the_experts_only():
    one = setup_from(MemoryParams(model="mixtral-8x7b", dp=8))
    eight = setup_from(MemoryParams(model="mixtral-8x7b", dp=8, ep=8))
    st = mm.stages(one)[0]
    dense1, expert1, _ = mm.stage_params(one, st)
    dense8, expert8, _ = mm.stage_params(eight, st)
    assert dense8 == dense1 and expert8 == pytest.approx(expert1 / 8)
    a = one.arch
    assert expert1 == a.moe_layers * a.experts * a.expert_params()


def test_moe_activations_grow_with_top_k():
    base = dict(layers=4, hidden=1024, heads=8, ffn=2048, vocab=1000, experts=8, moe_ffn=512, kernels="fused")
    two, four = estimate(**base, top_k=2), estimate(**base, top_k=4)
    assert four.activations_gib > two.activations_gib
    assert four.params_total == two.params_total and four.params_active > two.params_active


@pytest.mark.parametrize("kw, match", [
    ({"model": "mixtral-8x7b", "dp": 8, "ep": 3}, "ep=3"),
    ({"model": "llama-3-8b", "dp": 8, "ep": 2}, "needs a MoE model"),
    ({"model": "mixtral-8x7b", "dp": 2, "ep": 4}, "must divide dp x cp"),
    ({"layers": 2, "hidden": 64, "heads": 4, "experts": 8}, "needs top_k"),
    ({"layers": 2, "hidden": 64, "heads": 4, "experts": 4, "top_k": 8}, "top_k=8 is more than experts=4"),
])
def test_moe_bad_input_names_the_field(kw, match):
    with pytest.raises(ValidationError, match=match):
        MemoryParams(**kw)


def test_op_selective_checkpointing_of_a_moe_model_is_said_not_estimated():
    r = estimate(model="qwen3-30b-a3b", activation_checkpointing="op_selective", accelerator="h100")
    assert r.total_gib is None and r.fits is None and "MoE" in r.not_modelled[0]


def test_qlora_65b_fits_one_48gb_gpu_as_the_paper_says():
    """QLoRA (arXiv 2305.14314, abstract): finetuning a 65B model goes from more than 780 GB of GPU memory
    (16-bit full finetuning) to less than 48 GB. Their recipe: NF4 + double quantisation, LoRA on every
    linear layer (r=64), bf16 adapters, gradient checkpointing; batch 1 of 512 tokens here."""
    kw = dict(model="llama-65b", seq_len=512, micro_batch=1, activation_checkpointing="full")
    q = estimate(**kw, finetune="qlora", lora_rank=64, gpu_memory_gib=48 * 0.99)  # a 48 GB card, ~1% kept by the driver
    assert q.fits, q.findings
    # 64.7 B matrix weights x 0.516 B (NF4 + double-quantised constants) = 33.4 GB, embedding and head in
    # 16 bits 1.0 GB, 0.8 B bf16 adapters 1.6 GB
    assert q.weights_gib * GIB / 1e9 == pytest.approx(33.4 + 1.05 + 1.6, rel=0.02)
    assert q.trainable_params == pytest.approx(80 * 64 * (4 * 2 * 8192 + 3 * (8192 + 22016)), rel=1e-6)
    full = estimate(**kw, precision="bf16_mixed", fp32_grads=False)
    assert full.total_gib * GIB / 1e9 > 780


def test_lora_gpt3_needs_about_350gb_as_the_lora_paper_says():
    """LoRA (arXiv 2106.09685, section 4.2): GPT-3 175B training VRAM drops from 1.2 TB to 350 GB (r=4, frozen
    16-bit base). The base weights are the 350 GB; the adapters and their states are small."""
    r = estimate(model="gpt3-175b", finetune="lora", lora_rank=4, seq_len=2048, activation_checkpointing="full")
    assert r.model_states_gib * GIB / 1e9 == pytest.approx(350, rel=0.05)
    assert r.trainable_params < 0.01 * r.params_total


def test_offload_to_nvme_moves_the_states_off_host_ram():
    kw = dict(params_b=2.851, sharding="zero3", dp=8, offload="optimizer_and_params")
    cpu, nvme = estimate(**kw), estimate(**kw, offload_device="nvme")
    assert nvme.nvme_per_node_gib * 1.5 == pytest.approx(cpu.host_ram_per_node_gib, rel=0.01)
    assert nvme.host_ram_per_node_gib == 0 and nvme.weights_gib == 0 == cpu.weights_gib
    with pytest.raises(ValidationError, match="optimizer_and_params needs sharding zero3"):
        MemoryParams(params_b=1, offload="optimizer_and_params")


def test_paged_kv_like_vllm():
    """Llama-3-8B on one H100 80GB at vLLM's default gpu_memory_utilization 0.9: what is left after the
    weights and the profiled activations becomes 16-token blocks of 128 KiB per token."""
    r = estimate(model="llama-3-8b", mode="inference", gpu_memory_utilization=0.9, seq_len=8192,
                 gpu_memory_gib=79.19, max_num_seqs=256)
    weights = 8_030_261_248 * 2
    assert r.kv_cache_bytes_per_token == 131072 and r.kv_cache_tokens % 16 == 0
    left = 0.9 * 79.19 * GIB - weights - r.activations_gib * GIB - r.framework_overhead_gib * GIB
    assert r.kv_cache_tokens == pytest.approx(left / 131072, abs=200)
    assert r.max_concurrency == pytest.approx(r.kv_cache_tokens / 8192, abs=0.01) and r.fits
    assert any("preempts" in f for f in r.findings)  # 256 x 8192 tokens do not fit at once
    long = estimate(model="llama-3-8b", mode="inference", gpu_memory_utilization=0.9, seq_len=1_000_000,
                    gpu_memory_gib=79.19)
    assert long.fits is False and "refuses" in long.findings[0]


@pytest.mark.parametrize("precision, checkpointing", [("fp32", False), ("fp32", True), ("amp_bf16", False),
                                                      ("amp_bf16", True)])
@pytest.mark.slow
def test_hugging_face_llama_step_peak_on_cpu(precision, checkpointing):
    """transformers' LlamaForCausalLM built from a config (nothing downloaded), one forward + backward with
    the model's own loss, the largest set of tensors alive at once tracked op by op (torch has no allocator
    statistics on CPU): against the estimate without the gradients, which do not exist yet at that peak
    (the loss's backward; the estimate keeps them, to be safe). The recipes of bench/memory_vs_estimate.py."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tools.shared.tiny_llama import peak_new_bytes

    arch = dict(layers=2, hidden=256, heads=4, kv_heads=2, ffn=688, vocab=8192)
    config = transformers.LlamaConfig(vocab_size=arch["vocab"], hidden_size=arch["hidden"], intermediate_size=arch["ffn"],
                                      num_hidden_layers=arch["layers"], num_attention_heads=arch["heads"],
                                      num_key_value_heads=arch["kv_heads"], tie_word_embeddings=False,
                                      attn_implementation="sdpa", use_cache=False)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    tokens = torch.randint(0, arch["vocab"], (2, 512))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "amp_bf16"):
            out = model(tokens, labels=tokens)
        out.loss.backward()

    peak, at = peak_new_bytes(step)
    p = MemoryParams(**arch, precision=precision, seq_len=512, micro_batch=2, kernels="eager", flash_attention=True,
                     activation_checkpointing="full" if checkpointing else "none")  # the CPU has an fp32 flash kernel
    parts = mm.breakdown(setup_from(p))[1]
    at_loss = sum(parts[k] for k in ("weight_copies", "activations", "logits", "loss_backward", "backward_working"))
    assert "log_softmax_backward" in at
    assert peak == pytest.approx(at_loss, rel=0.08), {k: int(v) for k, v in parts.items() if v}
