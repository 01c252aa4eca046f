"""fleet_sweep's verdicts over the nodes' answers: pure functions on plain dicts, no I/O.

A node answer ("row") is what tools/fleet_sweep/checks.py builds for one check on one node:
    {"node": "gpu-07", "check": "matmul_bench", "verdict": "ok", "problems": [...],
     "figures": [{"name": "mamf_tflops", "value": 712.3, "unit": "TFLOPS", "better": "higher", "gpu": 0,
                  "expected": 745.0, "group": "NVIDIA H200"}],
     "busy": {"busy": false, "why": "", "holders": [...]}, "versions": {...}, "inventory": {...}}
Every figure is judged by the one rule (tools/shared/judging.py, knowledge/data/verdict_rules.toml):
  * figures measured while others used the resource ("busy") are reported with their holders and kept
    out of medians, outliers and the drain list;
  * figures are compared within their group (GPU model for per-GPU figures, CPU model and count for
    node figures), never across groups;
  * a figure is a candidate outlier when worse than its group median (>= MIN_PEERS values) by more
    than max(margin, k x spread), spread the larger of the measured one and the group's own now; or
    worse than its expected figure by as much, when the group as a whole is not;
  * a group whose median is worse than the expected figure is one fleet-wide finding (a uniformly
    degraded fleet is not "ok"), not a drain list of every node;
  * a group whose healthy figures spread past the rule's widest threshold is "inconclusive", with the
    spread, and names no outlier;
  * a candidate goes on the drain list only when its check, re-run on that node (`confirm`), breaks
    the rule again; a check that failed outright (not busy) or a node that did not answer is drained,
    except a node still running when the deadline ended a relaunch that other nodes' launch failures
    forced (it ran out of their time, not its own), and a node that answered some of its checks when
    fewer than half the nodes answered all of theirs (the deadline was short for the whole fleet, as on
    a loaded host; lateness is only evidence against a node its peers were not late with): both "not
    judged", never drained. A node that answered nothing while others answered is still drained;
  * a node whose own cgroup CPU quota throttled the probe in OWN_LIMIT_BINDS of the periods or more is a
    failed check, drained with that evidence, when fewer than half the probed nodes are so limited (a
    node configured apart from its peers); on half or more it is one fleet-wide finding. This needs no
    median: on a host whose healthy figures spread too widely to judge (the namespace cluster under
    load: 29% between healthy nodes) the quota is still seen, in the kernel's own counters;
  * the quota over each node's probe, bound or not, is compared like an inventory count: on a host so loaded that
    no process gets its quota the counters cannot see it, and a node capped apart from its peers is still
    inventory drift (a setting; never a drain by itself).
Memory and time are linear in the rows: fine at thousands of nodes (tested at 4096).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import defaultdict

from ..engine.printable import shell_word
from ..shared.judging import FigureRule, compare, is_inconclusive, relative_spread, rule_for, threshold
from ..shared.occupancy import OWN_LIMIT_BINDS

MIN_PEERS = 3
RULES = ("a figure is bad when worse than its group's fleet median (needs >= {peers} values) or its expected "
         "figure by more than max(margin, k x run-to-run spread) of that figure (knowledge/data/verdict_rules.toml); "
         "busy figures are not judged; an outlier is drained only when a re-run on its node repeats it; a check "
         "that fails (not busy) or a node that does not answer is drained, unless the deadline ended a relaunch "
         "around other nodes' failures while it was still running, or it answered some checks when most nodes were "
         "late too (not judged)")
DRIFT_KEYS = ("driver", "cuda", "nccl", "torch", "python")


def figure_key(fig: dict) -> str:
    return f"{fig['check']}.{fig['name']}"


def is_busy(row: dict) -> bool:
    return bool((row.get("busy") or {}).get("busy"))


def flatten_figures(rows: list[dict]) -> list[dict]:
    """One dict per (node, check, figure[, gpu]) with the node, check and busy state folded in."""
    return [{**fig, "node": r["node"], "check": r["check"], "busy": is_busy(r)}
            for r in rows for fig in r.get("figures", []) if fig.get("value") is not None]


def rule_of(fig: dict, margin_pct: float | None) -> FigureRule:
    rule = rule_for(fig["name"])
    return dataclasses.replace(rule, margin=margin_pct / 100) if margin_pct else rule


def group_stats(figures: list[dict], margin_pct: float | None = None) -> dict[tuple[str, str], dict]:
    """(figure key, group) -> median, spread, threshold, expected, inconclusive, over the figures not busy."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for fig in figures:
        groups[(figure_key(fig), fig.get("group") or "")].append(fig)
    out = {}
    for (key, group), figs in groups.items():
        rule = rule_of(figs[0], margin_pct)
        quiet = [f["value"] for f in figs if not f["busy"]]
        spread_now = relative_spread(quiet)
        expected = [f["expected"] for f in figs if f.get("expected")]
        out[(key, group)] = {
            "figure": key, "group": group, "rule": rule, "unit": rule.unit, "better": rule.better,
            "count": len(quiet), "busy_excluded": len(figs) - len(quiet),
            "median": statistics.median(quiet) if quiet else None,
            "spread": spread_now, "threshold": threshold(rule, max(rule.spread, spread_now)),
            "expected": statistics.median(expected) if expected else None,
            "inconclusive": is_inconclusive(quiet, rule)}
    return out


