"""fleet_sweep's answer: rows into the results store as they arrive, then the Result with findings."""

from __future__ import annotations

import collections
import time

from ..engine.printable import printable
from ..shared.occupancy import Holder
from .aggregate import aggregate, failure_reason, outlier_reason
from .result import (BelowExpected, Busy, Drain, Drift, FigureMedian, FleetSweepResult, GpuRow, Missing, NodeRow, Outlier,
                     RefusedEvents)
from .sweep import ended_reason


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
                             problems=r.get("problems", [])[:10], busy=busy_sentence(r) or None,
                             result_id=stored.get((r["node"], r["check"]))))
        gpus += [GpuRow(node=r["node"], gpu=f["gpu"], check=r["check"], figure=f["name"], value=f["value"],
                        unit=f.get("unit", ""), expected=f.get("expected"), group=f.get("group"))
                 for f in figs if f.get("gpu") is not None]
    return nodes, gpus


def busy_sentence(row: dict) -> str:
    busy = row.get("busy") or {}
    if not busy.get("busy"):
        return ""
    return busy.get("why") or "busy"


def holder_text(h: dict) -> str:
    """A node's holder (node.HolderOut, as it travelled) in the words the node would have used."""
    return Holder(pid=h["pid"], name=h.get("name", "?"), user=h.get("user"), gpu=h.get("gpu"),
                  used_mib=h.get("used_mib"), origin=h.get("origin")).sentence()


def stats_sentence(s: dict) -> str:
    return (f"{s['figure']}" + (f" [{s['group']}]" if s["group"] else "") + f": {s['count']} value(s)"
            + (f" ({s['busy_excluded']} busy left out)" if s["busy_excluded"] else "")
            + (f", median {s['median']:.4g} {s['unit']}" if s["median"] is not None else "")
            + f", spread {s['spread']:.1%}, threshold {s['threshold']:.1%}")


def drift_sentence(d: dict) -> str:
    parts = [f"{value} on {len(nodes)} node(s)" + (f" ({', '.join(nodes[:5])})" if len(nodes) <= 5 else "")
             for value, nodes in sorted(d["values"].items(), key=lambda kv: -len(kv[1]))]
    return f"Version drift: {d['field']} differs: " + "; ".join(parts) + "."


def quota_set_at(d: dict, where: dict[str, str]) -> str:
    """' Set at: mln4: /i1mln/mln4: cpu.cfs_quota_us 20000 / ..., written 3 min ago.' for a CPU quota apart; a
    node's own words, kept to one line so they cannot start a line of their own in the findings."""
    said = [f"{n}: {printable(where[n], newlines=False)}" for n in d["odd_nodes"] if n in where]
    return f" Set at: {'; '.join(said)}." if d["field"] == "cpu_quota" and said else ""


def how_far(not_judged: dict[str, str]) -> tuple[list[str], str]:
    """(the nodes, sorted; how far each got, the first clause of its reason, for up to 8 of them)."""
    nodes = sorted(not_judged)
    return nodes, "; ".join(f"{n}: {not_judged[n].split(';')[0]}" for n in nodes[:8]) + ("; ..." if len(nodes) > 8 else "")


def not_judged_findings(not_judged: dict[str, str], cut_short: str | None) -> list[str]:
    """One sentence for the nodes the deadline caught in a relaunch forced by other nodes: why they are
    not judged (the relaunch's story once), and how far each got."""
    if not not_judged:
        return []
    nodes, each = how_far(not_judged)
    return [f"NOT JUDGED (not drained): {len(nodes)} node(s) were still running when the deadline ended the relaunch, "
            f"and no check of theirs failed: {cut_short} ({each}). Not judged; sweep them "
            f"again (hosts={nodes[:8]}{' ...' if len(nodes) > 8 else ''}) to judge them."]


def fleet_late_findings(fleet_late: dict[str, str], total: int, complete: int, deadline_s: float) -> list[str]:
    """One sentence for the nodes caught by a deadline that most of the fleet missed: not judged, and what to
    change (the deadline, not the nodes)."""
    if not fleet_late:
        return []
    nodes, each = how_far(fleet_late)
    return [f"NOT JUDGED (not drained): {len(nodes)} node(s) answered only some checks, and so did most of the fleet "
            f"({complete} of {total} answered every check by the {deadline_s:g} s deadline): the deadline was short for "
            f"these nodes now (a loaded host, slow checks), which says nothing against one of them ({each}). "
            f"Sweep again with a longer deadline_s to judge them."]


