"""fleet_sweep's verdicts over the nodes' answers: pure functions on plain dicts, no I/O.

A node answer ("row") is what tools/fleet_sweep/node.py prints for one check on one node:
    {"node": "gpu-07", "check": "matmul_bench", "verdict": "ok", "problems": [...],
     "figures": [{"name": "mamf_tflops", "value": 712.3, "unit": "TFLOPS", "gpu": 0,
                  "expected": 745.0, "higher_is_better": true}], "versions": {...}}
The rules are stated in RULES and repeated in every finding, so a reader can check each verdict:
  * below the fleet median: a figure worse than the median of the same figure over every node (or
    every GPU, for per-GPU figures) by more than margin_pct, when at least MIN_PEERS values exist;
  * below the expected figure: a figure worse than the published expectation the check carries by
    more than margin_pct (only checks that have one: matmul_bench's published MAMF, for instance);
  * a check that failed on the node (its own verdict "fail", e.g. gpu_health's uncorrectable ECC).
Memory and time are linear in the rows: fine at thousands of nodes (tested at 4096).
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from ..engine.printable import shell_word

MIN_PEERS = 3
RULES = ("outlier: worse than the fleet median of the same figure by more than {margin:g}% (needs >= "
         f"{MIN_PEERS} nodes or GPUs with that figure), or worse than its expected figure by more than "
         "{margin:g}%; a node is also drained when a check fails on it or it did not answer in time")
DRIFT_KEYS = ("driver", "cuda", "nccl", "torch", "python")


def figure_key(fig: dict) -> str:
    return f"{fig['check']}.{fig['name']}"


def flatten_figures(rows: list[dict]) -> list[dict]:
    """One dict per (node, check, figure[, gpu]) with the node and check folded in."""
    return [{**fig, "node": r["node"], "check": r["check"]} for r in rows for fig in r.get("figures", [])]


def fleet_medians(figures: list[dict]) -> dict[str, dict]:
    """figure key -> {"median", "count", "unit", "higher_is_better"} over every node (and GPU)."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for fig in figures:
        if fig.get("value") is not None:
            groups[figure_key(fig)].append(fig)
    return {key: {"median": statistics.median(f["value"] for f in figs), "count": len(figs),
                  "unit": figs[0].get("unit", ""), "higher_is_better": figs[0].get("higher_is_better", True)}
            for key, figs in groups.items()}


def worse_by_pct(value: float, reference: float, higher_is_better: bool) -> float:
    if not reference:
        return 0.0
    sign = 1 if higher_is_better else -1
    return sign * (reference - value) / abs(reference) * 100


def find_outliers(figures: list[dict], medians: dict[str, dict], margin_pct: float) -> list[dict]:
    """Every figure breaking a rule: {"node", "gpu", "key", "value", "reference", "against", "worse_by_pct"}."""
    out = []
    for fig in figures:
        value = fig.get("value")
        if value is None:
            continue
        key, higher = figure_key(fig), fig.get("higher_is_better", True)
        stats = medians[key]
        refs = []
        if stats["count"] >= MIN_PEERS:
            refs.append(("fleet median", stats["median"]))
        if fig.get("expected"):
            refs.append(("expected", fig["expected"]))
        for against, ref in refs:
            pct = worse_by_pct(value, ref, higher)
            if pct > margin_pct:
                out.append({"node": fig["node"], "gpu": fig.get("gpu"), "key": key, "value": value,
                            "unit": fig.get("unit", ""), "reference": ref, "against": against,
                            "worse_by_pct": round(pct, 1)})
    return out


def version_drift(versions_by_node: dict[str, dict]) -> list[dict]:
    """Fields whose value differs between nodes: {"field", "values": {value: [nodes]}, "odd_nodes"}.

    A field missing on some nodes counts as the value "(unset)" there (an NCCL_* variable set on
    only some nodes is drift too). odd_nodes: the nodes outside the most common value."""
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


def drain_command(node: str, reason: str) -> str:
    """The scontrol line an operator can run to drain the node (fleet_sweep never runs it)."""
    return f"scontrol update nodename={shell_word(node)} state=drain reason={shell_word('fleet_sweep: ' + reason[:200])}"


def outlier_reason(o: dict) -> str:
    where = f"{o['node']}" + (f" GPU {o['gpu']}" if o.get("gpu") is not None else "")
    return (f"{where} {o['key']} {o['value']:.4g} {o['unit']} is {o['worse_by_pct']:g}% below the "
            f"{o['against']} {o['reference']:.4g} {o['unit']}")


def drain_list(outliers: list[dict], failed_checks: list[dict], missing: dict[str, str]) -> list[dict]:
    """Per node to drain: {"node", "reasons": [...], "command"}; nodes sorted by name."""
    reasons: dict[str, list[str]] = defaultdict(list)
    for node, why in missing.items():
        reasons[node].append(f"did not answer: {why}")
    for row in failed_checks:
        reasons[row["node"]].append(f"{row['check']} failed: " + "; ".join(row.get("problems", [])[:2]))
    for o in outliers:
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


def aggregate(rows: list[dict], expected_nodes: list[str], planned: dict[str, list[str]],
              known_missing: dict[str, str], margin_pct: float) -> dict:
    """Everything fleet_sweep reports across nodes, from the rows that arrived in time."""
    figures = flatten_figures(rows)
    medians = fleet_medians(figures)
    outliers = find_outliers(figures, medians, margin_pct)
    failed = [r for r in rows if r.get("verdict") == "fail"]
    versions: dict[str, dict] = {}
    for r in rows:
        versions.setdefault(r["node"], {}).update(r.get("versions") or {})
    missing = unanswered(rows, expected_nodes, planned, known_missing)
    return {"medians": medians, "outliers": outliers, "drift": version_drift(versions),
            "failed": failed, "missing": missing, "drain": drain_list(outliers, failed, missing),
            "rule": RULES.format(margin=margin_pct)}
