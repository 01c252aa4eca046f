"""matmul_bench and memory_bandwidth_bench on a real GPU, through the runner (child process, GPU lock),
as users run them. `python -m pytest tests/gpu/test_compute_gpu.py -m gpu -s` prints FIGURE lines to
record in docs/benchmarks.md. About 4 minutes on one H200."""

import threading
import time

import pytest

from tools.engine.spec import ToolFailure
from tools.matmul_bench import SPEC as MATMUL
from tools.matmul_bench import MatmulBenchParams
from tools.memory_bandwidth_bench import SPEC as MEMBW
from tools.memory_bandwidth_bench import MemoryBandwidthParams
from tools.engine.runner import execute

pytestmark = pytest.mark.gpu

# Expected bands per accelerator id: bf16 MAMF (TFLOPS) and device copy (TB/s, read + write counted).
MAMF_BANDS = {"h200": (650, 900), "h100-sxm": (650, 900), "gh200-144gb": (650, 950), "a100-sxm": (220, 300)}
COPY_BANDS = {"h200": (3.0, 4.8), "h100-sxm": (2.3, 3.35), "a100-sxm": (1.4, 2.04)}


def _record():
    import torch

    from tools.shared.accelerators import match_accelerator

    return torch.cuda.get_device_name(0), match_accelerator(torch.cuda.get_device_name(0))


def _has_pynvml() -> bool:
    try:
        import pynvml  # noqa: F401
    except ImportError:
        print("\nWARNING: nvidia-ml-py (pynvml) is not installed: no clocks/power/throttle telemetry")
        return False
    return True


def _mamf_band(rec) -> tuple[float, float]:
    if rec and rec["id"] in MAMF_BANDS:
        return MAMF_BANDS[rec["id"]]
    if rec and rec.get("mamf_bf16_tflops"):
        return 0.8 * rec["mamf_bf16_tflops"], 1.15 * rec["mamf_bf16_tflops"]
    if rec:
        return 0.3 * rec["dense_tflops"]["bf16"], rec["dense_tflops"]["bf16"]
    return 1.0, 10_000.0


def test_quick_mamf_in_band_for_this_card():
    name, rec = _record()
    r = execute(MATMUL, MatmulBenchParams(), timeout_s=600)
    lo, hi = _mamf_band(rec)
    print(f"\nFIGURE matmul_bench quick bf16 on {name}: MAMF {r.mamf_tflops} TFLOPS at {r.best_shape}, "
          f"{r.shapes_tried} shapes, {r.wall_time_s} s (warm-up {r.warmup_s} s, phases {r.phase_s}), "
          f"finals {[(t.shape, t.mean_tflops) for t in r.top_shapes]}, efficiency {r.efficiency_pct}%, "
          f"vs published {r.vs_published_pct}%, telemetry {r.telemetry}, verdict {r.verdict}")
    assert lo <= r.mamf_tflops <= hi, r.findings
    assert r.verdict in ("ok", "warn", "info") and r.top_shapes[0].iterations == 100
    if _has_pynvml():
        assert r.telemetry.get("available") and r.telemetry["samples"] > 10
    assert r.wall_time_s < 150


def test_all_gpus_on_one_gpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    r = execute(MATMUL, MatmulBenchParams(all_gpus=True, time_budget_s=30, iterations=50, warmup=10), timeout_s=600)
    print(f"\nFIGURE matmul_bench all_gpus (1 GPU): {[g.model_dump() for g in r.gpus]}")
    assert len(r.gpus) == 1 and r.gpus[0].device == 0 and r.slow_gpus == []
    assert r.gpus[0].mamf_tflops == r.mamf_tflops and r.gpus[0].vs_median_pct == 0.0
    assert any("within 5% of the node median" in f for f in r.findings)


@pytest.mark.parametrize("dtype", ["fp16", "tf32", "fp32"])
def test_each_dtype_runs_and_stays_below_its_peak(dtype):
    name, _ = _record()
    r = execute(MATMUL, MatmulBenchParams(dtype=dtype, mode="shapes", m=[4096], n=[4096], k=[8192], iterations=20,
                                          warmup=5), timeout_s=300)
    print(f"\nFIGURE matmul_bench {dtype} 4096x4096x8192 on {name}: {r.mamf_tflops} TFLOPS, efficiency {r.efficiency_pct}%")
    assert r.mamf_tflops > 0 and r.shapes_tried == 1
    if r.efficiency_pct is not None:  # fp32 above its peak would mean TF32 was silently on
        assert r.efficiency_pct <= 105


