"""The per-node checks fleet_sweep runs, each through the existing tool itself (no copies).

Tools are found through the engine (load_spec imports only that tool's module): a tool never
imports another tool. Each runs through the runner as any call does (a child process, the GPU locks,
its own timeout, capped by the sweep's deadline); the CPU probe runs in the node process.

What a check contributes to the comparison across nodes is the tool's own typed contract
(`ToolSpec.sweep`, tools/engine/figures.py): the figures with their unit, better direction and
expected figure, read from the tool's typed Result in the tool's own code. This module reads no
other tool's result field by name beyond the node facts env_report and gpu_health exist to give.

Each check returns a row (see aggregate.py): the tool's verdict and problems (never empty when the
verdict is warn or fail), its figures, who else used the resource while it measured (`busy`, see
tools/shared/occupancy.py), and the tool's full result and params, which the parent stores under
that tool's name in the results store.

Adding a check (as nic_health was): give the tool a `sweep=SweepContract(...)` in its spec, a
verdict rule per figure in knowledge/data/verdict_rules.toml, and one entry in CHECK_TABLE below
(`tool_check("nic_health")`, with `occupancy=` a function saying who else uses what it measures).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from ..engine.figures import Measured
from ..shared.cgroup_cpu import CpuLimit, cpu_limit
from ..shared.process_origin import limit_words
from ..shared.occupancy import CpuWatch, Occupancy, gpu_occupancy

CHECKS = ("env_report", "gpu_health", "nic_health", "cpu_probe", "matmul_bench", "memory_bandwidth_bench",
          "p2p_bandwidth", "storage_bench")
GPU_CHECKS = ("matmul_bench", "memory_bandwidth_bench", "p2p_bandwidth")
NON_INVASIVE = ("env_report", "gpu_health", "nic_health")   # read state only: safe beside a user's running job
DEFAULT_CHECKS = ("env_report", "gpu_health", "nic_health", "cpu_probe", *GPU_CHECKS)
# nic_health's window in a sweep: long enough to see a flapping link change carrier, short beside the GPU checks.
NIC_WINDOW_S = 3.0
# The network stack env_report records: a plugin, OFED or firmware on some nodes only makes mixed pairs hang
# (NCCL #1634), so each is compared across nodes as drift.
NETWORK_STACK = ("nccl_net_plugin", "rdma_core", "kernel", "gpu_vbios", "container")
# Variables that change how collectives behave: drift in any of them between nodes is reported.
DRIFT_ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "CUDA_", "FI_", "UCX_")


def _quiet(fraction: float, message: str) -> None:
    """The inner tools' own progress stays on the node: the sweep reports per check."""


def figure_row(m: Measured) -> dict:
    """A contract figure as it travels to the parent (JSON)."""
    f = m.figure
    return {"name": f.name, "value": m.value, "unit": f.unit, "better": f.better, "gpu": m.gpu,
            "expected": m.expected, "group": m.group}


# When this node's part of the sweep must be over (time.monotonic()); node.py sets it from the job.
deadline: float | None = None


def set_deadline(at: float) -> None:
    global deadline
    deadline = at


def is_sweep_process(proc) -> bool:
    """Another node process of a sweep by the same user (namespace test clusters put several on one
    host): its load is the sweep's own, not another tenant's (occupancy counts its tool children too)."""
    return proc.uids().real == os.getuid() and any("fleet_sweep.node" in part for part in proc.cmdline())


def run_tool(name: str, **params):
    """(params as a dict, the tool's typed Result, its spec) of one tool's run here: through the runner
    like any call, so it takes the GPU locks and stops at its own timeout or at the sweep's deadline,
    whichever is first. Not stored here: the sweep stores the row under the node srun ran it on."""
    import threading

    from ..engine.registry import load_spec
    from ..engine.runner import Cancelled, execute

    spec = load_spec(name)
    validated = spec.Params(**params)
    left = spec.timeout_s if deadline is None else max(1.0, min(spec.timeout_s, deadline - time.monotonic()))
    # The timeout counts from the start of the tool's child; a wait for a GPU lock held by another
    # mleng run comes before it and ends only on cancel: cancel just after the timeout would pass.
    stop = threading.Event()
    cancel = threading.Timer(left + 0.5, stop.set)
    cancel.daemon = True
    cancel.start()
    try:
        result = execute(spec, validated, _quiet, timeout_s=left, cancel=stop, save=False)
    except Cancelled as exc:
        raise Cancelled(f"{name} stopped after {left:.0f} s, the time this node had left: {exc}") from None
    finally:
        cancel.cancel()
    return validated.model_dump(mode="json"), result, spec


