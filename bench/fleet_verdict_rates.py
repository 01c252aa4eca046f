"""fleet_sweep's false-positive and miss rates on the namespace cluster (issue 24's acceptance runs).

scripts/cluster-local.sh at 8 nodes, one cluster session per sweep (bench/cluster_session.py: the lock is
taken per run, so other engineers' cluster tests run between two of ours); --record appends every run to a
JSON-lines file and the rates are over the whole file, so it runs in pieces:
  --fault none:    healthy sweeps (cpu_probe; --checks adds others); a run that drains any node is a false
                   positive; inconclusive runs, busy rows and suspects a re-run cleared are counted too;
  --fault cpu:     the last node's CPU capped at --quota-pct (10%) of a core (cgroup quota): a hit drains that
                   node and only it; a run where the cap hardly bound (< 50% of periods) is counted apart;
  --fault slurmd:  the last node's slurmd killed before the sweep: a hit drains that node and only it;
  --hog / --no-hog: one busy-looping process in the head namespace (outside every node) during the sweep,
                   or none (a quiet host: the miss rates);
  spreads: each node's run-to-run spread (1.4826 x MAD / median) of each cpu_probe figure over the healthy
           runs, median over the nodes: the `spread` figures of knowledge/data/verdict_rules.toml.
A link rate limit (tbf) is not here: no fleet_sweep check measures a link's rate (collective_bench pairwise
does: bench/pairwise_rates.py). Root, Debian 12.

    python bench/fleet_verdict_rates.py --record /tmp/fleet.jsonl --fault none --hog --runs 5
    python bench/fleet_verdict_rates.py --record /tmp/fleet.jsonl --fault cpu --no-hog --runs 3
    python bench/fleet_verdict_rates.py --summary /tmp/fleet.jsonl
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from cluster_session import REPO, cluster_session, cpu_hog, host_load

sys.path.insert(0, str(REPO))
CHECKS = ["cpu_probe"]   # the check with figures on a CPU cluster; --checks adds env_report, gpu_health


def one_sweep(n: int, checks: list[str]) -> dict:
    from tools import fleet_sweep as fs

    t0 = time.monotonic()
    r = fs.SPEC.run(fs.SPEC.Params(partition="debug", nodes=n, checks=checks, deadline_s=240, plot=False),
                    lambda f, m: None)
    return {"wall_s": round(time.monotonic() - t0, 1), "verdict": r.verdict, "complete": r.nodes_complete,
            "drained": [d.node for d in r.drain], "busy_rows": len(r.busy),
            "inconclusive": [m.figure for m in r.medians if m.inconclusive],
            "suspects": [(o.node, o.figure, o.status) for o in r.outliers],
            "figures": {row.node: {**row.figures, "busy": bool(row.busy)} for row in r.rows if row.check == "cpu_probe"},
            "findings": [f for f in r.findings if f.startswith(("OUTLIER", "FAILED", "NOT ANSWERING", "INCONCLUSIVE"))]}


def spreads(runs: list[dict], include_busy: bool) -> dict[str, float | None]:
    """Median over nodes of each node's run-to-run spread (needs >= 3 runs of a node)."""
    from tools.shared.judging import relative_spread

    out = {}
    for figure in ("matmul_gflops", "copy_gbps"):
        per_node = {}
        for run in runs:
            for node, figs in run["figures"].items():
                if include_busy or not figs["busy"]:
                    per_node.setdefault(node, []).append(figs[figure])
        values = [relative_spread(v) for v in per_node.values() if len(v) >= 3]
        out[figure] = round(statistics.median(values), 4) if values else None
    return out


