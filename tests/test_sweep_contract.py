"""The typed contract between tools and fleet_sweep (tools/engine/figures.py): each tool declares the
figures it contributes, reads them from its own Result, and every figure has a verdict rule."""

import ast
from pathlib import Path

import pytest
from pydantic import create_model

from tools.engine.figures import Measured
from tools.engine.registry import registry
from tools.engine.spec import Result
from tools.fleet_sweep import checks
from tools.fleet_sweep.cpu_probe import SWEEP as CPU_SWEEP
from tools.shared.judging import rule_for

CONTRACTS = {name: spec.sweep for name, spec in registry().items() if spec.sweep is not None}


def test_the_sweep_checks_that_measure_declare_a_contract():
    assert {"matmul_bench", "memory_bandwidth_bench", "p2p_bandwidth", "storage_bench"} <= set(CONTRACTS)


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_every_declared_figure_has_its_rule_with_the_same_unit_and_direction(name):
    for fig in CONTRACTS[name].figures:
        rule = rule_for(fig.name)
        assert (rule.unit, rule.better) == (fig.unit, fig.better), (name, fig)


@pytest.mark.parametrize("name", sorted(CONTRACTS))
def test_every_contract_reads_its_own_result_type(name):
    """An empty Result of the tool goes through read(): every field it names exists (a rename fails here)."""
    spec = registry()[name]
    measured = CONTRACTS[name].measure(spec.Result())
    assert all(isinstance(m, Measured) and m.figure in CONTRACTS[name].figures for m in measured)
    CONTRACTS[name].evidence(spec.Result())


def test_a_renamed_result_field_raises_instead_of_becoming_none():
    spec = registry()["matmul_bench"]
    fields = {n: (f.annotation, f) for n, f in spec.Result.model_fields.items()
              if n not in Result.model_fields and n != "mamf_tflops"}
    renamed = create_model("Renamed", __base__=Result, burst_mamf_tflops=(float | None, 700.0), **fields)
    with pytest.raises(AttributeError, match="mamf_tflops"):
        CONTRACTS["matmul_bench"].measure(renamed())


def test_matmul_contract_carries_per_gpu_figures_expected_and_telemetry():
    spec = registry()["matmul_bench"]
    res = spec.Result(mamf_tflops=800.0, published_mamf_tflops=794.5, device="cuda:0", device_name="NVIDIA H200",
                      telemetry={"sm_clock_median_mhz": 1590, "power_mean_w": 640.2, "temperature_max_c": 61,
                                 "reasons_fraction": {"sw_power_cap": 0.98, "hw_slowdown": 0.0}},
                      gpus=[{"device": 0, "name": "NVIDIA H200", "mamf_tflops": 800.0, "sustained_tflops": 760.0},
                            {"device": 1, "name": "NVIDIA H200", "mamf_tflops": 700.0, "sustained_tflops": 690.0}],
                      slow_gpus=[1])
    got = {(m.figure.name, m.gpu): m for m in CONTRACTS["matmul_bench"].measure(res)}
    assert got[("mamf_tflops", 1)].value == 700.0 and got[("mamf_tflops", 1)].expected == 794.5
    assert got[("sustained_tflops", 0)].value == 760.0 and got[("mamf_tflops", 0)].group == "NVIDIA H200"
    assert got[("sm_clock_mhz", 0)].value == 1590 and got[("temperature_c", 0)].value == 61
    evidence = CONTRACTS["matmul_bench"].evidence(res)
    assert "GPU 1 more than 5% below the node median" in evidence and "sw_power_cap 98%" in evidence[1]


def test_an_undeclared_figure_is_refused():
    from tools.engine.figures import Figure, SweepContract

    declared, other = Figure("a", "s", "lower"), Figure("b", "s", "lower")
    with pytest.raises(ValueError, match="'b' was read but not declared"):
        SweepContract(figures=(declared,), read=lambda r: [Measured(other, 1.0)]).measure(None)


def test_cpu_probe_declares_its_figures_with_rules():
    for fig in CPU_SWEEP.figures:
        assert rule_for(fig.name).better == fig.better


def test_fleet_sweep_reads_no_other_tools_result_field_by_string():
    """checks.py gets typed Results from run_tool and reads their attributes; no res["x"] / res.get("x")."""
    tree = ast.parse(Path(checks.__file__).read_text())
    by_key = [node.lineno for node in ast.walk(tree)
              if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "res"
              or isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "res"]
    assert by_key == []


def test_the_gpu_spread_script_runs_its_plumbing_on_a_cpu(tmp_path):
    import json
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, str(root / "bench" / "verdict_spreads_gpu.py"), "--cpu-smoke", "--repeats", "3",
                           "--json", str(tmp_path / "s.json")], capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "SPREAD copy_tbps" in proc.stdout
    assert len(json.loads((tmp_path / "s.json").read_text())["copy_tbps"]["values"]) == 3
