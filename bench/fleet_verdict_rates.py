"""fleet_sweep's false-positive and miss rates on the namespace cluster, with a CPU hog outside the nodes.

Issue 24's acceptance run: scripts/cluster-local.sh at 8 nodes; one busy-looping process in the head
namespace (this machine's own, outside every node's cgroup) for the whole run; then
  healthy: --healthy sweeps (cpu_probe; --checks adds others): a run that drains any node is a false
           positive; inconclusive runs, busy rows and suspects a re-run cleared are counted too;
  faulty:  --faulty sweeps with the last node's CPU capped at --quota-pct (10%) of a core (cgroup
           quota): a run that drains that node and only it is a hit; a run where its quota hardly
           bound (the host was busier than the cap) is counted apart, as the test suite skips it;
  spreads: each node's run-to-run spread (1.4826 x MAD / median) of each cpu_probe figure over the
           healthy runs, median over the nodes: the `spread` figures of knowledge/data/verdict_rules.toml.
Holds /tmp/mln-cluster.session.lock for the whole run (as the test fixture does); the hog is killed
and the cluster stopped at the end. Root, Debian 12.

    python bench/fleet_verdict_rates.py                          # 8 nodes, 10 healthy, 2 faulty (~10 min)
    python bench/fleet_verdict_rates.py --healthy 5 --faulty 3 --checks env_report gpu_health cpu_probe
"""

import argparse
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SCRIPT = REPO / "scripts" / "cluster-local.sh"
CHECKS = ["cpu_probe"]   # the check with figures on a CPU cluster; --checks adds env_report, gpu_health


def cluster(*args: str) -> str:
    env = {**os.environ, "MLN_CLUSTER_SESSION": "held"}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, check=True, capture_output=True, text=True).stdout


def throttled(node: str) -> tuple[int, int]:
    stat = dict(line.split() for line in Path(f"/sys/fs/cgroup/cpu/mln/{node}/cpu.stat").read_text().splitlines())
    return int(stat["nr_periods"]), int(stat["nr_throttled"])


def one_sweep(n: int, checks: list[str]) -> dict:
    from tools import fleet_sweep as fs

    t0 = time.monotonic()
    r = fs.SPEC.run(fs.SPEC.Params(partition="debug", nodes=n, checks=checks, deadline_s=600, plot=False),
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
    ap.add_argument("--healthy", type=int, default=10)
    ap.add_argument("--faulty", type=int, default=2)
    ap.add_argument("--checks", nargs="+", default=CHECKS)
    ap.add_argument("--quota-pct", type=int, default=10, help="the faulty node's CPU cap, %% of one core")
    ap.add_argument("--json", help="write every run here too")
    ap.add_argument("--from-json", help="print the summary of a saved run (no cluster)")
    args = ap.parse_args()
    if args.from_json:
        saved = json.loads(Path(args.from_json).read_text())
        return summary(args, saved["healthy"], saved["faulty"])
    bad = f"mln{args.nodes}"
    lock = open("/tmp/mln-cluster.session.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    home = tempfile.mkdtemp(prefix="mln-verdict-")   # the sweeps' stored rows; removed at the end
    os.environ["MLENG_HOME"] = home
    hog = None
    healthy, faulty = [], []
    try:
        env_lines = cluster("start", str(args.nodes))
        os.environ["SLURM_CONF"] = env_lines.split("SLURM_CONF=")[1].split()[0]
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for i in range(args.healthy):
            run = one_sweep(args.nodes, args.checks)
            healthy.append(run)
            print("HEALTHY", i, json.dumps({k: v for k, v in run.items() if k != "figures"}), flush=True)
        cluster("cpu", bad, str(args.quota_pct))
        try:
            for i in range(args.faulty):
                p0, t0 = throttled(bad)
                run = one_sweep(args.nodes, args.checks)
                p1, t1 = throttled(bad)
                run["quota_bound"] = round((t1 - t0) / max(1, p1 - p0), 2)
                faulty.append(run)
                print("FAULTY", i, json.dumps({k: v for k, v in run.items() if k != "figures"}), flush=True)
        finally:
            cluster("heal", bad)
    finally:
        if hog:
            hog.kill()
            hog.wait()
        cluster("stop")
        lock.close()
        shutil.rmtree(home, ignore_errors=True)
    return summary(args, healthy, faulty)


def summary(args, healthy: list[dict], faulty: list[dict]) -> int:
    bad = f"mln{args.nodes}"
    false_pos = sum(bool(r["drained"]) for r in healthy)
    # a faulty run can be judged only when the cap bound and the node and >= 3 peers were not busy
    bound = [r for r in faulty if r["quota_bound"] >= 0.5 and not r["figures"].get(bad, {}).get("busy")
             and sum(not f["busy"] for node, f in r["figures"].items() if node != bad) >= 3]
    hits = sum(r["drained"] == [bad] for r in bound)
    print(f"\nRATES nodes={args.nodes} hog=1 core in the head namespace")
    print(f"  healthy runs: {len(healthy)}; naming a culprit (false positive): {false_pos}; inconclusive: "
          f"{sum(bool(r['inconclusive']) for r in healthy)}; with busy rows: {sum(bool(r['busy_rows']) for r in healthy)}; "
          f"suspects cleared by the re-run: {sum(s[2] == 'not repeated' for r in healthy for s in r['suspects'])}")
    print(f"  faulty runs ({bad} at {args.quota_pct}% of a core): {len(faulty)}; judged (cap bound in >= 50% of "
          f"periods, not busy): {len(bound)}; "
          f"{bad} drained alone: {hits}; missed: {len(bound) - hits}")
    print(f"  false-positive rate {false_pos}/{len(healthy)}; miss rate {len(bound) - hits}/{len(bound)}")
    print(f"  the same healthy figures, runs naming a healthy node: {json.dumps(counterfactual(healthy))}")
    both = {"quiet": spreads(healthy, False), "all": spreads(healthy, True)}
    print(f"SPREAD per node over the healthy runs (1.4826 x MAD / median), median over nodes: not busy "
          f"{json.dumps(both['quiet'])}; busy included {json.dumps(both['all'])}")
    print(f"  busy cpu_probe rows: {sum(f['busy'] for r in healthy for f in r['figures'].values())} of "
          f"{sum(len(r['figures']) for r in healthy)}")
    if args.json:
        Path(args.json).write_text(json.dumps({"healthy": healthy, "faulty": faulty, "spreads": both}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
