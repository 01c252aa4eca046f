"""fleet_sweep's answer: rows into the results store as they arrive, then the Result with findings."""

from __future__ import annotations

import time

from .result import Drain, Drift, FigureMedian, FleetSweepResult, GpuRow, Missing, NodeRow, Outlier
from .aggregate import aggregate, outlier_reason


def store_row(row: dict) -> int | None:
    """Save one node's check result under the tool that produced it, with the node's host and GPUs."""
    from ..engine.registry import load_spec
    from ..engine.store import save

    metric = row.get("metric")
    if metric is None and row.get("tool") not in (None, "fleet_sweep"):
        try:
            metric = load_spec(row["tool"]).metric
        except (ValueError, ImportError):
            metric = None
    try:
        return save(row.get("tool") or row["check"], row.get("params") or {}, row.get("result") or {},
                    started=row.get("started", time.time()), ended=row.get("ended", time.time()),
                    provenance=row.get("provenance") or {"host": row.get("node")}, metric_name=metric)
    except Exception:  # a full disk must not lose the sweep's answer; the row is still in the result
        return None


def node_rows(rows: list[dict], stored: dict) -> tuple[list[NodeRow], list[GpuRow]]:
    nodes, gpus = [], []
    for r in sorted(rows, key=lambda r: (r["node"], r["check"])):
        figs = r.get("figures") or []
        nodes.append(NodeRow(node=r["node"], host=r.get("host"), check=r["check"], verdict=r.get("verdict", "info"),
                             seconds=round(r.get("ended", 0) - r.get("started", 0), 2),
                             figures={f["name"]: f["value"] for f in figs if f.get("gpu") is None},
                             problems=r.get("problems", [])[:10], result_id=stored.get((r["node"], r["check"]))))
        gpus += [GpuRow(node=r["node"], gpu=f["gpu"], check=r["check"], figure=f["name"], value=f["value"],
                        unit=f.get("unit", ""), expected=f.get("expected")) for f in figs if f.get("gpu") is not None]
    return nodes, gpus


def drift_sentence(d: dict) -> str:
    parts = [f"{value} on {len(nodes)} node(s)" + (f" ({', '.join(nodes[:5])})" if len(nodes) <= 5 else "")
             for value, nodes in sorted(d["values"].items(), key=lambda kv: -len(kv[1]))]
    return f"Version drift: {d['field']} differs: " + "; ".join(parts) + "."


def findings_for(agg: dict, total: int, complete: int, wall_s: float, deadline_s: float) -> list[str]:
    lines = [f"{complete} of {total} node(s) answered every check in {wall_s:.1f} s (deadline {deadline_s:g} s)."]
    lines += [f"NOT ANSWERING: {node}: {why}." for node, why in sorted(agg["missing"].items())]
    lines += [f"FAILED: {r['node']} {r['check']}: " + "; ".join(r.get("problems", [])[:2]) for r in agg["failed"]]
    lines += [f"OUTLIER: {outlier_reason(o)}." for o in agg["outliers"]]
    lines += [drift_sentence(d) for d in agg["drift"]]
    if agg["drain"]:
        lines.append(f"Drain list: {', '.join(d['node'] for d in agg['drain'])} (commands in `drain`; not run).")
    lines.append(f"Rule: {agg['rule']}.")
    return lines


def build_result(params, target, got, stored: dict, wall_s: float) -> FleetSweepResult:
    rows = list(got.rows.values()) if got else []
    known = dict(target.skipped)
    if got:
        known.update({n: f"srun could not start its task: {why}" for n, why in got.failed_launch.items()})
    planned = got.planned if got else {}
    agg = aggregate(rows, target.nodes, planned, known, params.margin_pct)
    complete = len(target.nodes) - len(agg["missing"])
    node_list, gpu_list = node_rows(rows, stored)
    verdict = ("fail" if agg["missing"] or agg["failed"] else "warn" if agg["outliers"] or agg["drift"]
               else "ok" if rows else "info")
    result = FleetSweepResult(
        verdict=verdict, target=f"{target.kind} ({len(target.nodes)} nodes)", nodes_total=len(target.nodes),
        nodes_complete=complete, rows=node_list, gpus=gpu_list, rule=agg["rule"],
        medians=[FigureMedian(figure=k, median=round(v["median"], 4), count=v["count"], unit=v["unit"])
                 for k, v in agg["medians"].items()],
        outliers=[Outlier(node=o["node"], gpu=o.get("gpu"), figure=o["key"], value=o["value"], reference=o["reference"],
                          against=o["against"], worse_by_pct=o["worse_by_pct"]) for o in agg["outliers"]],
        drift=[Drift(**d) for d in agg["drift"]],
        not_answering=[Missing(node=n, reason=why) for n, why in sorted(agg["missing"].items())],
        drain=[Drain(**d) for d in agg["drain"]], launch_attempts=got.attempts if got else 0, wall_s=wall_s,
        findings=findings_for(agg, len(target.nodes), complete, wall_s, params.deadline_s),
        next=["results_history", "gpu_health", "collective_bench", "knowledge://orchestration/fleet-sweeps.md"])
    if params.plot and rows:
        result.plot_png, note = _plot(rows, agg, params, len(target.nodes))
        result.findings += [note] if note else []
    return result


def plot_target(params):
    """Where the PNG goes, checked (links, FIFOs, existing files, missing folders refused): called before
    the sweep so a bad plot_path fails in a millisecond, and again at the write."""
    from ..shared.safe_write import check_output, output_path, unique_name

    return check_output(output_path(params.plot_path, "plots", unique_name("fleet_sweep")),
                        overwrite=params.overwrite, field="plot_path")


def _plot(rows: list[dict], agg: dict, params, total: int) -> tuple[str | None, str | None]:
    """(the PNG's path, or None; why there is none when the write was refused)."""
    from ..engine.spec import ToolFailure
    from .aggregate import flatten_figures
    from .plot import draw

    try:
        return draw(flatten_figures(rows), agg["medians"], agg["outliers"], params.margin_pct, plot_target(params),
                    f"fleet_sweep: {total} nodes, outliers in red", overwrite=params.overwrite), None
    except ImportError:
        return None, None
    except ToolFailure as e:   # a link planted during the sweep: its answer outweighs its picture
        return None, f"No plot: {e}"