def findings_for(agg: dict, total: int, complete: int, wall_s: float, deadline_s: float,
                 cut_short: str | None = None) -> list[str]:
    lines = [f"{complete} of {total} node(s) answered every check in {wall_s:.1f} s (deadline {deadline_s:g} s)."]
    lines += [f"NOT ANSWERING: {node}: {why}." for node, why in sorted(agg["missing"].items())]
    lines += not_judged_findings(agg["not_judged"], cut_short)
    lines += fleet_late_findings(agg["fleet_late"], total, complete, deadline_s)
    lines += [f"FAILED: {r['node']} {failure_reason(r)}" for r in agg["failed"]]
    lines += [f"BUSY (not judged, not drained): {r['node']} {r['check']}: {busy_sentence(r)}"
              + (f"; held by {', '.join(holder_text(h) for h in r['busy']['holders'][:3])}" if r["busy"].get("holders") else "")
              + "." for r in agg["busy"]]
    label = {"confirmed": "OUTLIER (confirmed by a re-run)", "not repeated": "NOT REPEATED (a re-run was within the rule; not drained)",
             "unconfirmed": "SUSPECT (not re-run; not drained)"}
    lines += [f"{label[o['status']]}: {outlier_reason(o)}." for o in agg["outliers"]]
    lines += [f"FLEET BELOW EXPECTED: {g['figure']}" + (f" [{g['group']}]" if g["group"] else "")
              + f" median {g['median']:.4g} {g['unit']} over {g['count']} value(s) is {g['worse_by_pct']:g}% below the "
              f"expected {g['expected']:.4g} {g['unit']}: a fleet-wide cause (clocks, power cap, driver, software), "
              "not one node." for g in agg["fleet_below_expected"]]
    lines += [f"INCONCLUSIVE: {stats_sentence(s)} > widest {s['rule'].widest:.0%}: the healthy figures spread too "
              "widely to name an outlier; repeat when the nodes are quiet." for s in agg["stats"].values() if s["inconclusive"]]
    groups = sorted({(s["figure"].split(".")[0], s["group"]) for s in agg["stats"].values() if s["group"]})
    if groups:
        lines.append("Compared within groups: " + "; ".join(f"{c} [{g}]" for c, g in groups) + ".")
    if agg["cpu_limited_fleet"]:
        lines.append(f"CPU LIMIT ON MOST NODES: the probe's own cgroup quota bound on {len(agg['cpu_limited_fleet'])} "
                     f"node(s) ({', '.join(agg['cpu_limited_fleet'][:5])}): a configuration of the fleet, not one node.")
    lines += [drift_sentence(d) for d in agg["drift"]]
    lines += ["Inventory " + drift_sentence(d)[len("Version "):] + quota_set_at(d, agg.get("cpu_quota_at") or {})
              for d in agg["inventory_drift"]]
    if agg["drain"]:
        lines.append(f"Drain list: {', '.join(d['node'] for d in agg['drain'])} (commands in `drain`; not run).")
    lines.append(f"Rule: {agg['rule']}.")
    return lines


def refused_rows(*steps) -> list[RefusedEvents]:
    """Refused node output of the sweep and of its confirming re-run, together."""
    refused = sum((step.refused for step in steps if step), collections.Counter())
    return [RefusedEvents(source=who, reason=why, count=n)
            for (who, why), n in sorted(refused.items(), key=lambda kv: (-kv[1], kv[0]))][:200]


def channel_findings(got) -> list[str]:
    """What the answer did not use, said: refused node output, rows of an aborted attempt."""
    if not got:
        return []
    lines = []
    if got.refused:
        total = sum(got.refused.values())
        worst = ", ".join(f"{n} from {who}: {why}" for (who, why), n in got.refused.most_common(3))
        lines.append(f"REFUSED: {total} line(s) or event(s) of node output were not believed ({worst}); see `refused`.")
    if got.attempts > 1:
        lines.append(f"srun aborted attempt 1 when a node refused its task; every row here is from attempt "
                     f"{got.attempts} ({got.set_aside} row(s) of the aborted attempt set aside, so no figure "
                     "is compared with one measured under other load).")
    return lines


def left_out_findings(target) -> list[str]:
    """The partition's nodes not swept because SLURM would not start a task there: said, never drained (SLURM
    has them out already), so "N nodes answered" is not read as the whole partition."""
    if not target.left_out:
        return []
    said = "; ".join(f"{node}: {why}" for node, why in sorted(target.left_out.items()))
    return [f"NOT SWEPT: {len(target.left_out)} node(s) of the partition are out of service in SLURM and were left "
            f"out: {said}. Find why (slurm_status; the node's console) before returning it."]


