"""The GPU benchmark scripts' plumbing, on tiny CPU shapes (--cpu-smoke): they run end to end and write
the figures docs/benchmarks.md is built from. Their GPU figures come from the device machine."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(script: str, *args: str) -> str:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--cpu-smoke", *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.slow
def test_mamf_vs_grid_compares_search_and_grid_both_ways(tmp_path):
    # --budget 5 (the tool's least): the search is time-bound, and at the quick default of 30 s it kept a core busy
    # that long on an idle box; 5 s still runs its three phases and its finals, which the report is made of.
    out = _run("mamf_vs_grid.py", "--repeats", "1", "--skip-membw", "--budget", "5", "--json", str(tmp_path / "r.json"))
    summary = next(line for line in out.splitlines() if line.startswith("SUMMARY"))
    assert "best ratio" in summary and "sustained:" in summary and "both with their warm-ups" in summary
    report = json.loads((tmp_path / "r.json").read_text())
    search, grid = report["searches"][0], report["grid"]
    assert search["best_tflops"] > 0 and search["sustained_tflops"] > 0 and search["top_sustained"]
    assert grid["shapes"] == 27 and grid["top5_full_clock"] and grid["top5_sustained"] and grid["warmup_s"] >= 0


def test_clock_settle_remeasures_the_grid_two_ways(tmp_path):
    # --top 2: each shape re-measured is 2 x 150 matmuls; the default 10 re-measured all 8 shapes of the tiny grid
    # (the script 9.4 -> 5.5 CPU-s on this loaded 2-core box); two of the grid and the extra finalist still go both ways.
    _run("clock_settle.py", "--grid", "--rounds", "1", "--top", "2", "--json", str(tmp_path / "s.json"))
    report = json.loads((tmp_path / "s.json").read_text())
    assert {r["how"] for r in report["remeasure"]} == {"published", "settled"}
    assert {r["shape"] for r in report["remeasure"]} >= {"96x64x64"} and len(report["remeasure"]) == 2 * 3
    assert all(r["mean_tflops"] > 0 for r in report["remeasure"]) and len(report["grid"]["all_in_order"]) == 8


@pytest.mark.slow
def test_memory_vs_estimate_builds_the_model_and_estimates_each_recipe(tmp_path):
    """On the CPU it builds the model (transformers' Llama when importable) and runs the steps, with no
    GPU figures; the estimate side is the real memory_estimate call the GPU run compares against."""
    _run("memory_vs_estimate.py", "--json", str(tmp_path / "m.json"))
    rows = json.loads((tmp_path / "m.json").read_text())
    assert [(r["precision"], r["checkpointing"]) for r in rows] == [
        ("fp32", False), ("fp32", True), ("amp_bf16", False), ("amp_bf16", True)]
    assert all(r["estimate_parts_bytes"]["optimizer_states"] == 8 * r["params"] for r in rows)
    assert rows[1]["estimate_parts_bytes"]["activations"] < rows[0]["estimate_parts_bytes"]["activations"]


def test_agent_reading_cost_measures_a_checkout_and_compares_another():
    """The issue-27 figure: what the model reads first, here and in another checkout (here itself: ratio 1)."""
    from tools.engine.registry import registry

    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "agent_reading_cost.py"), "--json", "--before", str(ROOT)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    assert report["tools"] == len(registry()) and report["before"]["tools"] == len(registry())
    rows = report["rows"]
    assert report["total_model_reads"]["chars"] == sum(
        rows[n]["chars"] for n in ("SKILL.md", "tools/list (model view)", "server instructions"))
    assert rows["tools/list (model view)"]["chars"] < rows["tools/list (whole)"]["chars"]
    assert all(v == 1.0 for ratios in report["ratio"].values() for v in ratios.values())