def test_fp8_quick_or_clean_refusal():
    import torch

    name, rec = _record()
    params = MatmulBenchParams(dtype="fp8", time_budget_s=30, iterations=50, warmup=10)
    if torch.cuda.get_device_capability(0) < (8, 9) and not torch.version.hip:
        with pytest.raises(ToolFailure, match="fp8 matmul needs 8.9 or newer"):
            execute(MATMUL, params, timeout_s=300)
        return
    r = execute(MATMUL, params, timeout_s=300)
    print(f"\nFIGURE matmul_bench fp8 on {name}: MAMF {r.mamf_tflops} TFLOPS at {r.best_shape}, efficiency {r.efficiency_pct}%")
    if rec and "fp8" in rec["dense_tflops"]:
        assert 0.4 * rec["dense_tflops"]["fp8"] <= r.mamf_tflops <= rec["dense_tflops"]["fp8"]


def _gpu0_used_mib() -> float:
    """Memory in use on GPU 0 by every process (cudaMemGetInfo is device-wide; no NVML needed)."""
    import torch

    free, total = torch.cuda.mem_get_info(0)
    return (total - free) / 2**20


def test_cancel_mid_run_frees_the_gpu():
    import psutil

    baseline = _gpu0_used_mib()
    cancel, seen, outcome = threading.Event(), [], {}
    children: set[int] = set()

    def progress(fraction, message):
        seen.append(message)
        children.update(p.pid for p in psutil.Process().children(recursive=True))

    def target():
        try:
            outcome["result"] = execute(MATMUL, MatmulBenchParams(mode="thorough"), progress, cancel=cancel, timeout_s=600)
        except ToolFailure as e:
            outcome["error"] = e

    worker = threading.Thread(target=target)
    worker.start()
    deadline = time.monotonic() + 120
    while not any("screening" in m for m in seen) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert any("screening" in m for m in seen), f"the run never reached the search: {seen[-3:]}"
    during = _gpu0_used_mib()
    assert during > baseline + 500, f"the child should hold GPU memory while it measures ({baseline} -> {during} MiB)"
    cancel.set()
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert "cancelled" in str(outcome.get("error", "")).lower(), outcome
    deadline = time.monotonic() + 15
    while _gpu0_used_mib() > baseline + 256 and time.monotonic() < deadline:
        time.sleep(0.5)
    after = _gpu0_used_mib()
    print(f"\nFIGURE cancel: GPU memory {baseline:.0f} MiB before, {during:.0f} during, {after:.0f} after cancel")
    assert after <= baseline + 256, "a cancelled run must release its GPU memory"
    alive = [p for p in children if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"processes left after cancel: {alive}"


def test_memory_bandwidth_in_band():
    name, rec = _record()
    r = execute(MEMBW, MemoryBandwidthParams(), timeout_s=300)
    print(f"\nFIGURE memory_bandwidth_bench on {name}: copy {r.copy_tbps} TB/s (read {r.read_tbps}, write {r.write_tbps}) "
          f"= {r.copy_efficiency_pct}% of {r.spec_tbps}; h2d pinned {r.h2d_pinned_gbps} / pageable {r.h2d_pageable_gbps}, "
          f"d2h pinned {r.d2h_pinned_gbps} / pageable {r.d2h_pageable_gbps} GB/s; link Gen{r.pcie_gen} x{r.pcie_width} "
          f"(max Gen{r.pcie_max_gen} x{r.pcie_max_width}, {r.link_expected_gbps} GB/s); NUMA node {r.gpu_numa_node}; "
          f"verdict {r.verdict}")
    lo, hi = COPY_BANDS.get(rec["id"] if rec else None, (0.5 * (rec or {}).get("memory_bandwidth_tbps", 0.2), 12.0))
    assert lo <= r.copy_tbps <= hi, r.findings
    assert r.h2d_pinned_gbps and r.h2d_pinned_gbps > 3 and r.d2h_pinned_gbps > 3
    assert r.verdict != "fail", r.findings
