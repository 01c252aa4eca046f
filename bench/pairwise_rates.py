"""collective_bench pairwise: false-positive and miss rates on the namespace cluster, a CPU hog outside the nodes.

Issue 24's acceptance run for the pairwise pattern: scripts/cluster-local.sh at 8 nodes; one busy-looping
process in the head namespace (outside every node's cgroup) for the whole run; then
  healthy: --healthy pairwise runs over every node; a run that names any node or link is a false
           positive; inconclusive runs and suspects that the second measurement cleared are counted too;
  faulty:  --faulty runs with the LAST node's link rate-limited (tbf, --rate, on its eth0): a run that names
           that node and nothing else is a hit; one that names nothing or says inconclusive is a miss;
  spread:  the spread of healthy pairs' busbw each run measured (1.4826 x MAD / median): the figure behind
           pair_busbw_gbps_gloo in knowledge/data/verdict_rules.toml.
Each run is a cluster session of its own (bench/cluster_session.py: lock, start, hog, fault, stop), so other
engineers' cluster tests run between two of ours; --record appends every run to a JSON-lines file, and the
rates are over the whole file: run it in pieces. Root, Debian 12. Sizes are CPU-sized (32K..256K, gloo).

    python bench/pairwise_rates.py --record /tmp/pairwise.jsonl --healthy 2 --faulty 0   # one piece (~5-10 min a run)
    python bench/pairwise_rates.py --summary /tmp/pairwise.jsonl                          # the rates so far
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from cluster_session import REPO, cluster_session, cpu_hog, host_load

SMALL = ["--backend", "gloo", "--nproc-per-node", "1", "--min-bytes", "32K", "--max-bytes", "256K", "--factor", "8",
         "--iters", "3", "--warmup", "1", "--pg-timeout-s", "30", "--json", "--no-plot", "--pattern", "pairwise"]


def one_run(n: int, deadline_s: float) -> dict:
    t0 = time.monotonic()
    proc = subprocess.run(["salloc", f"-N{n}", f"--nodelist=mln[1-{n}]", "--no-kill", "--time=60", sys.executable,
                           "-m", "tools.collective_bench", *SMALL, "--group-deadline-s", str(deadline_s)],
                          capture_output=True, text=True, cwd=REPO, timeout=n * 4 * (deadline_s + 60))
    out = proc.stdout
    if "{" not in out:
        return {"wall_s": round(time.monotonic() - t0, 1), "error": proc.stderr[-600:]}
    result = json.loads(out[out.index("{"):])
    iso = result.get("isolation") or {}
    return {"wall_s": round(time.monotonic() - t0, 1), "verdict": result["verdict"],
            "named": [(s["kind"], s["nodes"]) for s in iso.get("suspects", [])],
            "unconfirmed": [(s["kind"], s["nodes"]) for s in iso.get("unconfirmed", [])],
            "inconclusive": iso.get("inconclusive"), "spread": iso.get("spread"), "threshold": iso.get("threshold"),
            "rounds": iso.get("rounds"), "failed_groups": sum(g["status"] != "ok" for g in iso.get("groups", [])),
            "reference_gbps": iso.get("reference_busbw_gbps")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--healthy", type=int, default=5)
    ap.add_argument("--faulty", type=int, default=2)
    ap.add_argument("--rate", default="50mbit", help="the faulty node's link rate (tbf)")
    ap.add_argument("--group-deadline-s", type=float, default=150.0)
    ap.add_argument("--no-hog", action="store_true", help="no CPU hog in the head namespace")
    ap.add_argument("--record", help="append every run here (JSON lines); the rates are over the whole file")
    ap.add_argument("--summary", help="print the rates of a record file (no cluster)")
    args = ap.parse_args()
    if args.summary:
        return summary([json.loads(line) for line in Path(args.summary).read_text().splitlines() if line.strip()])
    runs = []
    for kind in ["healthy"] * args.healthy + ["faulty"] * args.faulty:
        with cluster_session(args.nodes) as cluster, cpu_hog(not args.no_hog):
            bad = cluster.nodes[-1]
            if kind == "faulty":
                cluster.on_node(bad, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", args.rate,
                                "burst", "32kbit", "latency", "400ms")
            load = host_load()
            run = {"kind": kind, "nodes": args.nodes, "bad": bad if kind == "faulty" else None, "rate": args.rate,
                   "hog": not args.no_hog, "load_before": load, **one_run(args.nodes, args.group_deadline_s),
                   "load_after": host_load()}
        runs.append(run)
        print(kind.upper(), json.dumps(run), flush=True)
        if args.record:
            with open(args.record, "a") as f:
                f.write(json.dumps(run) + "\n")
    return summary(runs if not args.record else
                   [json.loads(line) for line in Path(args.record).read_text().splitlines() if line.strip()])


def summary(runs: list[dict]) -> int:
    healthy = [r for r in runs if r["kind"] == "healthy"]
    faulty = [r for r in runs if r["kind"] == "faulty"]
    false_pos = sum(bool(r.get("named")) for r in healthy)
    hits = sum([list(x) for x in r.get("named") or []] == [["node", [r["bad"]]]] for r in faulty)
    spreads = sorted(r["spread"] for r in healthy if r.get("spread") is not None)
    print(f"\nRATES hog={'1 core in the head namespace' if all(r['hog'] for r in runs) else 'mixed/none'}; "
          f"nodes {sorted({r['nodes'] for r in runs})}")
    print(f"  healthy runs: {len(healthy)}; naming a culprit (false positive): {false_pos}; inconclusive: "
          f"{sum(bool(r.get('inconclusive')) for r in healthy)}; suspects cleared by the second measurement: "
          f"{sum(len(r.get('unconfirmed') or []) for r in healthy)}; errors: {sum('error' in r for r in healthy)}")
    print(f"  faulty runs (last node rate-limited): {len(faulty)}; that node named alone: {hits}; missed: {len(faulty) - hits}")
    print(f"  false-positive rate {false_pos}/{len(healthy)}; miss rate {len(faulty) - hits}/{len(faulty)}")
    print(f"SPREAD of healthy pairs' busbw per run (1.4826 x MAD / median): {spreads}")
    print(f"WALL per run, s: healthy {[r.get('wall_s') for r in healthy]}, faulty {[r.get('wall_s') for r in faulty]}")
    print(f"LOAD before each run: {[r['load_before'] for r in runs]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