def contract_row(name: str, params: dict, result, spec, busy: Occupancy | None = None) -> dict:
    """A row from a tool that declares a sweep contract: its figures, evidence and reasons."""
    contract = spec.sweep
    problems = contract.evidence(result) if contract else []
    if result.verdict in ("warn", "fail"):
        problems = problems + [f for f in result.findings if f not in problems]
    row = {"tool": name, "params": params, "result": result.model_dump(mode="json"), "problems": problems,
           "figures": [figure_row(m) for m in contract.measure(result)] if contract else []}
    if busy is not None:
        row["busy"] = busy.as_dict()
    return row


def inventory(gpu_count: int | None) -> dict:
    """What a node that lost a DIMM, a GPU or a NIC differs from its peers in."""
    import psutil

    nics = [n for n in os.listdir("/sys/class/net") if os.path.exists(f"/sys/class/net/{n}/device")] \
        if os.path.isdir("/sys/class/net") else []
    ib = os.listdir("/sys/class/infiniband") if os.path.isdir("/sys/class/infiniband") else []
    # nearest 4 GiB: identical nodes differ by a few MiB of kernel reservations, a lost DIMM by 8+ GiB
    return {"gpu_count": gpu_count, "cpu_count": os.cpu_count(),
            "host_memory_gib": int(round(psutil.virtual_memory().total / 2**30 / 4) * 4),
            "nic_count": len(nics), "infiniband_devices": len(ib)}


def check_env_report() -> dict:
    params, res, spec = run_tool("env_report")
    versions = {"driver": res.driver, "cuda": res.torch_cuda or res.torch_hip, "nccl": res.nccl,
                "torch": res.torch, "python": res.python}
    versions.update({k: v for k, v in res.env.items() if k.startswith(DRIFT_ENV_PREFIXES)})
    versions.update({k: getattr(res, k) for k in NETWORK_STACK})
    versions.update({f"nic_firmware {dev}": fw for dev, fw in res.nic_firmware.items()})
    row = contract_row("env_report", params, res, spec)
    row["problems"] = list(res.warnings) + [p for p in row["problems"] if p not in res.warnings]
    # The quota too, so a sweep that only reads state beside a live job sees a node capped apart (model round 11,
    # cl-ssh-throttled-rank: "neither env_report nor the sweep reports per-node cgroup CPU limits").
    return {**row, "versions": versions, "inventory": inventory(res.gpu_count), **cpu_quota_fields(own_cpu_limit())}


def own_cpu_limit() -> CpuLimit | None:
    """The tightest quota over this node's sweep process."""
    return cpu_limit(os.getpid())


def cpu_quota_fields(limit: CpuLimit | None) -> dict:
    """The quota, bound or not: cpu_quota "0.25 CPU" or "none" (compared across nodes) and cpu_quota_at, where it
    is set, whose and when written (said for a node apart: model round 11 saw "0.2 CPU on mln4" and asked where it
    came from)."""
    return {"cpu_quota": f"{limit.cpus:g} CPU" if limit else "none",
            "cpu_quota_at": limit_words(limit)[:400] if limit else ""}


def check_gpu_health() -> dict:
    params, res, spec = run_tool("gpu_health")
    per_gpu = [{"gpu": g.index, "verdict": g.verdict, "serial": g.serial, "name": g.name,
                "problems": [p.text + (f" (action: {p.action})" if p.action and p.action != "none" else "")
                             for p in g.problems]} for g in res.gpus]
    row = contract_row("gpu_health", params, res, spec)
    row["problems"] = [f"GPU {g['gpu']}: {p}" for g in per_gpu for p in g["problems"]] or row["problems"]
    return {**row, "gpus": per_gpu}


