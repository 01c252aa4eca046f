"""collective_bench pairwise: time to verdict for a slow (not dead) link, before and after, same session.

The drill's call (SKILL.md's route for "which node or link": pattern pairwise, backend gloo, every other
field at its default: 32K..16M, 20 iterations, a 120 s group deadline), run under salloc on the namespace
cluster (scripts/cluster-local.sh), with the drills' own injectors for the faults:
  slow-link:       htb 50 Mbit/s between the first two nodes only (cl-slow-link's fault, tools/evals/drills)
  two-slow-nodes:  tbf 50 Mbit/s on the last two nodes' links
  healthy:         nothing (a run that names anything is a false name)
`--before DIR` runs the same call from another checkout (e.g. a worktree of main) in the same cluster
session, interleaved with ours. One cluster session per --nodes value; faults are lifted between runs.

    python bench/pairwise_time_to_verdict.py --nodes 4 --cases slow-link healthy --repeat 3 \
        --before /work/main --before-cases slow-link --record /tmp/ttv.jsonl
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from cluster_session import REPO, cluster_session, host_load

from tools.evals.drills.faults import apply, undo
from tools.evals.drills.scenarios import RateLimit, SlowLink
from tools.evals.drills.state import Step


def faults_of(case: str, nodes: list[str]) -> list:
    if case == "slow-link":
        return [SlowLink(kind="slow_link", node=nodes[0], peer=nodes[1], rate="50mbit")]
    if case == "two-slow-nodes":
        return [RateLimit(kind="rate_limit", node=n, rate="50mbit") for n in nodes[-2:]]
    if case == "healthy":
        return []
    raise SystemExit(f"unknown case {case!r}")


def one_run(n: int, checkout: Path) -> dict:
    t0 = time.monotonic()
    proc = subprocess.run(["salloc", f"-N{n}", f"--nodelist=mln[1-{n}]", "--no-kill", "--time=30", sys.executable,
                           "-m", "tools.collective_bench", "--pattern", "pairwise", "--backend", "gloo", "--json",
                           "--no-plot"], capture_output=True, text=True, cwd=checkout, timeout=1800)
    wall = round(time.monotonic() - t0, 1)
    out = proc.stdout
    if "{" not in out:
        return {"wall_s": wall, "error": proc.stderr[-600:]}
    result = json.loads(out[out.index("{"):])
    iso = result.get("isolation") or {}
    return {"wall_s": wall, "verdict": result["verdict"],
            "named": ["-".join(s["nodes"]) if s["kind"] != "node" else s["nodes"][0] for s in iso.get("suspects", [])],
            "kinds": [s["kind"] for s in iso.get("suspects", [])],
            "unconfirmed": ["-".join(s["nodes"]) for s in iso.get("unconfirmed", [])],
            "inconclusive": iso.get("inconclusive"), "rounds": iso.get("rounds"),
            "cut_or_hung": [g["detail"][:160] for g in iso.get("groups", []) if g["status"] != "ok"]}


class _State:
    """What faults.apply/undo record into (the drills keep it in a file; here it lives for one run)."""
    def __init__(self):
        self.steps: list[Step] = []
        self.started_cluster = True

    def record(self, step: Step) -> Step:
        self.steps.append(step)
        return step

    def save(self) -> None:
        pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--cases", nargs="+", default=["slow-link", "healthy"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--before", type=Path, help="a checkout of the code before, run interleaved with this one")
    ap.add_argument("--before-repeat", type=int, default=1, help="runs of the before code per case")
    ap.add_argument("--before-cases", nargs="*", help="the cases the before code runs (default: every case)")
    ap.add_argument("--record", help="append every run here (JSON lines)")
    ap.add_argument("--port-base", type=int, help="slurmctld's port (when a stray slurmctld holds the usual one)")
    args = ap.parse_args()
    if args.port_base:
        import tools.evals.drills.cluster as namespace_cluster
        namespace_cluster.PORT_BASE = args.port_base
    plan = []
    for case in args.cases:
        for k in range(args.repeat):
            if args.before and k < args.before_repeat and case in (args.before_cases or args.cases):
                plan.append((case, "before", args.before))
            plan.append((case, "after", REPO))
    with cluster_session(args.nodes) as cluster:
        for case, code, checkout in plan:
            state = _State()
            try:
                for fault in faults_of(case, cluster.nodes):
                    apply(fault, state, None)
                run = {"case": case, "code": code, "nodes": args.nodes, "load_before": host_load(),
                       **one_run(args.nodes, checkout), "load_after": host_load(),
                       "at": time.strftime("%H:%M:%S", time.gmtime())}
            finally:
                for step in reversed(state.steps):
                    undo(step, state)
            print(json.dumps(run), flush=True)
            if args.record:
                with open(args.record, "a") as f:
                    f.write(json.dumps(run) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
