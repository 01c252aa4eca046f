"""fleet_sweep — run the per-node checks on every node at once and name the bad node, GPU or drift.

One srun step, one process per node (tools/fleet_sweep/node.py), each running the chosen checks
through the existing tools' own run(): env_report, gpu_health, nic_health, a CPU probe, and on GPU nodes
matmul_bench quick, memory_bandwidth_bench and p2p_bandwidth; storage_bench on a path when asked.
Rows stream back as they finish; the step is cancelled on every node at the deadline. The answer:
one row per node and check (and per GPU), the fleet median of every figure, outliers by the rule in
aggregate.py (the one rule of tools/shared/judging.py), busy resources, version and inventory drift,
nodes that did not answer, and a drain list with the scontrol command
for each node (never run). Every node's result is stored with its host and GPU serials.

By hand:
    salloc -N 16 mleng run fleet_sweep                         # the nodes of this allocation
    mleng run fleet_sweep --job-id 123456                      # a running job's nodes (--overlap)
    mleng run fleet_sweep --partition gpu --nodes 64 --deadline-s 600
    mleng run fleet_sweep --hosts 'gpu-[001-064]' --checks env_report gpu_health cpu_probe
"""

from __future__ import annotations

import os
import time
from typing import Literal

from ..engine.spec import SELF_EVIDENT, Field, Params, ToolFailure, ToolSpec
from .checks import CHECKS, DEFAULT_CHECKS, NON_INVASIVE
from .result import FleetSweepResult

Check = Literal[CHECKS]


class FleetSweepParams(Params):
    checks: list[Check] | None = Field(None, min_length=1, max_length=len(CHECKS), description=(
        "Default: all but storage_bench (storage_path adds it); GPU checks on GPU nodes. cpu_probe: CPU matmul, copy."))
    job_id: str | None = Field(None, pattern=r"^\d+(_\d+)?$", description=(
        "Sweep this RUNNING job's nodes (srun --overlap)."))
    partition: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-]+$", max_length=128, description=(
        "Sweep this partition in a job of our own."))
    nodes: int | None = Field(None, ge=1, le=100000, description=(
        "With partition: how many; default all reachable."))
    hosts: list[str] | None = Field(None, max_length=100000, description=(
        "Node names or hostlists ('gpu-[01-16]'); over ssh without SLURM; ['localhost']: here."))
    storage_path: str | None = Field(None, min_length=1, max_length=4096, description=(
        "Directory on every node for storage_bench."))
    deadline_s: float = Field(300, ge=10, le=3600, description=(
        "Nodes silent by then are named."))
    margin_pct: float | None = Field(None, gt=0, le=90, description=(
        "Override every figure's margin, %."))
    benchmarks_beside_job: bool = Field(False, description=(
        "With job_id: also benchmarks (they measure the job too: busy)."))
    plot: bool = Field(True, description="Per-node figures vs the median as a PNG.")
    plot_path: str | None = Field(None, max_length=4096, description=(
        "PNG path (relative: the caller's cwd); default under $MLENG_HOME/plots/."))
    overwrite: bool = Field(False, json_schema_extra=SELF_EVIDENT, description="Replace plot_path if it exists.")


def run(params: FleetSweepParams, progress) -> FleetSweepResult:
    from .report import build_result, plot_target
    from .sweep import sweep
    from .targets import resolve

    if params.plot:
        plot_target(params)    # a bad plot_path fails now, not after every node ran its checks
    target = resolve(params, dict(os.environ))
    checks, notes = choose_checks(params)
    job = {"checks": checks, "storage_path": params.storage_path, "deadline_s": params.deadline_s}
    launch = target.launch_nodes
    progress(0.0, f"{target.kind}: {len(target.nodes)} nodes, {len(launch)} launched; checks {', '.join(checks)}")
    stored, t0 = {}, time.monotonic()

    def on_row(row: dict) -> None:
        from .report import store_row

        stored[(row["node"], row["check"])] = store_row(row)
        done = len(stored) / max(1, len(launch) * len(checks))
        progress(min(done, 0.95), f"{row['node']}: {row['check']} {row.get('verdict')}")

    got = sweep(target, job, params.deadline_s, on_row) if launch else None
    confirm = confirm_suspects(params, target, got, job, params.deadline_s - (time.monotonic() - t0), progress)
    return build_result(params, target, got, stored, round(time.monotonic() - t0, 2), confirm, notes)