def check_cpu_probe() -> dict:
    import torch  # noqa: F401  (about 3 CPU-seconds: imported before the window, which is the measurement only)

    from .cpu_probe import SWEEP, measure

    with CpuWatch(is_sweep_process) as watch:
        res = measure()
    busy = watch.occupancy
    row = {"tool": "fleet_sweep", "params": {"check": "cpu_probe"}, "metric": "matmul_gflops",
           "result": {"verdict": "info", **res}, "problems": [], "busy": busy.as_dict(),
           "figures": [figure_row(m) for m in SWEEP.measure(res)]}
    # The quota over this node's sweep process, bound or not: compared across nodes as inventory. Under a host so
    # loaded that every process gets less than its quota, the quota never binds and the counters below cannot see
    # it (round 9, cl-cpu-starved under the CPU hog: "busy" on every node, the quota unseen); the setting still differs.
    limit = own_cpu_limit()
    row.update(cpu_quota_fields(limit))
    if watch.own_limit_bound is not None and watch.own_limit_bound >= 0.05:
        # Where the quota is set and what it allows: what an admin undoes (model round 7, cl-cpu-starved: "it gives
        # neither the quota value nor where it is set").
        where = f": {limit.cpus:g} CPU allowed by cgroup {limit_words(limit)}" if limit else ""
        row["problems"].append(f"this node's own CPU limit (cgroup quota) bound in {watch.own_limit_bound:.0%} of "
                               f"scheduler periods while it measured{where}")
        row["own_cpu_limit_bound"] = round(watch.own_limit_bound, 3)
    return row


def tool_check(name: str, occupancy: Callable[..., Occupancy] | None = None, **params) -> Callable[[], dict]:
    """A tool with a sweep contract as a check; `occupancy(after=...)` says who else was on the resource
    it measures, just before and just after it (a holder that came or went mid-run counts)."""
    def check() -> dict:
        before = occupancy(after=False) if occupancy else None
        p, res, spec = run_tool(name, **params)
        return contract_row(name, p, res, spec, before.merge(occupancy(after=True)) if occupancy else None)
    return check


def gpus_in_use(after: bool) -> Occupancy:
    """Just after a benchmark NVML's utilisation still averages our own finished child's work: then only
    other processes on the GPU count."""
    return gpu_occupancy(ours=is_sweep_process, count_utilisation=not after)


def gpu_check(name: str, **params) -> Callable[[], dict]:
    return tool_check(name, gpus_in_use, **params)


def check_memory_bandwidth_bench(gpu_count: int) -> dict:
    """One run per GPU (the tool measures one device); figures of every GPU, the worst result stored."""
    rows = [gpu_check("memory_bandwidth_bench", device=device)() for device in range(gpu_count)]
    worst = min(rows, key=lambda r: next((f["value"] or 0 for f in r["figures"]), 0))
    busy = Occupancy()
    for r in rows:
        busy = busy.merge(Occupancy(**{**r["busy"], "holders": []}))
    return {**worst, "figures": [f for r in rows for f in r["figures"]], "per_gpu_results": [r["result"] for r in rows],
            "problems": [p for r in rows for p in r["problems"]], "busy": {**busy.as_dict(), "holders":
            [h for r in rows for h in r["busy"]["holders"]]}}


def plan(checks: list[str], gpu_count: int, storage_path: str | None) -> list[tuple[str, Callable[[], dict]]]:
    """The checks that apply on this node, in order: GPU checks need GPUs (p2p two of them)."""
    table = {"env_report": check_env_report, "gpu_health": check_gpu_health,
             "nic_health": tool_check("nic_health", sample_s=NIC_WINDOW_S), "cpu_probe": check_cpu_probe,
             "matmul_bench": gpu_check("matmul_bench", mode="quick", all_gpus=True),
             "p2p_bandwidth": gpu_check("p2p_bandwidth"),
             "memory_bandwidth_bench": lambda: check_memory_bandwidth_bench(gpu_count),
             "storage_bench": tool_check("storage_bench", path=storage_path or "/tmp", size_mib=64, small_files=200,
                                        time_budget_s=30)}
    chosen = []
    for name in checks:
        if name in GPU_CHECKS and gpu_count < (2 if name == "p2p_bandwidth" else 1):
            continue
        chosen.append((name, table[name]))
    return chosen


def run_check(name: str, fn: Callable[[], dict]) -> dict:
    """One check as a row; a check that raises becomes a failed row with its reason, not a dead node."""
    t0 = time.time()
    try:
        row = fn()
        row["verdict"] = row["result"].get("verdict", "info")
    except Exception as exc:  # the node answers; its check failed, and says how
        row = {"tool": name, "params": {}, "result": {"verdict": "fail"}, "verdict": "fail",
               "problems": [f"{type(exc).__name__}: {exc}"[:300] if str(exc) else f"{type(exc).__name__} (no message)"]}
    if row["verdict"] in ("warn", "fail") and not row.get("problems"):
        row["problems"] = [f"{name} answered {row['verdict']} without saying why (its result is stored: "
                           "results_history shows it)"]
    row.update(check=name, started=t0, ended=time.time())
    return row