def counterfactual(runs: list[dict]) -> dict[str, int]:
    """Runs that would have named a healthy node from the same cpu_probe figures under (a) the rule
    before issue 24 (20% below the fleet median, busy or not) and (b) the one rule with busy figures
    judged too (first pass, before any re-run): what the busy exclusion and the re-run save."""
    from tools.fleet_sweep.aggregate import aggregate

    old = one_rule = 0
    for run in runs:
        rows = [{"node": node, "check": "cpu_probe", "verdict": "info", "busy": {"busy": False},
                 "figures": [{"name": name, "value": figs[name], "unit": "", "better": "higher", "gpu": None,
                              "expected": None, "group": ""} for name in ("matmul_gflops", "copy_gbps")]}
                for node, figs in run["figures"].items()]
        values = {name: [r["figures"][i]["value"] for r in rows] for i, name in enumerate(("matmul_gflops", "copy_gbps"))}
        medians = {name: statistics.median(v) for name, v in values.items() if len(v) >= 3}
        old += any(v < 0.8 * medians[name] for name, vs in values.items() if name in medians for v in vs)
        one_rule += bool(aggregate(rows, list(run["figures"]), {}, {})["outliers"])
    return {"old_20pct_rule": old, "one_rule_busy_judged_before_rerun": one_rule}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--fault", choices=["none", "cpu", "slurmd"], default="none")
    ap.add_argument("--hog", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--checks", nargs="+", default=CHECKS)
    ap.add_argument("--quota-pct", type=int, default=10, help="the faulty node's CPU cap, %% of one core")
    ap.add_argument("--record", help="append every run here (JSON lines); the rates are over the whole file")
    ap.add_argument("--summary", help="print the rates of a record file (no cluster)")
    args = ap.parse_args()
    if args.summary:
        return summary([json.loads(line) for line in Path(args.summary).read_text().splitlines() if line.strip()])
    runs = []
    for _ in range(args.runs):
        home = tempfile.mkdtemp(prefix="mln-verdict-")   # the sweeps' stored rows; removed after the run
        os.environ["MLENG_HOME"] = home
        try:
            with cluster_session(args.nodes) as cluster, cpu_hog(args.hog):
                run = faulted_sweep(cluster, args)
        finally:
            shutil.rmtree(home, ignore_errors=True)
        runs.append(run)
        print(args.fault.upper(), json.dumps({k: v for k, v in run.items() if k != "figures"}), flush=True)
        if args.record:
            with open(args.record, "a") as f:
                f.write(json.dumps(run) + "\n")
    return summary(runs if not args.record else
                   [json.loads(line) for line in Path(args.record).read_text().splitlines() if line.strip()])


def faulted_sweep(cluster, args) -> dict:
    bad = cluster.nodes[-1]
    load = host_load()
    if args.fault == "cpu":
        cluster.script("cpu", bad, str(args.quota_pct))
        p0, t0 = cluster.throttled(bad)
    elif args.fault == "slurmd":
        os.kill(cluster.slurmd_pid(bad), 9)
    run = one_sweep(args.nodes, args.checks)
    if args.fault == "cpu":
        p1, t1 = cluster.throttled(bad)
        run["quota_bound"] = round((t1 - t0) / max(1, p1 - p0), 2)
    return {"fault": args.fault, "bad": bad if args.fault != "none" else None, "hog": args.hog,
            "load_before": load, "load_after": host_load(), **run}


def summary(runs: list[dict]) -> int:
    for hog in (True, False):
        for fault in ("none", "cpu", "slurmd"):
            group = [r for r in runs if r["fault"] == fault and r["hog"] == hog]
            if group:
                print(f"\n{'HOG (1 core in the head namespace)' if hog else 'QUIET (no hog)'}, fault {fault}: "
                      f"{len(group)} runs; load before each: {[r['load_before'] for r in group]}")
                (healthy_rates if fault == "none" else fault_rates)(group)
    return 0


def healthy_rates(healthy: list[dict]) -> None:
    false_pos = sum(bool(r["drained"]) for r in healthy)
    print(f"  naming a culprit (false positive): {false_pos}/{len(healthy)}; inconclusive: "
          f"{sum(bool(r['inconclusive']) for r in healthy)}; with busy rows: {sum(bool(r['busy_rows']) for r in healthy)}; "
          f"suspects cleared by the re-run: {sum(s[2] == 'not repeated' for r in healthy for s in r['suspects'])}")
    print(f"  busy cpu_probe rows: {sum(f['busy'] for r in healthy for f in r['figures'].values())} of "
          f"{sum(len(r['figures']) for r in healthy)}")
    print(f"  the same healthy figures, runs naming a healthy node: {json.dumps(counterfactual(healthy))}")
    both = {"quiet": spreads(healthy, False), "all": spreads(healthy, True)}
    print(f"  SPREAD per node over the runs (1.4826 x MAD / median), median over nodes: not busy "
          f"{json.dumps(both['quiet'])}; busy included {json.dumps(both['all'])}")


def fault_rates(faulty: list[dict]) -> None:
    bad = faulty[0]["bad"]
    # a CPU-capped run can be judged only when the cap bound and >= 3 peers were not busy
    judged = [r for r in faulty if r["fault"] != "cpu" or (r["quota_bound"] >= 0.5 and sum(
        not f["busy"] for node, f in r["figures"].items() if node != bad) >= 3)]
    hits = sum(r["drained"] == [bad] for r in judged)
    wrong = sum(bool(set(r["drained"]) - {bad}) for r in faulty)
    print(f"  judged: {len(judged)} (CPU cap bound in >= 50% of periods, >= 3 peers not busy); {bad} drained alone: "
          f"{hits}; missed: {len(judged) - hits}; runs draining a healthy node too: {wrong}")
    print(f"  miss rate {len(judged) - hits}/{len(judged)}; verdicts {[r['verdict'] for r in faulty]}; "
          f"{bad} busy in {sum(r['figures'].get(bad, {}).get('busy', False) for r in faulty)} runs")


if __name__ == "__main__":
    sys.exit(main())
