"""The healthy cluster controls under a CPU hog (issue 35): one scripted-baseline run per call, recorded.

One drill per call, so that each run holds the machine's session lock on its own and other users get the
namespace cluster in between (the drill starts and stops the cluster itself):

    for d in cl-healthy-job cl-healthy-which-node cl-healthy-allreduce; do
      flock -w 1800 /tmp/mln-cluster.session.lock env MLN_CLUSTER_SESSION=held \\
        python bench/drill_controls_hog.py $d --record /tmp/controls.jsonl
    done

The hog: 2 busy loops (`python -c "while True: pass"`, nice 0, this host's root cgroup, outside every node),
running for the drill's whole run (start, solve, stop) and killed after. Each run appends one JSON line:
the drill, start and end (UTC), the code's commit, score, reason, false drains, what was named, every call
(tool, seconds, verdict, first findings) and the host's 1-minute load at the drill's start and end.
"""

import argparse
import json
import subprocess
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
HOG_LOOPS = 2


def utc() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def commit() -> str:
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "tools"],
                           capture_output=True, text=True).stdout.strip()
    return head.stdout.strip() + ("+tools-changed" if dirty else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("drill", help="a cluster control, e.g. cl-healthy-job")
    ap.add_argument("--record", required=True, help="append the run's JSON line here")
    ap.add_argument("--wait-s", type=float, default=600, help="how long the drill waits for the namespace cluster")
    args = ap.parse_args()
    from tools.evals.drills.baseline import run_scenario
    from tools.evals.drills.scenarios import load_scenario

    scenario = load_scenario(args.drill)   # a wrong id fails here, before any hog starts
    if scenario.place != "cluster" or scenario.truth.kind != "none":
        sys.exit(f"{args.drill} is not a healthy cluster control (place {scenario.place}, truth {scenario.truth.kind})")
    started = utc()
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(HOG_LOOPS)]
    try:
        attempt = run_scenario(args.drill, args.wait_s)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    row = {"drill": args.drill, "started": started, "ended": utc(), "code": commit(), "hog_loops": HOG_LOOPS,
           **asdict(attempt)}
    with open(args.record, "a") as f:
        f.write(json.dumps(row) + "\n")
    calls = ", ".join(f"{c.tool} {c.seconds:.0f}" for c in attempt.calls)
    print(f"{args.drill}: score {attempt.score:g}, false drains {attempt.false_drain or 0}, {attempt.seconds:.0f} s, "
          f"load {'/'.join(f'{x:.1f}' for x in attempt.load_1min)}; {calls}: {attempt.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
