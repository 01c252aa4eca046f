"""results_history — past results from the store; flags outlier nodes/GPUs and regressions.

Every tool run is stored with its host, GPUs, driver and versions (tools/store.py). Runs are
comparable when they come from the same tool with the same parameters (ignoring ones like
timeouts). Among comparable runs this tool flags:
  - an outlier: a host or GPU whose latest figure is worse than the median of the others' latest by
    more than `threshold_pct` (one slow node in a fleet);
  - a regression: a host or GPU whose latest figure is worse than the median of its own earlier runs.

By hand:
    python -m tools.results_history --tool matmul_bench
    python -m tools.results_history --gpu GPU-5f3c --since-days 30
"""

import datetime
import statistics
import time

from .engine.spec import Field, Params, Record, Result, ToolSpec
from .engine.store import count, query


class ResultsHistoryParams(Params):
    tool: str = Field("", max_length=64, description="Only this tool's results (a catalog name). Empty: all tools.")
    host: str = Field("", max_length=255, description="Only this host name. Empty: all hosts.")
    gpu: str = Field("", max_length=128, description="Only runs on a GPU whose name, UUID or serial contains this.")
    since_days: float = Field(90, gt=0, le=3650, description="Only results from the last N days.")
    limit: int = Field(20, ge=1, le=500, description="At most this many rows in `rows` (newest first).")
    threshold_pct: float = Field(10, gt=0, le=90, description="Flag figures worse than the reference by more than this, %.")


class HistoryRow(Record):
    id: int = Field(description="Result id.")
    tool: str = Field(description="Tool.")
    started: str = Field(description="Start time, UTC ISO 8601.")
    host: str | None = Field(None, description="Host.")
    machine: str = Field(description="Host, plus the GPU UUID for single-GPU runs.")
    gpu: str | None = Field(None, description="GPU model.")
    verdict: str | None = Field(None, description="The run's verdict.")
    metric: str | None = Field(None, description="Headline figure's name.")
    value: float | None = Field(None, description="Headline figure.")


class Flag(Record):
    kind: str = Field(description="outlier | regression")
    tool: str = Field(description="Tool.")
    machine: str = Field(description="Host (and GPU) flagged.")
    metric: str = Field(description="Figure compared.")
    value: float = Field(description="Its latest value.")
    reference: float = Field(description="Median of the others (outlier) or of its own past (regression).")
    worse_by_pct: float = Field(description="How much worse than the reference, %.")
    result_id: int = Field(description="Result id of the flagged run.")


class ResultsHistoryResult(Result):
    rows: list[HistoryRow] = Field(default_factory=list, description="Matching results, newest first.")
    flags: list[Flag] = Field(default_factory=list, description="Outliers and regressions found.")
    total_matching: int = Field(0, description="Results matching the filters (before `limit`).")


def machine_key(row: dict) -> str:
    """Host, plus the GPU's UUID when the run was pinned to one device."""
    device = (row.get("params") or {}).get("device")
    uuids = row.get("gpu_uuids") or []
    if isinstance(device, int) and 0 <= device < len(uuids):
        return f"{row['host']} {uuids[device]}"
    return row.get("host") or "?"


