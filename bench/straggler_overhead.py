"""straggler_find's cost to the job it samples, resolved to ~1-2 %: interleaved windows in ONE job, with a confidence interval.

A local gloo job (bench/straggler_workload.py, --ranks ranks under torchrun) runs throughout. Time is cut into
pairs of windows of --window-s seconds; in each pair one window (in random order) runs the node sampler
(`python -m tools.straggler_find.node`, what straggler_find runs on each of a job's nodes: py-spy per rank at
--rate-hz, the host counters) and the other runs nothing. The job's step rate is counted in each window from
its log. Drift (other load coming and going) hits both windows of a pair alike, so the figure is the mean over
pairs of log(rate unwatched / rate watched), with a 95% t-interval; printed as % slower while watched.

    python bench/straggler_overhead.py --pairs 40 --window-s 6 --json /tmp/sfo.json
    python bench/straggler_overhead.py --pool a.json b.json     # one interval over several runs' pairs

Several runs at once, each pinned to its own cores (taskset), give more pairs per minute of a large machine:
each pair is still two windows of one job, so what the other runs do hits both windows of a pair alike.
"""

import argparse
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "bench" / "straggler_workload.py"
T95 = {5: 2.571, 10: 2.228, 20: 2.086, 30: 2.042, 40: 2.021, 60: 2.0, 120: 1.98}


def steps(log: Path) -> int:
    return len(re.findall(r"^step \d+", log.read_text(), re.M))


def window(log: Path, seconds: float, sampler: list[str] | None) -> float:
    """The job's steps per second over one window, with the node sampler running through it or not."""
    first, t0 = steps(log), time.monotonic()
    if sampler:
        subprocess.run(sampler, capture_output=True, timeout=seconds + 60, cwd=ROOT)
        # the sampler may end a little after the window (its last counters): the rate is over its whole run
    else:
        time.sleep(seconds)
    return (steps(log) - first) / (time.monotonic() - t0)


def t95(n: int) -> float:
    return next((v for k, v in sorted(T95.items()) if n - 1 <= k), 1.96)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=40)
    ap.add_argument("--window-s", type=float, default=6)
    ap.add_argument("--rate-hz", type=int, default=5)
    ap.add_argument("--json", default="")
    ap.add_argument("--pool", nargs="+", default=[], metavar="JSON",
                    help="print one interval over the pairs of these --json files (no job is run)")
    args = ap.parse_args()
    if args.pool:
        runs = [json.loads(Path(f).read_text()) for f in args.pool]
        first = runs[0]
        rows = [r for run in runs for r in run["rows"]]
        label = f"{len(runs)} runs of {first['ranks']} ranks, {first['cpus']} CPUs seen by each"
        return summarise(rows, first["ranks"], first["window_s"], first["rate_hz"], label, args.json)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sfoverhead-") as tmp:
        log = Path(tmp) / "job.log"
        with open(log, "w") as out:
            job = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                    f"--nproc-per-node={args.ranks}", str(WORKLOAD), "--steps", "10000000"],
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp,
                                   env={**os.environ, "TMPDIR": tmp})
        try:
            while steps(log) < 20:
                assert job.poll() is None, log.read_text()[-800:]
                time.sleep(1)
            spec = json.dumps({"launcher_pid": job.pid, "window_s": args.window_s, "rate_hz": args.rate_hz})
            sampler = [sys.executable, "-m", "tools.straggler_find.node", spec]
            for _ in range(args.pairs):
                order = random.sample([False, True], 2)
                rates = {watched: window(log, args.window_s, sampler if watched else None) for watched in order}
                rows.append({"unwatched": rates[False], "watched": rates[True]})
                if args.json:   # pair by pair: a run cut by its time limit keeps what it measured (--pool reads it)
                    Path(args.json).write_text(json.dumps({"cpus": len(os.sched_getaffinity(0)), "ranks": args.ranks,
                                                           "window_s": args.window_s, "rate_hz": args.rate_hz,
                                                           "rows": rows}))
        finally:
            os.killpg(job.pid, signal.SIGTERM)
            job.wait(timeout=30)
    cpus = len(os.sched_getaffinity(0))     # taskset's share, not the machine's count
    return summarise(rows, args.ranks, args.window_s, args.rate_hz, f"{args.ranks} ranks, {cpus} CPUs", args.json)


def summarise(rows: list[dict], ranks: int, window_s: float, rate_hz: int, label: str, json_path: str) -> int:
    logs = [math.log(r["unwatched"] / r["watched"]) for r in rows if r["watched"] > 0 and r["unwatched"] > 0]
    mean, sd = statistics.mean(logs), statistics.stdev(logs)
    half = t95(len(logs)) * sd / math.sqrt(len(logs))
    pct = {k: round(100 * (math.exp(v) - 1), 2) for k, v in (("mean", mean), ("low", mean - half), ("high", mean + half))}
    summary = {"cpus": len(os.sched_getaffinity(0)), "ranks": ranks, "pairs": len(logs), "window_s": window_s,
               "rate_hz": rate_hz, "slower_while_watched_pct": pct,
               "per_window_sd_pct": round(100 * sd, 1), "rows": rows}
    print(f"SUMMARY {label}, {len(logs)} pairs of {window_s:.0f} s windows at {rate_hz} Hz: the job ran "
          f"{pct['mean']:+.2f}% slower while sampled (95% CI {pct['low']:+.2f} to {pct['high']:+.2f}%; "
          f"one pair's spread {100 * sd:.1f}%)")
    if json_path:
        Path(json_path).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
