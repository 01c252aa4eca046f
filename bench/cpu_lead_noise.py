"""How far a healthy CPU-only rank's CPU time leads its peers' by chance, against a 15% compute straggler's lead.

straggler_find names a rank of a CPU-only job for compute when its CPU seconds per second lead the others'
median past a margin (knowledge/data/straggler_rules.toml, cpu_work_*). This measures the two sides of that
margin side by side: a 4-rank job of bench/straggler_workload.py, healthy and with rank 2 doing 15% more
matmuls, each with and without busy loops beside it. Each rank's CPU time (/proc/PID/stat) is read every
second for 48 s; for windows of 6, 12, 18, 24 and 48 s (sliding by 6 s) it prints the top rank and its
lead over the others' median. A script, not a test: the figures go to docs/benchmarks.md.

    python bench/cpu_lead_noise.py --rounds 2 --hogs 0 2
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tools.engine.processes import kill_tree  # noqa: E402
from tools.shared.process_targets import cpu_seconds  # noqa: E402

WORKLOAD = ROOT / "bench" / "straggler_workload.py"
STRAGGLER = ("--slow-compute-rank", "2", "--extra-compute-fraction", "0.15")
READS = 49                     # one a second: 48 s of windows
WINDOWS_S = (6, 12, 18, 24, 48)


def measure(hogs: int, args: tuple[str, ...]) -> dict:
    """One job (4 ranks) beside `hogs` busy loops: per window length, (top rank, its lead) for each window."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
    job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
                            str(WORKLOAD), "--steps", "1000000", *args],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        time.sleep(25)                       # torch imports and the first steps
        ranks = {int(c.environ()["RANK"]): c.pid for c in psutil.Process(job.pid).children()}
        reads = []
        for _ in range(READS):
            reads.append({r: cpu_seconds(p) for r, p in ranks.items()})
            time.sleep(1)
    finally:
        kill_tree(job.pid)           # the ranks too: torchrun starts them in sessions of their own
        job.wait()
        for loop in loops:
            loop.kill()
            loop.wait()
    leads = {}
    for w in WINDOWS_S:
        leads[w] = []
        for start in range(0, READS - w, 6):
            used = {r: reads[start + w][r] - reads[start][r] for r in ranks}
            top = max(used, key=used.get)
            rest = statistics.median(v for r, v in used.items() if r != top)
            leads[w].append((top, round(used[top] / rest - 1, 3)))
    return {"hogs": hogs, "straggler": bool(args), "load": round(os.getloadavg()[0], 1), "leads": leads}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--hogs", type=int, nargs="+", default=[0, 2], help="busy loops beside the job, per run")
    a = ap.parse_args()
    runs = [measure(h, args) for _ in range(a.rounds) for h in a.hogs for args in ((), STRAGGLER)]
    for run in runs:
        print(json.dumps(run))
    for straggler in (False, True):
        for w in WINDOWS_S:
            mine = [lead for run in runs if run["straggler"] == straggler for top, lead in run["leads"][w]
                    if not straggler or top == 2]
            if mine:
                print(f"{'15% straggler' if straggler else 'healthy':14s} {w:2d} s windows: top lead "
                      f"{min(mine):+.1%} .. {max(mine):+.1%} over {len(mine)} windows")


if __name__ == "__main__":
    main()