def find_flags(rows: list[dict], higher_is_better: dict[str, bool], threshold_pct: float) -> list[Flag]:
    """Pure: outliers and regressions among rows (newest first) that carry a metric_value."""
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for r in rows:
        if r.get("metric_value") is None:
            continue
        groups.setdefault((r["tool"], r["params_key"]), {}).setdefault(machine_key(r), []).append(r)
    flags = []
    for (tool, _), by_machine in groups.items():
        sign = 1 if higher_is_better.get(tool, True) else -1

        def worse_pct(value, ref):
            return round(sign * (ref - value) / abs(ref) * 100, 1) if ref else 0.0

        latest = {m: runs[0] for m, runs in by_machine.items()}
        if len(latest) >= 3:  # an outlier needs at least two others to be compared with
            for m, r in latest.items():
                ref = statistics.median(o["metric_value"] for k, o in latest.items() if k != m)
                pct = worse_pct(r["metric_value"], ref)
                if pct > threshold_pct:
                    flags.append(Flag(kind="outlier", tool=tool, machine=m, metric=r["metric_name"],
                                      value=r["metric_value"], reference=ref, worse_by_pct=pct, result_id=r["id"]))
        for m, runs in by_machine.items():
            if len(runs) >= 3:  # latest vs the median of at least two earlier runs
                ref = statistics.median(o["metric_value"] for o in runs[1:])
                pct = worse_pct(runs[0]["metric_value"], ref)
                if pct > threshold_pct:
                    flags.append(Flag(kind="regression", tool=tool, machine=m, metric=runs[0]["metric_name"],
                                      value=runs[0]["metric_value"], reference=ref, worse_by_pct=pct,
                                      result_id=runs[0]["id"]))
    return flags


ANALYSED_ROWS = 5000   # newest rows the outlier and regression rules look at


def run(params: ResultsHistoryParams, progress) -> ResultsHistoryResult:
    from .engine.registry import registry

    since = time.time() - params.since_days * 86400
    filters = dict(tool=params.tool or None, host=params.host or None, gpu=params.gpu or None, since=since)
    total = count(**filters)
    rows = query(**filters, limit=ANALYSED_ROWS)
    higher = {name: spec.higher_is_better for name, spec in registry().items()}
    flags = find_flags(rows, higher, params.threshold_pct)
    out = [HistoryRow(id=r["id"], tool=r["tool"], host=r["host"], machine=machine_key(r),
                      started=datetime.datetime.fromtimestamp(r["started"], datetime.UTC).isoformat(timespec="seconds"),
                      gpu=(r["gpu_names"] or [None])[0], verdict=r["verdict"], metric=r["metric_name"],
                      value=r["metric_value"]) for r in rows[:params.limit]]
    findings = [f"{total} stored result(s) match" + (f" ({len(out)} shown)." if total > len(out) else ".")]
    if total > len(rows):
        findings.append(f"Outliers and regressions were judged on the newest {len(rows)} of them; narrow the "
                        "filters (tool, host, gpu, since_days) to judge older results.")
    for f in flags:
        findings.append(f"{f.kind.upper()}: {f.machine} {f.tool} {f.metric} = {f.value:g}, {f.worse_by_pct:g}% worse "
                        f"than {'the others' if f.kind == 'outlier' else 'its own past'} ({f.reference:g}); result #{f.result_id}.")
    if not rows:
        findings = ["No stored results match. Results are stored when tools run (CLI or server) with the same "
                    "MLENG_HOME."]
    return ResultsHistoryResult(
        verdict="warn" if flags else "info", rows=out, flags=flags, total_matching=total, findings=findings,
        next=["gpu_health", "env_report"] if flags else [])


SPEC = ToolSpec(
    name="results_history",
    summary="Past results by tool, host or GPU; flags outlier nodes/GPUs and regressions against their own past.",
    description=(
        "Earlier mleng results (stored with host, GPU serial, driver, torch/CUDA/NCCL versions) by tool, "
        "host, GPU and time window: history and trends of any tool's runs (busbw from collective_bench, "
        "TFLOPS from matmul_bench, storage_bench throughput on /lustre, health verdicts), the outlier node or "
        "GPU whose latest figure is worse than the others', figures that regressed against their own past. "
        "Use for 'was all-reduce better last week', 'which node is the slow one', 'did the driver or NCCL "
        "upgrade slow us down'. Instant. Knows only runs made with mleng."),
    Params=ResultsHistoryParams, Result=ResultsHistoryResult, run=run, store=False,
)

if __name__ == "__main__":
    from .engine.cli import tool_main

    tool_main(SPEC)
