"""results_history — past results from the store; flags outlier nodes/GPUs and regressions.

Every tool run is stored with its host, GPUs, driver and versions (tools/engine/store.py). Runs are
comparable when they come from the same tool with the same parameters (ignoring ones like
timeouts). Among comparable runs this tool flags, by the one verdict rule (tools/shared/judging.py:
worse than the reference by more than max(margin, k x spread), margins in verdict_rules.toml):
  - an outlier: a host or GPU whose latest figure is worse than the median of the others' latest
    (one slow node in a fleet); spread: the larger of the measured one and the others' own;
  - a regression: a host or GPU whose latest figure is worse than the median of its own earlier runs;
    spread: the larger of the measured one and those earlier runs' own.
When the reference values spread past the rule's widest threshold nothing is flagged, and the answer
says the comparison was inconclusive. Figures without a rule use `threshold_pct` (default 10%).

The answer lists the rows it found (id, time, tool, host, verdict, figure, first finding); `result_id`
shows one stored result whole: its verdict, every finding and next step, and its fields.

By hand:
    mleng run results_history --tool matmul_bench
    mleng run results_history --gpu GPU-5f3c --since-days 30
    mleng run results_history --result-id 42
"""

import dataclasses
import datetime
import statistics
import time

from .engine.spec import SELF_EVIDENT, Field, Params, Record, Result, ToolFailure, ToolSpec
from .engine.store import count, count_bad_times, headlines, history, stored_result
from .shared.judging import FigureRule, compare, is_inconclusive, relative_spread, rule_for


class ResultsHistoryParams(Params):
    tool: str = Field("", max_length=64, description="A tool name; empty: all.")
    host: str = Field("", max_length=255, json_schema_extra=SELF_EVIDENT, description="Empty: all.")
    gpu: str = Field("", max_length=128, description="GPU name, UUID or serial contains this.")
    since_days: float = Field(90, gt=0, le=3650, json_schema_extra=SELF_EVIDENT, description="Last N days.")
    limit: int = Field(20, ge=1, le=500, description="Rows, newest first.")
    offset: int = Field(0, ge=0, le=10_000_000, description=(
        "Skip this many newest rows (paging)."))
    threshold_pct: float | None = Field(None, gt=0, le=90, description=(
        "Override the margin, %."))
    result_id: int | None = Field(None, ge=1, description=(
        "One stored result, whole (id from a listing)."))


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
    headline: str | None = Field(None, description="Its first finding (cut at 300 characters).")


class Flag(Record):
    kind: str = Field(description="outlier | regression")
    tool: str = Field(description="Tool.")
    machine: str = Field(description="Host (and GPU) flagged.")
    metric: str = Field(description="Figure compared.")
    value: float = Field(description="Its latest value.")
    reference: float = Field(description="Median of the others (outlier) or of its own past (regression).")
    worse_by_pct: float = Field(description="How much worse than the reference, %.")
    threshold_pct: float = Field(0.0, description="The deficit it had to exceed: max(margin, k x spread), %.")
    result_id: int = Field(description="Result id of the flagged run.")


class StoredResult(Record):
    whole_fields = ("result", "params")      # where an answer's `not_shown` sends the model: never cut here

    id: int = Field(description="Result id.")
    tool: str = Field(description="Tool.")
    started: str | None = Field(None, description="Start time, UTC ISO 8601.")
    host: str | None = Field(None, description="Host.")
    job_id: str | None = Field(None, description="The background job (job_status handle) that ran it, if any.")
    params: dict = Field(default_factory=dict, description="Its parameters.")
    result: dict = Field(default_factory=dict, description="The result as stored (secrets redacted).")


class ResultsHistoryResult(Result):
    shown: StoredResult | None = Field(None, description="With result_id: that stored result.")
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


