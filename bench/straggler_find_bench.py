"""straggler_find's cost on a running SLURM job: time to verdict, and the job's step rate with and without sampling.

Needs a SLURM cluster with at least --nodes nodes (here: the namespace cluster). It submits the gloo training
loop of bench/straggler_workload.py (one rank per node), then alternates: a window unwatched, a window with
straggler_find sampling (--rounds times), counting the job's steps in each from its output. Overhead is the
step-rate ratio unwatched / watched - 1, as median over rounds (and its range); time to verdict is the
tool's wall time (srun start + window + judging). Every round samples the healthy job: the rounds that name
nobody are counted (the healthy-five-times check of issue 25). --tool-root runs another checkout's
straggler_find on the same job (before/after a change, side by side).

    scripts/cluster-local.sh start 8      # under the cluster session lock (see tests/multinode_cluster.py)
    export SLURM_CONF=/tmp/mln-cluster/etc/slurm.conf
    python bench/straggler_find_bench.py --nodes 4 --rounds 3 --window-s 10
    python bench/straggler_find_bench.py --nodes 8 --rounds 3 --window-s 10 --json /tmp/sf8.json
    python bench/straggler_find_bench.py --nodes 4 --rounds 3 --tool-root /tmp/before   # `git archive` of main

--local N runs the same loop as N ranks of one torchrun on this machine (no SLURM) and samples them through
the launcher pid: on a host with spare cores (the GPU box has 16) it shows the sampler's own cost on the
job, which the namespace cluster (8 nodes on 2 shared cores, where any extra CPU slows the job) cannot.

    python bench/straggler_find_bench.py --local 4 --rounds 5 --window-s 10
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def steps(out: Path) -> int:
    return len(re.findall(r"^step \d+", out.read_text(), re.M)) if out.exists() else 0


def rate(out: Path, seconds: float) -> float:
    """Steps per second the job makes over the next `seconds`."""
    first, t0 = steps(out), time.monotonic()
    time.sleep(seconds)
    return (steps(out) - first) / (time.monotonic() - t0)


def sampled_rate(out: Path, target: list[str], window_s: float, root: Path = ROOT) -> tuple[float, float, dict]:
    """(steps/s while straggler_find samples `target` (its target options), its wall time to verdict in s, its result)."""
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    first, t0 = steps(out), time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "tools.straggler_find", *target, "--window-s",
                           str(window_s), "--json"], capture_output=True, text=True, timeout=600, cwd=root, env=env)
    wall = time.monotonic() - t0
    result = json.loads(proc.stdout[proc.stdout.index("{"):]) if "{" in proc.stdout else {"error": proc.stderr[-500:]}
    # Only the sampling window counts for the rate: srun start and judging are not a load on the ranks.
    return (steps(out) - first) / wall, wall, result


def stop_local(launcher: subprocess.Popen, log) -> None:
    """End the local job and every rank: SIGTERM to its session, SIGKILL after 10 s."""
    import signal

    for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(launcher.pid, sig)
            launcher.wait(timeout=wait_s)
            break
        except (ProcessLookupError, subprocess.TimeoutExpired):
            continue
    log.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--window-s", type=float, default=10)
    ap.add_argument("--json", default="")
    ap.add_argument("--tool-root", type=Path, default=ROOT, help="the checkout whose straggler_find runs")
    ap.add_argument("--local", type=int, default=0, metavar="N",
                    help="N ranks of one torchrun on this machine instead of a SLURM job (no cluster needed)")
    args = ap.parse_args()
    workload = str(ROOT / "bench" / "straggler_workload.py")
    with tempfile.TemporaryDirectory(prefix="sfbench-") as tmp:
        out = Path(tmp) / "job.out"
        os.chmod(tmp, 0o755)
        if args.local:
            log = open(out, "w")  # noqa: SIM115 - the job writes to it until it is stopped below
            launcher = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone",
                                         f"--nproc-per-node={args.local}", workload, "--steps", "10000000"],
                                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            target, stop = ["--launcher-pid", str(launcher.pid)], lambda: stop_local(launcher, log)
        else:
            wrap = f"srun {sys.executable} {workload} --master mln1 --port 29561 --steps 10000000"
            job = subprocess.run(["sbatch", "--parsable", f"-N{args.nodes}", "--ntasks-per-node=1", "--time=30",
                                  f"--output={out}", "--wrap", wrap], capture_output=True, text=True,
                                 check=True).stdout.strip()
            target, stop = ["--slurm-job-id", job], lambda: subprocess.run(["scancel", job], capture_output=True)
        try:
            deadline = time.monotonic() + 180
            while steps(out) < 20 and time.monotonic() < deadline:
                time.sleep(1)
            rows = []
            for _ in range(args.rounds):
                off = rate(out, args.window_s + 15)
                on, wall, result = sampled_rate(out, target, args.window_s, args.tool_root)
                rows.append({"steps_per_s_unwatched": off, "steps_per_s_watched": on, "time_to_verdict_s": wall,
                             "verdict": result.get("verdict"), "stragglers": len(result.get("stragglers", [])),
                             "findings": result.get("findings", []),
                             "sampler_cpu_s": [n.get("sampler_cpu_s") for n in result.get("nodes", [])]})
                print(f"round: unwatched {off:.2f} steps/s, watched {on:.2f} steps/s, verdict in {wall:.1f} s "
                      f"({result.get('verdict')}, {len(result.get('stragglers', []))} straggler(s))", flush=True)
        finally:
            stop()
    overhead = [r["steps_per_s_unwatched"] / r["steps_per_s_watched"] - 1 for r in rows if r["steps_per_s_watched"]]
    cpu = [c for r in rows for c in r["sampler_cpu_s"] if c is not None]
    summary = {"nodes": args.nodes if not args.local else f"1 (local, {args.local} ranks)", "window_s": args.window_s, "rounds": rows, "tool_root": str(args.tool_root),
               "healthy_rounds_naming_nobody": sum(r["verdict"] in ("ok", "info") and not r["stragglers"] for r in rows),
               "sampler_cpu_s_per_node_median": statistics.median(cpu) if cpu else None,
               "time_to_verdict_s_median": statistics.median(r["time_to_verdict_s"] for r in rows),
               "overhead_pct_median": 100 * statistics.median(overhead) if overhead else None,
               "overhead_pct_range": [100 * min(overhead), 100 * max(overhead)] if overhead else None}
    print(f"SUMMARY {summary['nodes']} nodes, {os.cpu_count()} CPUs, window {args.window_s:.0f} s: time to verdict "
          f"{summary['time_to_verdict_s_median']:.1f} s (median of {len(rows)}); step-rate overhead "
          f"{summary['overhead_pct_median']:.1f}% (range {summary['overhead_pct_range'][0]:.1f} to "
          f"{summary['overhead_pct_range'][1]:.1f}%); sampler {summary['sampler_cpu_s_per_node_median']} CPU-s per "
          f"node per window; {summary['healthy_rounds_naming_nobody']} of {len(rows)} healthy rounds named nobody")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