def references(stats: dict, fleet_below_expected: bool) -> dict[str, float | None]:
    """What one figure is compared with: its group median (enough peers, not inconclusive), and its
    expected figure unless the whole group is below it (then that is the finding, not each node)."""
    refs = {}
    if stats["count"] >= MIN_PEERS and not stats["inconclusive"]:
        refs["fleet median"] = stats["median"]
    if stats["expected"] and not fleet_below_expected:
        refs["expected"] = stats["expected"]
    return refs


def fleet_gate(stats: dict) -> dict | None:
    """The group's median against the expected figure: a uniformly degraded fleet is not ok."""
    if stats["median"] is None or not stats["expected"] or stats["count"] < MIN_PEERS:
        return None
    breach = compare(stats["median"], stats["rule"], {"expected": stats["expected"]}, spread=stats["rule"].spread)
    return {"figure": stats["figure"], "group": stats["group"], "median": stats["median"], "expected": stats["expected"],
            "unit": stats["unit"], "worse_by_pct": round(100 * breach[0].deficit, 1), "count": stats["count"]} if breach else None


def find_outliers(figures: list[dict], stats: dict, degraded: set) -> list[dict]:
    """Candidates: every figure (not busy) breaking the rule against one of its references."""
    out = []
    for fig in figures:
        if fig["busy"]:
            continue
        s = stats[(figure_key(fig), fig.get("group") or "")]
        refs = references(s, (s["figure"], s["group"]) in degraded)
        for b in compare(fig["value"], s["rule"], refs, spread=max(s["rule"].spread, s["spread"])):
            out.append({"node": fig["node"], "gpu": fig.get("gpu"), "key": s["figure"], "name": fig["name"],
                        "check": fig["check"], "group": s["group"], "value": fig["value"], "unit": s["unit"],
                        "reference": b.reference, "against": b.against, "worse_by_pct": round(100 * b.deficit, 1),
                        "threshold_pct": round(100 * b.threshold, 1), "status": "unconfirmed", "confirm_value": None})
    return out


def confirm_outliers(outliers: list[dict], confirm_rows: list[dict] | None, stats: dict) -> None:
    """Mark each candidate "confirmed" when its check, re-run on its node, breaks the same reference again;
    "not repeated" when the re-run is within the rule; "unconfirmed" without a usable re-run."""
    if confirm_rows is None:
        return
    again = {(f["node"], figure_key(f), f.get("gpu")): f for f in flatten_figures(confirm_rows)}
    for o in outliers:
        fig = again.get((o["node"], o["key"], o["gpu"]))
        if fig is None or fig["busy"]:
            continue
        s = stats[(o["key"], o["group"])]
        o["confirm_value"] = fig["value"]
        repeated = compare(fig["value"], s["rule"], {o["against"]: o["reference"]}, spread=max(s["rule"].spread, s["spread"]))
        o["status"] = "confirmed" if repeated else "not repeated"


