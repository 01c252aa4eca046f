"""collective_bench pairwise: false-positive and miss rates on the namespace cluster, a CPU hog outside the nodes.

Issue 24's acceptance run for the pairwise pattern: scripts/cluster-local.sh at 8 nodes; one busy-looping
process in the head namespace (outside every node's cgroup) for the whole run; then
  healthy: --healthy pairwise runs over every node; a run that names any node or link is a false
           positive; inconclusive runs and suspects that the second measurement cleared are counted too;
  faulty:  --faulty runs with the LAST node's link rate-limited (tbf, --rate, on its eth0): a run that names
           that node and nothing else is a hit; one that names nothing or says inconclusive is a miss;
  spread:  the spread of healthy pairs' busbw each run measured (1.4826 x MAD / median): the figure behind
           pair_busbw_gbps_gloo in knowledge/data/verdict_rules.toml.
Holds /tmp/mln-cluster.session.lock for the whole run (as the test fixture does); the hog is killed, the
qdisc removed and the cluster stopped at the end. Root, Debian 12. Sizes are CPU-sized (32K..256K, gloo).

    python bench/pairwise_rates.py                         # 8 nodes, 5 healthy, 2 faulty (~30-60 min loaded)
    python bench/pairwise_rates.py --nodes 4 --healthy 3 --faulty 1 --group-deadline-s 120
"""

import argparse
import fcntl
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "cluster-local.sh"
SMALL = ["--backend", "gloo", "--nproc-per-node", "1", "--min-bytes", "32K", "--max-bytes", "256K", "--factor", "8",
         "--iters", "3", "--warmup", "1", "--pg-timeout-s", "30", "--json", "--no-plot", "--pattern", "pairwise"]


def cluster(*args: str) -> str:
    env = {**os.environ, "MLN_CLUSTER_SESSION": "held"}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, check=True, capture_output=True, text=True).stdout


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
    ap.add_argument("--json", help="write every run here too")
    args = ap.parse_args()
    bad = f"mln{args.nodes}"
    lock = open("/tmp/mln-cluster.session.lock", "w")
    fcntl.flock(lock, fcntl.LOCK_EX)
    hog, healthy, faulty = None, [], []
    try:
        env_lines = cluster("start", str(args.nodes))
        os.environ["SLURM_CONF"] = env_lines.split("SLURM_CONF=")[1].split()[0]
        if not args.no_hog:
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for i in range(args.healthy):
            healthy.append(one_run(args.nodes, args.group_deadline_s))
            print("HEALTHY", i, json.dumps(healthy[-1]), flush=True)
        netns = ["ip", "netns", "exec", bad, "tc", "qdisc"]
        subprocess.run(netns + ["add", "dev", "eth0", "root", "tbf", "rate", args.rate, "burst", "32kbit",
                                "latency", "400ms"], check=True)
        try:
            for i in range(args.faulty):
                faulty.append(one_run(args.nodes, args.group_deadline_s))
                print("FAULTY", i, json.dumps(faulty[-1]), flush=True)
        finally:
            subprocess.run(netns + ["del", "dev", "eth0", "root"], check=False)
    finally:
        if hog:
            hog.kill()
            hog.wait()
        cluster("stop")
        lock.close()
    false_pos = sum(bool(r.get("named")) for r in healthy)
    hits = sum(r.get("named") == [("node", [bad])] or r.get("named") == [["node", [bad]]] for r in faulty)
    spreads = sorted(r["spread"] for r in healthy if r.get("spread") is not None)
    print(f"\nRATES nodes={args.nodes} hog={'none' if args.no_hog else '1 core in the head namespace'}")
    print(f"  healthy runs: {len(healthy)}; naming a culprit (false positive): {false_pos}; inconclusive: "
          f"{sum(bool(r.get('inconclusive')) for r in healthy)}; suspects cleared by the second measurement: "
          f"{sum(len(r.get('unconfirmed') or []) for r in healthy)}; errors: {sum('error' in r for r in healthy)}")
    print(f"  faulty runs ({bad} at {args.rate}): {len(faulty)}; {bad} named alone: {hits}; missed: {len(faulty) - hits}")
    print(f"  false-positive rate {false_pos}/{len(healthy)}; miss rate {len(faulty) - hits}/{len(faulty)}")
    print(f"SPREAD of healthy pairs' busbw per run (1.4826 x MAD / median): {spreads}")
    print(f"WALL per run, s: healthy {[r['wall_s'] for r in healthy]}, faulty {[r['wall_s'] for r in faulty]}")
    if args.json:
        Path(args.json).write_text(json.dumps({"healthy": healthy, "faulty": faulty}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