def choose_checks(params: FleetSweepParams) -> tuple[list[str], list[str]]:
    """The checks to run, and what the answer must say about the choice."""
    if params.job_id and not params.benchmarks_beside_job:
        asked = [c for c in (params.checks or []) if c not in NON_INVASIVE]
        if asked:
            raise ToolFailure(f"checks: {', '.join(asked)} would measure the resources job {params.job_id} is using "
                              "(a busy GPU reads like a broken one); run only " + ", ".join(NON_INVASIVE) + " beside a "
                              "running job, or set benchmarks_beside_job=true to run them anyway")
        checks = list(params.checks or NON_INVASIVE)
        return checks, [f"Beside running job {params.job_id}: only {', '.join(checks)} (they do not disturb it); "
                        "benchmarks were not run (benchmarks_beside_job=true runs them, and their figures come back busy)."]
    checks = list(params.checks or DEFAULT_CHECKS)
    if params.storage_path and "storage_bench" not in checks:
        checks.append("storage_bench")
    return checks, []


CONFIRM_MIN_S = 20   # less time than this left after the sweep: the suspects stay unconfirmed (and undrained)


def confirm_suspects(params, target, got, job: dict, left_s: float, progress):
    """Re-run each suspect's checks on its node (one more step over the suspects only), so that only
    what repeats is drained. None when there is nothing to confirm or no time left."""
    import dataclasses

    from .aggregate import aggregate
    from .sweep import sweep

    if not got or not got.rows:
        return None
    agg = aggregate(list(got.rows.values()), target.nodes, got.planned, {}, params.margin_pct)
    suspects = sorted({o["node"] for o in agg["outliers"]})
    if not suspects or left_s < CONFIRM_MIN_S:
        return None
    checks = sorted({o["check"] for o in agg["outliers"]}, key=job["checks"].index)
    progress(0.96, f"re-running {', '.join(checks)} on {len(suspects)} suspect node(s): {', '.join(suspects[:8])}")
    narrow = dataclasses.replace(target, nodes=suspects, skipped={})
    return sweep(narrow, {**job, "checks": checks, "deadline_s": left_s}, left_s, lambda row: None)


SPEC = ToolSpec(
    name="fleet_sweep",
    summary="Checks on every node at once (one srun step): outlier nodes/GPUs vs the fleet median, drift, "
            "silent nodes, drain list.",
    description=(
        "Use to find which node or GPU of many is bad (SLURM allocation, running job, partition or host "
        "list), before or during a large run: env_report, gpu_health, nic_health, a CPU probe and on GPU nodes "
        "matmul_bench, memory_bandwidth_bench and p2p_bandwidth on every node at once; one row per node and "
        "GPU, outliers vs the median per GPU model or the expected figure by one stated rule (re-run before "
        "drain), busy GPUs/CPUs with their holders (never drained), version and inventory drift, silent nodes, "
        "scontrol drain commands (never run). About the slowest node's time (1-2 min). Not for one node (the "
        "single tools) or links between nodes (collective_bench pattern='pairwise')."),
    Params=FleetSweepParams, Result=FleetSweepResult, run=run, runs="subprocess", job_python=True,
    read_only=False, destructive=True, idempotent=False, open_world=True, timeout_s=3700,
    spans_nodes=True,  # reaches the cluster itself: the engine's node= option does not apply
)
