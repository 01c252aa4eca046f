"""fleet_sweep wall time at 1, 2, 4 and 8 namespace nodes (scripts/cluster-local.sh): does it follow the
slowest node or the sum of the nodes?

For each node count: start the cluster, run fleet_sweep over the partition `--repeats` times with
(a) the light check gpu_health only (launch and collection cost) and (b) the CPU checks env_report,
gpu_health, cpu_probe; print wall time, the slowest node's check time (sum of its checks), the slowest
node's own span (its first check's start to its last check's end, from the stored rows' times: the nodes
share this host's clock), wall / that span, when the first and the last node started their checks (s after
the call), and the sum over all nodes. Holds /tmp/mln-cluster.session.lock (as the test fixture does) for the whole run.
Root, Debian 12; the cluster is stopped at the end.

`--launchers srun ssh`: the same nodes as a host list (hosts=["mln[1-N]"]) swept by srun and over SSH
(an sshd per node, scripts/cluster-local.sh sshd), alternated in each repeat, in one run.

    python bench/fleet_sweep_walltime.py                 # 1 2 4 8 nodes, 2 repeats
    python bench/fleet_sweep_walltime.py --nodes 1 8 --repeats 1 --json walltime.json
    python bench/fleet_sweep_walltime.py --nodes 8 --launchers srun ssh --checks cpu
"""

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
SCRIPT = REPO / "scripts" / "cluster-local.sh"
from tools.evals.drills.cluster import SESSION_LOCK  # noqa: E402  (the instance's, MLN_CLUSTER_INSTANCE)
CHECK_SETS = {"light": ["gpu_health"], "cpu": ["env_report", "gpu_health", "cpu_probe"]}


def cluster(*args: str) -> str:
    env = {**os.environ, "MLN_CLUSTER_SESSION": "held"}
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, check=True, capture_output=True, text=True).stdout


def one_sweep(n: int, checks: list[str], launcher: str = "partition") -> dict:
    from tools import fleet_sweep as fs

    os.environ.pop("MLENG_TRANSPORT", None)
    where = {"partition": "debug", "nodes": n} if launcher == "partition" else {"hosts": [f"mln[1-{n}]"]}
    if launcher == "ssh":
        os.environ["MLENG_TRANSPORT"] = "ssh"
    from tools.engine.store import stored_result

    called, t0 = time.time(), time.monotonic()
    r = fs.SPEC.run(fs.SPEC.Params(**where, checks=checks, deadline_s=600, plot=False), lambda f, m: None)
    wall = time.monotonic() - t0
    per_node: dict[str, float] = {}
    spans: dict[str, list[float]] = {}   # node -> [first start, last end], epoch s
    for row in r.rows:
        per_node[row.node] = per_node.get(row.node, 0.0) + row.seconds
        stored = stored_result(row.result_id) if row.result_id else None
        if stored:
            span = spans.setdefault(row.node, [stored["started"], stored["ended"]])
            span[0], span[1] = min(span[0], stored["started"]), max(span[1], stored["ended"])
    slowest_span = max((e - s for s, e in spans.values()), default=0.0)
    starts = sorted(s - called for s, _ in spans.values())
    return {"nodes": n, "launcher": launcher, "target": r.target, "drained": [d.node for d in r.drain],
            "checks": ",".join(checks), "wall_s": round(wall, 2), "complete": r.nodes_complete,
            "slowest_node_s": round(max(per_node.values(), default=0), 2),
            "slowest_span_s": round(slowest_span, 2),
            "wall_over_span": round(wall / slowest_span, 2) if slowest_span else None,
            "first_start_s": round(starts[0], 2) if starts else None,
            "last_start_s": round(starts[-1], 2) if starts else None,
            "sum_nodes_s": round(sum(per_node.values()), 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--launchers", nargs="+", choices=["partition", "srun", "ssh"], default=["partition"],
                    help="partition: srun over the partition (the default); srun / ssh: the nodes as a host list")
    ap.add_argument("--checks", nargs="+", choices=sorted(CHECK_SETS), default=sorted(CHECK_SETS))
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    lock = open(SESSION_LOCK, "w")
    if os.environ.get("MLN_CLUSTER_SESSION") != "held":   # else the caller holds it (flock ... env MLN_CLUSTER_SESSION=held)
        fcntl.flock(lock, fcntl.LOCK_EX)
    home = tempfile.mkdtemp(prefix="mln-walltime-")  # the sweeps' stored rows; removed at the end
    os.environ["MLENG_HOME"] = home
    rows = []
    try:
        for n in args.nodes:
            env_lines = cluster("start", str(n))
            os.environ["SLURM_CONF"] = env_lines.split("SLURM_CONF=")[1].split()[0]
            if "ssh" in args.launchers:
                os.environ["MLENG_SSH_CONFIG"] = cluster("sshd").split("MLENG_SSH_CONFIG=")[1].split()[0]
            for name in args.checks:
                for _ in range(args.repeats):
                    for launcher in args.launchers:
                        row = one_sweep(n, CHECK_SETS[name], launcher)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    finally:
        cluster("stop")
        lock.close()
        shutil.rmtree(home, ignore_errors=True)
    print(f"\n{'nodes':>5} {'launcher':<9} {'checks':<30} {'wall s':>7} {'slowest node s':>15} {'its span s':>11} "
          f"{'wall/span':>9} {'starts s':>12} {'sum of nodes s':>15}")
    for r in rows:
        print(f"{r['nodes']:>5} {r['launcher']:<9} {r['checks']:<30} {r['wall_s']:>7} {r['slowest_node_s']:>15} "
              f"{r['slowest_span_s']:>11} {r['wall_over_span']!s:>9} {r['first_start_s']!s:>5}-{r['last_start_s']!s:<6} "
              f"{r['sum_nodes_s']:>15}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
