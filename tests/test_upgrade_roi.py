"""upgrade_roi: hand-computed costs, break-even, datasheet ratios, capability notes, refused inputs."""

import pytest
from pydantic import ValidationError

from tools.engine.spec import ToolFailure
from tools.upgrade_roi import RoiParams, run


def roi(**kw):
    return run(RoiParams(**kw), lambda f, m: None)


def test_measured_costs_by_hand():
    # 2.00/h at 1000 tok/s: 2 / 3.6e6 tokens = 0.5556 per Mtok; 3.00/h at 1800 tok/s: 3 / 6.48e6 = 0.4630.
    r = roi(current="h100", candidate="h200", current_price_per_gpu_hour=2.0, candidate_price_per_gpu_hour=3.0,
            current_tokens_per_s_per_gpu=1000, candidate_tokens_per_s_per_gpu=1800, train_tokens=1e9, num_gpus=8)
    assert r.speedup == 1.8 and r.speedup_basis == "measured"
    assert r.current_cost_per_mtok == pytest.approx(0.555556, abs=1e-6)
    assert r.candidate_cost_per_mtok == pytest.approx(0.462963, abs=1e-6)
    assert r.break_even_speedup == 1.5
    assert r.candidate_break_even_price == 3.6
    # 1e9 tokens / 8000 tok/s = 125000 s = 34.722 h; candidate 1e9 / 14400 = 69444 s = 19.290 h.
    assert r.current_hours_to_train == pytest.approx(34.722, abs=1e-3)
    assert r.candidate_hours_to_train == pytest.approx(19.290, abs=1e-3)
    assert r.current_cost_to_train == pytest.approx(34.722 * 8 * 2.0, abs=0.01)
    assert "cheaper per token" in r.findings[0] and "3.60" in r.findings[0]


def test_dearer_candidate_says_so():
    r = roi(current="h100", candidate="h200", current_price_per_gpu_hour=2.0, candidate_price_per_gpu_hour=4.0,
            speedup=1.3, current_tokens_per_s_per_gpu=1000)
    assert r.speedup_basis == "given"
    assert "dearer per token" in r.findings[0]
    assert r.candidate_cost_per_mtok > r.current_cost_per_mtok


def test_datasheet_estimates_pick_the_ratio_by_workload():
    compute = roi(current="h100", candidate="b200")
    assert compute.speedup == pytest.approx(2250 / 989.4, abs=1e-3)
    memory = roi(current="h100", candidate="h200", workload="memory_bound")
    assert memory.speedup == pytest.approx(4.8 / 3.35, abs=1e-3)
    assert memory.compute_ratio == 1.0  # same compute, faster memory
    assert any("measure before buying" in f for f in memory.findings)


def test_tokens_estimated_from_model_size():
    # 40% of 989.4 TFLOPS / (6 x 7e9 FLOP per token) = 9422.9 tokens/s per GPU.
    r = roi(current="h100", candidate="h200", params_b=7)
    assert r.current_tokens_per_s_per_gpu == pytest.approx(0.4 * 989.4e12 / 42e9, rel=1e-6)
    assert any("estimate" in f for f in r.findings)


def test_capability_notes_fp8_and_memory():
    r = roi(current="a100", candidate="h200")
    text = " ".join(r.findings)
    assert "runs fp8" in text and "memory" in text
    fp8 = roi(current="a100", candidate="h100", candidate_dtype="fp8")
    assert fp8.speedup == pytest.approx(1978.9 / 312, abs=1e-3)


def test_fair_measurement_advice_is_always_given():
    assert any("hold equal" in f for f in roi().findings)


@pytest.mark.parametrize("field", ["current_price_per_gpu_hour", "candidate_price_per_gpu_hour"])
@pytest.mark.parametrize("price", [0, -1.5])
def test_zero_or_negative_prices_are_refused(field, price):
    with pytest.raises(ValidationError, match=field):
        RoiParams(**{field: price})


def test_inconsistent_inputs_are_refused():
    with pytest.raises(ValidationError, match="needs current_tokens_per_s_per_gpu"):
        RoiParams(candidate_tokens_per_s_per_gpu=100)
    with pytest.raises(ValidationError, match="either speedup"):
        RoiParams(current_tokens_per_s_per_gpu=1, candidate_tokens_per_s_per_gpu=2, speedup=2)


def test_unknown_accelerator_and_missing_dtype():
    with pytest.raises(ToolFailure, match="known ids"):
        roi(candidate="quantum-9000")
    with pytest.raises(ToolFailure, match="no dense fp8"):
        roi(current="a100", candidate="h100", dtype="fp8")