def version_drift(versions_by_node: dict[str, dict]) -> list[dict]:
    """Fields whose value differs between nodes: {"field", "values": {value: [nodes]}, "odd_nodes"}.

    A field missing on some nodes counts as the value "(unset)" there (a variable set on only some
    nodes is drift too). odd_nodes: the nodes outside the most common value."""
    fields = sorted({k for v in versions_by_node.values() for k in v})
    drift = []
    for name in fields:
        values: dict[str, list[str]] = defaultdict(list)
        for node, versions in sorted(versions_by_node.items()):
            values[str(versions.get(name) if versions.get(name) is not None else "(unset)")].append(node)
        if len(values) > 1:
            common = max(values, key=lambda v: len(values[v]))
            odd = sorted(n for v, ns in values.items() if v != common for n in ns)
            drift.append({"field": name, "values": dict(values), "odd_nodes": odd})
    return drift


def own_cpu_limits(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(rows of nodes limited apart from their peers: failed checks, rows of a fleet-wide limit: one finding)."""
    probed = [r for r in rows if r["check"] == "cpu_probe"]
    limited = [r for r in probed if (r.get("own_cpu_limit_bound") or 0) >= OWN_LIMIT_BINDS]
    return (limited, []) if 2 * len(limited) < len(probed) else ([], limited)


def drain_command(node: str, reason: str) -> str:
    """The scontrol line an operator can run to drain the node (fleet_sweep never runs it)."""
    return f"scontrol update nodename={shell_word(node)} state=drain reason={shell_word('fleet_sweep: ' + reason[:200])}"


def outlier_reason(o: dict) -> str:
    where = f"{o['node']}" + (f" GPU {o['gpu']}" if o.get("gpu") is not None else "")
    group = f" of {o['group']}" if o.get("group") else ""
    again = (f"; re-run: {o['confirm_value']:.4g} {o['unit']}" if o.get("confirm_value") is not None else "")
    return (f"{where} {o['key']} {o['value']:.4g} {o['unit']} is {o['worse_by_pct']:g}% worse than the "
            f"{o['against']}{group if o['against'] == 'fleet median' else ''} {o['reference']:.4g} {o['unit']} "
            f"(threshold {o['threshold_pct']:g}%{again})")


def failure_reason(row: dict) -> str:
    return f"{row['check']} failed: " + ("; ".join(row.get("problems", [])[:2]) or "no reason given")


def drain_list(outliers: list[dict], failed_checks: list[dict], missing: dict[str, str]) -> list[dict]:
    """Per node to drain: {"node", "reasons": [...], "command"}; nodes sorted by name."""
    reasons: dict[str, list[str]] = defaultdict(list)
    for node, why in missing.items():
        reasons[node].append(f"did not answer: {why}")
    for row in failed_checks:
        reasons[row["node"]].append(failure_reason(row))
    for o in outliers:
        if o["status"] == "confirmed":
            reasons[o["node"]].append(outlier_reason(o))
    return [{"node": node, "reasons": why, "command": drain_command(node, "; ".join(why))}
            for node, why in sorted(reasons.items())]


def unanswered(rows: list[dict], expected_nodes: list[str], planned: dict[str, list[str]],
               known: dict[str, str]) -> dict:
    """node -> why it is missing: `known` reasons first (launch failed, SLURM says down), then nodes
    with no row at all, or rows for only some of the checks they said they would run."""
    done: dict[str, set] = defaultdict(set)
    for r in rows:
        done[r["node"]].add(r["check"])
    missing = {}
    for node in expected_nodes:
        left = [c for c in planned.get(node, []) if c not in done[node]]
        if node in known and not (done[node] and not left):
            missing[node] = known[node]
        elif not done[node]:
            missing[node] = "no answer within the deadline"
        elif left:
            missing[node] = (f"answered {len(done[node])} of {len(planned[node])} checks within the deadline "
                             f"(not: {', '.join(left)})")
    return missing


def set_apart_cut_short(missing: dict[str, str], known: dict[str, str], failed: list[dict],
                        cut_short: str | None) -> tuple[dict[str, str], dict[str, str]]:
    """(missing, not judged): when the attempt the answer comes from was relaunched after other nodes'
    launch failures (`cut_short` says how much of the deadline that cost), a node still running at the
    deadline with no failure of its own ran out of someone else's time: not judged, never drained."""
    if not cut_short:
        return missing, {}
    failed_nodes = {r["node"] for r in failed}
    cut = {n: why for n, why in missing.items() if n not in known and n not in failed_nodes}
    return ({n: why for n, why in missing.items() if n not in cut},
            {n: f"{why}; still running when the deadline ended the relaunch ({cut_short}), and no check of its "
                "own failed" for n, why in cut.items()})


def set_apart_fleet_late(missing: dict[str, str], known: dict[str, str], failed: list[dict], rows: list[dict],
                         expected_nodes: list[str], set_apart: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(missing, not judged): when fewer than half the nodes answered every check, the deadline ran out for
    the fleet, not for one node: a node that answered some of its checks, with no failure of its own, is
    not judged. A node that answered none (frozen, dead) while others answered stays missing. `set_apart`:
    nodes already not judged (a cut relaunch), which did not answer every check either."""
    complete = [n for n in expected_nodes if n not in missing and n not in set_apart]
    if 2 * len(complete) >= len(expected_nodes):
        return missing, {}
    answered = {r["node"] for r in rows}
    failed_nodes = {r["node"] for r in failed}
    late = {n: why for n, why in missing.items() if n in answered and n not in known and n not in failed_nodes}
    return ({n: why for n, why in missing.items() if n not in late},
            {n: f"{why}; only {len(complete)} of {len(expected_nodes)} node(s) answered every check, so the "
                "deadline was short for the whole fleet, and no check of its own failed" for n, why in late.items()})


def aggregate(rows: list[dict], expected_nodes: list[str], planned: dict[str, list[str]],
              known_missing: dict[str, str], margin_pct: float | None = None,
              confirm_rows: list[dict] | None = None, cut_short: str | None = None) -> dict:
    """Everything fleet_sweep reports across nodes, from the rows that arrived in time. Without
    `confirm_rows` the outliers are candidates ("unconfirmed") and none is drained. `cut_short`: why the
    rows' attempt had less than the whole deadline (a relaunch after other nodes' launch failures)."""
    figures = flatten_figures(rows)
    stats = group_stats(figures, margin_pct)
    gates = [g for g in (fleet_gate(s) for s in stats.values()) if g]
    outliers = find_outliers(figures, stats, {(g["figure"], g["group"]) for g in gates})
    confirm_outliers(outliers, confirm_rows, stats)
    busy = [r for r in rows if is_busy(r)]
    limited_apart, limited_fleet = own_cpu_limits(rows)
    failed = [r for r in rows if (r.get("verdict") == "fail" or r in limited_apart) and not is_busy(r)]
    versions: dict[str, dict] = {}
    inventories: dict[str, dict] = {}
    for r in rows:
        versions.setdefault(r["node"], {}).update(r.get("versions") or {})
        if r.get("inventory"):
            inventories[r["node"]] = r["inventory"]
    missing, not_judged = set_apart_cut_short(unanswered(rows, expected_nodes, planned, known_missing), known_missing,
                                              failed, cut_short)
    missing, fleet_late = set_apart_fleet_late(missing, known_missing, failed, rows, expected_nodes, not_judged)
    # Only nodes whose probe or env_report ran say a quota (the same process, the same value): one that did not
    # answer is not "(unset)" drift.
    quotas = {r["node"]: {"cpu_quota": r["cpu_quota"]} for r in rows if r.get("cpu_quota")}
    quota_at = {r["node"]: r["cpu_quota_at"] for r in rows if r.get("cpu_quota") and r.get("cpu_quota_at")}
    inventory_drift = version_drift(inventories) + version_drift(quotas)
    quota_apart = {n: quota_at[n] for d in inventory_drift if d["field"] == "cpu_quota" for n in d["odd_nodes"]
                   if n in quota_at}
    return {"not_judged": not_judged, "fleet_late": fleet_late, "stats": stats, "outliers": outliers, "fleet_below_expected": gates, "busy": busy,
            "drift": version_drift(versions), "inventory_drift": inventory_drift, "cpu_quota_at": quota_apart,
            "failed": failed, "missing": missing, "drain": drain_list(outliers, failed, missing),
            "cpu_limited_fleet": sorted(r["node"] for r in limited_fleet),
            "rule": RULES.format(peers=MIN_PEERS) + (f"; margin overridden to {margin_pct:g}%" if margin_pct else "")}
