"""mfu_calc: FLOPs per token by hand and against Megatron's formula, MFU/HFU, MAMF from the store, traps."""

import pytest
from pydantic import ValidationError

from tools import store
from tools._transformer_math import ModelParams, flops_per_token
from tools.harness import ToolFailure
from tools.mfu_calc import MfuParams, run


def mfu(**kw):
    return run(MfuParams(**kw), lambda f, m: None)


def test_six_n_by_hand():
    # 7e9 params x 6 = 42 GFLOP per token; 3000 tokens/s per GPU = 126 TFLOPS; H100 bf16 dense 989.4.
    r = mfu(params_b=7, tokens_per_s=24000, num_gpus=8, accelerator="h100")
    assert r.tokens_per_s_per_gpu == 3000
    assert r.flops_per_token == 42e9
    assert r.achieved_tflops_per_gpu == 126.0
    assert r.mfu_pct == pytest.approx(100 * 126 / 989.4, abs=0.01)
    assert r.mamf_utilisation_pct == pytest.approx(100 * 126 / 794.5, abs=0.01)  # published H100 MAMF


def test_llama2_7b_flops_with_attention_by_hand():
    # matmul params: 32 layers x (4 x 4096^2 + 3 x 4096 x 11008) + 32000 x 4096 (head) = 6,607,077,376
    # attention: 12 x 32 layers x 4096 (heads x head_dim) x 4096 tokens = 6,442,450,944
    r = mfu(model="llama-2-7b", seq_len=4096, tokens_per_s=1000, accelerator="h100")
    assert r.flops_per_token == 6 * 6_607_077_376 + 6_442_450_944
    causal = mfu(model="llama-2-7b", seq_len=4096, tokens_per_s=1000, accelerator="h100", attention_flops="causal")
    assert causal.flops_per_token == 6 * 6_607_077_376 + 6_442_450_944 / 2


def test_matches_megatron_formula_for_gpt3():
    # Narayanan et al. 2021 (arXiv 2104.04473): 72 L h^2 (1 + s/6h + V/12Lh) FLOPs per token, no recompute.
    arch = ModelParams(model="gpt3-175b").architecture()
    L, h, V, s = 96, 12288, 51200, 2048
    flops = flops_per_token(arch.matmul_params(), arch, s)
    assert flops.model == pytest.approx(72 * L * h * h * (1 + s / (6 * h) + V / (12 * L * h)), rel=1e-12)
    # With full recomputation the GPUs run 96 B s L h^2 (1 + s/6h + V/16Lh) per iteration.
    full = flops_per_token(arch.matmul_params(), arch, s, recompute="full")
    assert full.hardware == pytest.approx(96 * L * h * h * (1 + s / (6 * h) + V / (16 * L * h)), rel=1e-12)


def test_hfu_with_recompute():
    r = mfu(params_b=10, tokens_per_s=4000, accelerator="a100", activation_checkpointing="full")
    assert r.hfu_pct == pytest.approx(r.mfu_pct * 8 / 6, abs=0.02)
    assert any("HFU" in f for f in r.findings)


def test_measured_mamf_from_the_store_wins_over_published():
    prov = {"host": "n1", "gpu_names": ["NVIDIA H100 80GB HBM3"]}
    other = {"host": "n2", "gpu_names": ["NVIDIA A100-SXM4-80GB"]}
    store.save("matmul_bench", {"dtype": "bf16"}, {"verdict": "ok", "dtype": "bf16", "mamf_tflops": 700.0}, started=1, ended=2,
               provenance=prov, metric_name="mamf_tflops")
    store.save("matmul_bench", {"dtype": "bf16"}, {"verdict": "ok", "mamf_tflops": 999.0}, started=1, ended=2,
               provenance=other, metric_name="mamf_tflops")
    store.save("matmul_bench", {"dtype": "fp8"}, {"verdict": "ok", "dtype": "fp8", "mamf_tflops": 1400.0}, started=1, ended=2,
               provenance=prov, metric_name="mamf_tflops")
    r = mfu(params_b=7, tokens_per_s=3000, accelerator="h100")
    assert r.mamf_tflops == 700.0 and r.mamf_source.startswith("measured")
    assert r.mamf_utilisation_pct == pytest.approx(18.0, abs=0.01)


def test_impossible_throughput_fails_and_points_at_the_inputs():
    r = mfu(params_b=70, tokens_per_s=8000, accelerator="h100", tokens_per_s_scope="per_gpu", num_gpus=64)
    assert r.verdict == "fail" and r.mfu_pct > 100
    assert "Impossible" in r.findings[0]
    assert any("Trap" in f and "whole job" in f for f in r.findings)


def test_low_mfu_warns_and_offers_the_per_gpu_reading():
    r = mfu(params_b=8, tokens_per_s=3000, num_gpus=8, accelerator="h100")  # looks like a per-GPU figure
    assert r.verdict == "warn"
    trap = next(f for f in r.findings if f.startswith("Trap"))
    assert "per GPU" in trap and f"{r.mfu_pct * 8:.1f}%" in trap


def test_fp8_reports_both_peaks():
    r = mfu(params_b=8, tokens_per_s=5000, accelerator="h100", dtype="fp8")
    assert r.peak_tflops == 1978.9
    assert any("bf16 peak (989.4 TFLOPS)" in f for f in r.findings)


def test_dtype_the_gpu_lacks_is_a_clear_error():
    with pytest.raises(ToolFailure, match="no fp8 peak"):
        mfu(params_b=8, accelerator="a100", dtype="fp8")


def test_no_gpu_and_no_accelerator_is_a_clear_error():
    with pytest.raises(ToolFailure, match="pass accelerator"):
        mfu(params_b=8)


@pytest.mark.parametrize("kw", [{"params_b": 8, "tokens_per_s": 0}, {"params_b": 8, "num_gpus": 0},
                                {"params_b": -1}])
def test_bad_numbers_are_refused(kw):
    with pytest.raises(ValidationError):
        MfuParams(**kw)