def iso_time(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat(timespec="seconds")


def history_row(r: dict, headline: str | None = None) -> HistoryRow | None:
    """The row as answered; None for a stored row that cannot be one (written by hand or by an old bug)."""
    try:
        return HistoryRow(id=r["id"], tool=r["tool"], host=r["host"], machine=machine_key(r), started=iso_time(r["started"]),
                          gpu=(r["gpu_names"] or [None])[0], verdict=r["verdict"], metric=r["metric_name"],
                          value=r["metric_value"], headline=headline)
    except (TypeError, ValueError, OverflowError, OSError):   # pydantic's ValidationError is a ValueError
        return None


FALLBACK_MARGIN = 0.10   # figures with no rule in verdict_rules.toml


def rule_of(metric: str, higher_is_better: bool, threshold_pct: float | None) -> FigureRule:
    """The figure's verdict rule (margin overridden when asked); a plain margin for figures without one."""
    try:
        rule = rule_for(metric)
    except ToolFailure:
        rule = FigureRule(figure=metric, unit="", better="higher" if higher_is_better else "lower",
                          margin=FALLBACK_MARGIN, k=3.0, spread=0.0, source="results_history fallback")
    return dataclasses.replace(rule, margin=threshold_pct / 100) if threshold_pct else rule


def judged(kind: str, r: dict, others: list[float], rule: FigureRule, machine: str, tool: str,
           inconclusive: list[str]) -> Flag | None:
    """The rule on one latest figure against a reference set; None when fine or inconclusive."""
    if is_inconclusive(others, rule):
        inconclusive.append(f"{tool} {r['metric_name']} {kind} on {machine}: reference values spread "
                            f"{relative_spread(others):.1%}, too widely to judge")
        return None
    ref = statistics.median(others)
    breach = compare(r["metric_value"], rule, {kind: ref}, spread=max(rule.spread, relative_spread(others)))
    if not breach:
        return None
    return Flag(kind=kind, tool=tool, machine=machine, metric=r["metric_name"], value=r["metric_value"], reference=ref,
                worse_by_pct=round(100 * breach[0].deficit, 1), threshold_pct=round(100 * breach[0].threshold, 1),
                result_id=r["id"])


def find_flags(rows: list[dict], higher_is_better: dict[str, bool], threshold_pct: float | None = None,
               inconclusive: list[str] | None = None) -> list[Flag]:
    """Pure: outliers and regressions among rows (newest first) that carry a metric_value."""
    inconclusive = [] if inconclusive is None else inconclusive
    groups: dict[tuple, dict[str, list[dict]]] = {}
    for r in rows:
        if r.get("metric_value") is None or not isinstance(r.get("metric_name"), str):
            continue
        groups.setdefault((r["tool"], r["params_key"]), {}).setdefault(machine_key(r), []).append(r)
    flags = []
    for (tool, _), by_machine in groups.items():
        latest = {m: runs[0] for m, runs in by_machine.items()}
        first = next(iter(latest.values()))
        rule = rule_of(first["metric_name"], higher_is_better.get(tool, True), threshold_pct)
        if len(latest) >= 3:  # an outlier needs at least two others to be compared with
            for m, r in latest.items():
                others = [o["metric_value"] for k, o in latest.items() if k != m]
                flags.append(judged("outlier", r, others, rule, m, tool, inconclusive))
        for m, runs in by_machine.items():
            if len(runs) >= 3:  # latest vs the median of at least two earlier runs
                flags.append(judged("regression", runs[0], [o["metric_value"] for o in runs[1:]], rule, m, tool,
                                    inconclusive))
    return [f for f in flags if f]


ANALYSED_ROWS = 5000   # newest rows the outlier and regression rules look at
ROWS_IN_TEXT = 10      # rows the findings list one a line: the text answer shows what it counted



def row_sentence(row: HistoryRow) -> str:
    """One listed row as the answer's text says it: enough to pick one for result_id."""
    figure = f", {row.metric} {row.value:g}" if row.metric and row.value is not None else ""
    return (f"#{row.id} {row.started} {row.tool} on {row.host or '?'}: {row.verdict or 'no verdict'}{figure}"
            + (f" - {row.headline}" if row.headline else ""))


def show_one(result_id: int) -> ResultsHistoryResult:
    """One stored result, its own findings and next steps first, as it answered when it ran."""
    row = stored_result(result_id)
    if row is None:
        raise ToolFailure(f"result_id: no stored result #{result_id} (ids come from a listing: call results_history "
                          "with tool, host or gpu)")
    started = iso_time(row["started"]) if isinstance(row["started"], (int, float)) else None
    result = row["result"]
    said = [str(f) for f in result.get("findings") or [] if isinstance(f, str)] if isinstance(result, dict) else []
    nxt = [str(n) for n in result.get("next") or [] if isinstance(n, str)][:20]
    head = (f"Result #{result_id}: {row['tool']} on {row['host'] or '?'} at {started or '?'}"
            # the engine's own background-job handle (engine/jobs.py), never a SLURM job id: a model read an
            # ssh pairwise run's handle as "SLURM job dd3aeb88..." (round 6, ssh-dead-host)
            + (f" (background job {row['job_id']})" if row.get("job_id") else "") + f", verdict {row['verdict'] or '?'}; "
            f"its {len(said)} finding(s) as stored follow.")
    shown = StoredResult(id=result_id, tool=row["tool"] or "?", started=started, host=row["host"], job_id=row["job_id"],
                         params=row["params"], result=result)
    return ResultsHistoryResult(verdict="info", findings=[head, *said], next=nxt, shown=shown)


def run(params: ResultsHistoryParams, progress) -> ResultsHistoryResult:
    from .engine.registry import registry

    if params.result_id is not None:
        return show_one(params.result_id)
    since = time.time() - params.since_days * 86400
    filters = dict(tool=params.tool or None, host=params.host or None, gpu=params.gpu or None, since=since)
    total = count(**filters)
    rows = history(**filters, limit=ANALYSED_ROWS)
    higher = {name: spec.higher_is_better for name, spec in registry().items()}
    inconclusive: list[str] = []
    flags = find_flags(rows, higher, params.threshold_pct, inconclusive)
    page = rows[params.offset:params.offset + params.limit] if params.offset + params.limit <= len(rows) else \
        history(**filters, limit=params.limit, offset=params.offset)
    firsts = headlines([r["id"] for r in page])
    out = [row for row in (history_row(r, firsts.get(r["id"])) for r in page) if row is not None]
    findings = [f"{total} stored result(s) match" + (f"; rows {params.offset + 1}-{params.offset + len(page)} shown"
                                                       if total > len(page) else "") + "."]
    if params.offset + len(page) < total:
        findings.append(f"Older rows: call again with offset={params.offset + len(page)}.")
    bad = count_bad_times(filters["tool"], filters["host"], filters["gpu"]) + len(page) - len(out)
    if bad:
        findings.append(f"{bad} stored row(s) left out: a start time that is not a time (text, or past 2100) "
                        "or a field of the wrong type.")
    if total > len(rows):
        findings.append(f"Outliers and regressions were judged on the newest {len(rows)} of them; narrow the "
                        "filters (tool, host, gpu, since_days) to judge older results.")
    for f in flags:
        findings.append(f"{f.kind.upper()}: {f.machine} {f.tool} {f.metric} = {f.value:g}, {f.worse_by_pct:g}% worse "
                        f"than {'the others' if f.kind == 'outlier' else 'its own past'} ({f.reference:g}; threshold "
                        f"{f.threshold_pct:g}%); result #{f.result_id}.")
    findings += [f"INCONCLUSIVE: {line}." for line in inconclusive[:10]]
    if out:   # the rows themselves, in the text an agent reads (result_id=N shows one whole)
        findings += ["Rows, newest first (result_id=N shows one whole):", *map(row_sentence, out[:ROWS_IN_TEXT])]
    if len(out) > ROWS_IN_TEXT:
        findings.append(f"… {len(out) - ROWS_IN_TEXT} more of these rows in `rows` (--json).")
    if not rows:
        findings[0] = ("No stored results match. Results are stored when tools run (CLI or server) with the same "
                       "MLENG_HOME.")
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
