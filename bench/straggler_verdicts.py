"""straggler_find's verdicts on a local torchrun job, case by case: time to verdict and who was named (issue 35).

Each case starts 4 gloo ranks of bench/straggler_workload.py on this machine (torchrun, no SLURM), injects
its fault from outside the tool, then runs straggler_find on the launcher pid as a user would (CLI, JSON)
and records the wall time to its answer, the seconds it sampled, the ranks it named and why:
- healthy: nothing injected (repeated --healthy-repeats times): nobody may be named;
- clear: rank 1 sleeps its own recent step time in its loader (about 2x slower);
- small: rank 1 sleeps 15% of its own recent step time in its loader (15% slower);
- compute: rank 1 runs 15% more matmuls a step than the others (CPU compute, no sleep: --slow-compute-rank);
- contention: rank 3 pinned to the last CPU (taskset -a) with two busy loops pinned there too, at nice -10.
The slow rank's sleep follows its own step time (bench/straggler_workload.py --loader-sleep-fraction), so
the case keeps its size when the host's load moves. --before-root runs another checkout's
straggler_find (a `git archive` of the old commit) on the same job right after, with its own defaults:
before/after in one run, on the same machine and load.

    python bench/straggler_verdicts.py --json /tmp/sfv.json
    python bench/straggler_verdicts.py --cases healthy,compute --fault-repeats 3     # the tests' repeats
    git archive 477fe48 | tar -x -C /tmp/sf-old && python bench/straggler_verdicts.py --before-root /tmp/sf-old
"""

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
WORKLOAD = ROOT / "bench" / "straggler_workload.py"
RANKS = 4


def step_ms(log: Path) -> list[float]:
    return [float(x) for x in re.findall(r"^step \d+ rank 0 step_ms ([\d.]+)", log.read_text(), re.M)]


class LocalJob:
    """A torchrun job of RANKS ranks in its own session, stopped (and its busy loops) on exit."""

    def __init__(self, tmp: Path, name: str, *args: str):
        self.log = tmp / f"{name}.log"
        self.loops: list[subprocess.Popen] = []
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                          f"--nproc-per-node={RANKS}", str(WORKLOAD), "--steps", "10000000", *args],
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp,
                                         env={**os.environ, "TMPDIR": str(tmp)})
        deadline = time.monotonic() + 240
        while len(step_ms(self.log)) < 10:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"job {name} did not start: {self.log.read_text()[-800:]}")
            time.sleep(1)

    def rank_pid(self, rank: int) -> int:
        for child in psutil.Process(self.proc.pid).children():
            if child.environ().get("RANK") == str(rank):
                return child.pid
        raise RuntimeError(f"rank {rank} not found")

    def contend(self, rank: int, cpu: int, loops: int = 2) -> None:
        subprocess.run(["taskset", "-a", "-cp", str(cpu), str(self.rank_pid(rank))], check=True, capture_output=True)
        # nice -10, each loop its own session with its autogroup at -10 (the kernel shares CPUs between autogroups
        # first): on a host oversubscribed by others, loops at nice 0 only even out the scheduler's balance.
        for _ in range(loops):
            self.loops.append(subprocess.Popen(["nice", "-n", "-10", "taskset", "-c", str(cpu), sys.executable, "-c",
                                                "while True: pass"], start_new_session=True))
            Path(f"/proc/{self.loops[-1].pid}/autogroup").write_text("-10")

    def stop(self) -> None:
        for loop in self.loops:
            loop.kill()
            loop.wait()
        for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
            try:
                os.killpg(self.proc.pid, sig)
                self.proc.wait(timeout=wait_s)
                return
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue


def verdict(job: LocalJob, root: Path, *extra: str) -> dict:
    """straggler_find from checkout `root` on the job: wall time, seconds sampled, named ranks and reasons."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tools.straggler_find", "--launcher-pid", str(job.proc.pid), *extra,
                           "--json"], capture_output=True, text=True, timeout=400, cwd=root)
    wall = time.monotonic() - t0
    result = json.loads(proc.stdout[proc.stdout.index("{"):]) if "{" in proc.stdout else {"error": proc.stderr[-500:]}
    return {"wall_s": round(wall, 1), "sampled_s": result.get("window_s"), "verdict": result.get("verdict"),
            "named": [(s["rank"], s["reason"]) for s in result.get("stragglers", [])],
            "headline": (result.get("findings") or [result.get("error", "")])[0][:400],
            "spread_pct": result.get("spread_pct"),
            "runq_s_per_s": {r["rank"]: r.get("runqueue_wait_fraction") for r in result.get("ranks", [])},
            "cpu_s_per_s": {r["rank"]: r.get("cpu_fraction") for r in result.get("ranks", [])},
            "others_runnable": {r["rank"]: r.get("others_runnable") for r in result.get("ranks", [])},
            "sampler_cpu_s": [n.get("sampler_cpu_s") for n in result.get("nodes", [])],
            "load_per_cpu": [n.get("load_per_cpu") for n in result.get("nodes", [])]}


def run_case(tmp: Path, name: str, args: list[str], before: Path | None, contend: bool = False) -> dict:
    job = LocalJob(tmp, name, *args)
    try:
        if contend:
            job.contend(RANKS - 1, (os.cpu_count() or 1) - 1)
            time.sleep(3)
        row = {"case": name, "args": args, "after": verdict(job, ROOT)}
        if before:
            row["before"] = verdict(job, before)
        row["job_step_ms_median"] = statistics.median(step_ms(job.log)[5:] or [0])
    finally:
        job.stop()
    print(json.dumps(row), flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--healthy-repeats", type=int, default=3)
    ap.add_argument("--fault-repeats", type=int, default=1, help="runs of each fault case (tests run one of each)")
    ap.add_argument("--cases", default="healthy,clear,small,contention")
    ap.add_argument("--before-root", type=Path, help="another checkout (the old commit) to run on the same jobs")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    cases = args.cases.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="sfverdicts-") as tmp:
        tmp = Path(tmp)
        for i in range(1, args.healthy_repeats + 1 if "healthy" in cases else 1):
            rows.append(run_case(tmp, f"healthy-{i}", [], args.before_root))
        slow = {"clear": 1.0, "small": 0.15}
        for _ in range(args.fault_repeats):
            for name in (c for c in cases if c in slow):
                # A fraction of the slow rank's own recent step (the workload's --loader-sleep-fraction), not of the
                # first job's: under a moving load a fixed 15% of an earlier step came out ~10% (2026-12-02 morning).
                rows.append(run_case(tmp, name, ["--slow-loader-rank", "1", "--loader-sleep-fraction", str(slow[name])],
                                     args.before_root))
            if "compute" in cases:
                rows.append(run_case(tmp, "compute", ["--slow-compute-rank", "1", "--extra-compute-fraction", "0.15"],
                                     args.before_root))
            if "contention" in cases:
                rows.append(run_case(tmp, "contention", [], args.before_root, contend=True))
    summary = {"cpus": os.cpu_count(), "ranks": RANKS, "rows": rows}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    for r in rows:
        for side in ("before", "after"):
            if side in r:
                v = r[side]
                print(f"{r['case']:12s} {side:6s} {v['wall_s']:6.1f} s wall, sampled {v['sampled_s']} s, {v['verdict']}, "
                      f"named {v['named']}; {v['headline'][:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
