"""The per-node checks fleet_sweep runs, each through the existing tool's own run() (no copies).

Tools are found through the engine (load_spec imports only that tool's module): a tool never
imports another tool, and these run in the node's own process, which is already a child.

Each check returns a row (see aggregate.py): the tool's verdict and problems, the figures to compare
across nodes (per GPU where the tool measures per GPU), the versions to compare, and the tool's
full result and params so the parent can store it under that tool's name in the results store.
"""

from __future__ import annotations

import time
from collections.abc import Callable

CHECKS = ("env_report", "gpu_health", "cpu_probe", "matmul_bench", "memory_bandwidth_bench", "p2p_bandwidth",
          "storage_bench")
GPU_CHECKS = ("matmul_bench", "memory_bandwidth_bench", "p2p_bandwidth")
DEFAULT_CHECKS = ("env_report", "gpu_health", "cpu_probe", *GPU_CHECKS)


def _quiet(fraction: float, message: str) -> None:
    """The inner tools' own progress stays on the node: the sweep reports per check."""


def figure(name: str, value, unit: str, *, gpu: int | None = None, expected=None, higher_is_better=True) -> dict:
    return {"name": name, "value": value, "unit": unit, "gpu": gpu, "expected": expected,
            "higher_is_better": higher_is_better}


# When this node's part of the sweep must be over (time.monotonic()); node.py sets it from the job.
deadline: float | None = None


def set_deadline(at: float) -> None:
    global deadline
    deadline = at


def run_tool(name: str, **params) -> tuple[dict, dict]:
    """(params, result) of one tool's run here, both as plain dicts: through the runner like any call,
    so it takes the GPU locks and stops at its own timeout or at the sweep's deadline, whichever is
    first. Not stored here: the sweep stores the row under the node srun ran it on."""
    from ..engine.registry import load_spec
    from ..engine.runner import execute

    spec = load_spec(name)
    validated = spec.Params(**params)
    left = spec.timeout_s if deadline is None else max(1.0, min(spec.timeout_s, deadline - time.monotonic()))
    result = execute(spec, validated, _quiet, timeout_s=left, save=False)
    return validated.model_dump(mode="json"), result.model_dump(mode="json")


def check_env_report() -> dict:
    params, res = run_tool("env_report")
    versions = {"driver": res.get("driver"), "cuda": res.get("torch_cuda") or res.get("torch_hip"),
                "nccl": res.get("nccl"), "torch": res.get("torch"), "python": res.get("python")}
    versions.update({k: v for k, v in (res.get("env") or {}).items() if k.startswith("NCCL_")})
    return {"tool": "env_report", "params": params, "result": res, "versions": versions,
            "problems": res.get("warnings", [])}


def check_gpu_health() -> dict:
    params, res = run_tool("gpu_health")
    per_gpu = [{"gpu": g["index"], "verdict": g["verdict"], "problems": [_finding_text(p) for p in g["problems"]],
                "serial": g.get("serial"), "name": g["name"]} for g in res.get("gpus", [])]
    problems = [f"GPU {g['gpu']}: {p}" for g in per_gpu for p in g["problems"]]
    return {"tool": "gpu_health", "params": params, "result": res, "gpus": per_gpu, "problems": problems}


def _finding_text(problem) -> str:
    """gpu_health's problems are findings with an action ({"text", "action", ...}); older ones plain text."""
    if isinstance(problem, dict):
        action = problem.get("action")
        return problem.get("text", "") + (f" (action: {action})" if action and action != "none" else "")
    return str(problem)


def check_cpu_probe() -> dict:
    from .cpu_probe import measure

    res = measure()
    figures = [figure("matmul_gflops", res["matmul_gflops"], "GFLOP/s"),
               figure("copy_gbps", res["copy_gbps"], "GB/s")]
    return {"tool": "fleet_sweep", "params": {"check": "cpu_probe"}, "metric": "matmul_gflops",
            "result": {"verdict": "info", **res}, "figures": figures, "problems": []}


def check_matmul_bench() -> dict:
    params, res = run_tool("matmul_bench", mode="quick", all_gpus=True)
    expected = res.get("published_mamf_tflops")
    rows = res.get("gpus") or [{"device": 0, "mamf_tflops": res.get("mamf_tflops")}]
    figures = [figure("mamf_tflops", g.get("mamf_tflops"), "TFLOPS", gpu=g["device"], expected=expected)
               for g in rows]
    return {"tool": "matmul_bench", "params": params, "result": res, "figures": figures, "problems": []}


def check_memory_bandwidth_bench(gpu_count: int) -> dict:
    results, figures, params = [], [], {}
    for device in range(gpu_count):
        params, res = run_tool("memory_bandwidth_bench", device=device)
        results.append(res)
        figures.append(figure("copy_tbps", res.get("copy_tbps"), "TB/s", gpu=device))
    worst = min(results, key=lambda r: r.get("copy_tbps") or 0)
    return {"tool": "memory_bandwidth_bench", "params": params, "result": worst, "per_gpu_results": results,
            "figures": figures, "problems": []}


def check_p2p_bandwidth() -> dict:
    params, res = run_tool("p2p_bandwidth")
    figures = [figure("median_unidir_gbps", res.get("median_unidir_gbps"), "GB/s"),
               figure("min_unidir_gbps", res.get("min_unidir_gbps"), "GB/s")]
    return {"tool": "p2p_bandwidth", "params": params, "result": res, "figures": figures,
            "problems": [f"slow pair {p}" for p in res.get("flagged_pairs", [])]}


def check_storage_bench(path: str) -> dict:
    params, res = run_tool("storage_bench", path=path, size_mib=64, small_files=200, time_budget_s=30)
    figures = [figure("seq_read_mbps", res.get("seq_read_mbps"), "MB/s"),
               figure("seq_write_mbps", res.get("seq_write_mbps"), "MB/s"),
               figure("file_create_per_s", res.get("file_create_per_s"), "files/s")]
    return {"tool": "storage_bench", "params": params, "result": res, "figures": figures, "problems": []}


def plan(checks: list[str], gpu_count: int, storage_path: str | None) -> list[tuple[str, Callable[[], dict]]]:
    """The checks that apply on this node, in order: GPU checks need GPUs (p2p two of them)."""
    table = {"env_report": check_env_report, "gpu_health": check_gpu_health, "cpu_probe": check_cpu_probe,
             "matmul_bench": check_matmul_bench, "p2p_bandwidth": check_p2p_bandwidth,
             "memory_bandwidth_bench": lambda: check_memory_bandwidth_bench(gpu_count),
             "storage_bench": lambda: check_storage_bench(storage_path or "/tmp")}
    chosen = []
    for name in checks:
        if name in GPU_CHECKS and gpu_count < (2 if name == "p2p_bandwidth" else 1):
            continue
        chosen.append((name, table[name]))
    return chosen


def run_check(name: str, fn: Callable[[], dict]) -> dict:
    """One check as a row; a check that raises becomes a failed row, not a dead node."""
    t0 = time.time()
    try:
        row = fn()
        row["verdict"] = row["result"].get("verdict", "info")
    except Exception as exc:  # the node answers; its check failed, and says how
        row = {"tool": name, "params": {}, "result": {"verdict": "fail"}, "verdict": "fail",
               "problems": [f"{type(exc).__name__}: {exc}"[:300]]}
    row.update(check=name, started=t0, ended=time.time())
    return row