def drain_rows(drain: list[dict], target) -> list[dict]:
    """The drain list; hosts reached over SSH have no scontrol to name, so the line says what to do."""
    if target.kind != "ssh":
        return drain
    return [{**d, "command": f"# no SLURM: take {d['node']} out of service by hand (fleet_sweep runs nothing)"}
            for d in drain]


def build_result(params, target, got, stored: dict, wall_s: float, confirm=None, notes=()) -> FleetSweepResult:
    rows = list(got.rows.values()) if got else []
    known = dict(target.skipped)
    if got:
        known.update({n: ended_reason(how) for n, how in got.ended.items()})
        known.update({n: f"{got.launcher} could not start its task: {why}" for n, why in got.failed_launch.items()})
    planned = got.planned if got else {}
    confirm_rows = list(confirm.rows.values()) if confirm else None
    cut_short = got.relaunch.sentence() if got and got.relaunch and got.timed_out else None
    agg = aggregate(rows, target.nodes, planned, known, params.margin_pct, confirm_rows, cut_short)
    not_judged = {**agg["not_judged"], **agg["fleet_late"]}
    complete = len(target.nodes) - len(agg["missing"]) - len(not_judged)
    node_list, gpu_list = node_rows(rows, stored)
    confirmed = any(o["status"] == "confirmed" for o in agg["outliers"])
    inconclusive = any(s["inconclusive"] for s in agg["stats"].values())
    verdict = ("fail" if agg["missing"] or agg["failed"] or confirmed else
               "warn" if (agg["outliers"] or not_judged or agg["drift"] or agg["inventory_drift"] or agg["busy"] or inconclusive
                          or agg["fleet_below_expected"] or agg["cpu_limited_fleet"]) else "ok" if rows else "info")
    result = FleetSweepResult(
        verdict=verdict, target=f"{target.kind} ({len(target.nodes)} nodes)", nodes_total=len(target.nodes),
        nodes_complete=complete, rows=node_list, gpus=gpu_list, rule=agg["rule"],
        medians=[FigureMedian(figure=s["figure"], group=s["group"], median=s["median"], count=s["count"],
                              busy_excluded=s["busy_excluded"], unit=s["unit"], spread_pct=round(100 * s["spread"], 2),
                              threshold_pct=round(100 * s["threshold"], 2), expected=s["expected"],
                              inconclusive=s["inconclusive"]) for s in agg["stats"].values()],
        outliers=[Outlier(node=o["node"], gpu=o.get("gpu"), figure=o["key"], value=o["value"], reference=o["reference"],
                          against=o["against"], worse_by_pct=o["worse_by_pct"], threshold_pct=o["threshold_pct"],
                          group=o["group"], status=o["status"], confirm_value=o["confirm_value"]) for o in agg["outliers"]],
        busy=[Busy(node=r["node"], check=r["check"], why=busy_sentence(r),
                   holders=[holder_text(h) for h in r["busy"].get("holders", [])]) for r in agg["busy"]],
        below_expected=[BelowExpected(**{k: g[k] for k in ("figure", "group", "median", "expected", "worse_by_pct", "count")})
                        for g in agg["fleet_below_expected"]],
        drift=[Drift(**d) for d in agg["drift"]], inventory_drift=[Drift(**d) for d in agg["inventory_drift"]],
        not_answering=[Missing(node=n, reason=why) for n, why in sorted(agg["missing"].items())],
        not_judged=[Missing(node=n, reason=why) for n, why in sorted(not_judged.items())],
        drain=[Drain(**d) for d in drain_rows(agg["drain"], target)], launch_attempts=got.attempts if got else 0, wall_s=wall_s,
        rows_from_attempt=got.attempts if got else 0, refused=refused_rows(got, confirm),
        findings=[*notes, *findings_for(agg, len(target.nodes), complete, wall_s, params.deadline_s, cut_short),
                  *left_out_findings(target),
                  *channel_findings(got)],
        next=["results_history", "gpu_health", "collective_bench", "knowledge://orchestration/fleet-sweeps.md"])
    if target.left_out and result.verdict == "ok":
        result.verdict = "warn"                  # part of what was asked for is out of service
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
        return draw(flatten_figures(rows), agg["stats"], agg["outliers"], plot_target(params),
                    f"fleet_sweep: {total} nodes, outliers in red", overwrite=params.overwrite), None
    except ImportError as e:   # said, not swallowed: a missing plot with no reason cannot be diagnosed
        return None, f"No plot: {e.name or 'a module'} could not be imported ({e})."
    except ToolFailure as e:   # a link planted during the sweep: its answer outweighs its picture
        return None, f"No plot: {e}"
