"""How a power-capped GPU's matmul throughput follows the load: the study behind matmul_bench's finals.

On an H100/H200 at its power cap the SM clock follows the recent load with a lag, so a shape timed
for a few tens of milliseconds measures partly the clock its predecessors left behind. This script
shows how much and for how long, on one GPU, in one process:

1. traces: for each shape, after a heavy preconditioning (8192^3 matmuls for 1 s) and after a light
   one (2048^3 matmuls, short and separated by cache flushes, for 1 s), time 0.6 s of iterations one
   by one (the same MatmulTimer as matmul_bench: L2 flush and output refresh between iterations) and
   print the TFLOPS of each 10 ms window: how fast, and to what level, the throughput settles;
2. with --cooldown: after the heavy preconditioning, MatmulTimer.cool_down(X) for several X, then
   a 0.1 s trace: how much light load brings the clock back to full (the finals' cooldown_s);
3. with --grid: the published 343-shape grid (2048..14336 step 2048, 50 warm-up + 100 timed), then
   its best shapes again, `--rounds` times in FLOP order, two ways: (a) the published way, 50 warm-up
   iterations then 100 timed; (b) `--settle-s` of the shape's own load first, then 100 timed.

    python bench/clock_settle.py --json settle.json
    python bench/clock_settle.py --grid --rounds 3 --json settle.json
    python bench/clock_settle.py --cpu-smoke          # tiny shapes on the CPU: the plumbing only
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.matmul_bench import search as ms

TRACE_SHAPES = [(2048, 2048, 10240), (2816, 1536, 11264), (4096, 2048, 8192), (2048, 2048, 4096), (8192, 8192, 8192)]
HEAVY, LIGHT = (8192, 8192, 8192), (2048, 2048, 2048)
EXTRA_FINALISTS = [(2816, 1536, 10496), (2816, 1536, 11264), (1536, 2816, 11264)]
GRID = list(range(2048, 14337, 2048))


def trace(timer, shape, seconds: float, window_s: float) -> dict:
    """Per-iteration TFLOPS for `seconds`, folded into windows of window_s (by the iteration's start time)."""
    torch = timer.torch
    a, b, c = timer._operands(shape)
    op = timer._op(a, b, c)
    probe = timer.measure(shape, 3, 0)
    per = statistics.fmean(probe.times_s) if probe else 0.01
    n = max(10, round(seconds / (per * 1.3)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends, strict=True):
        timer._refresh(c)
        s.record()
        op()
        e.record()
    torch.cuda.synchronize(timer.device)
    t_ms = [starts[0].elapsed_time(s) for s in starts]
    dur = [s.elapsed_time(e) / 1e3 for s, e in zip(starts, ends, strict=True)]
    flop = ms.flop(shape)
    windows: dict[int, list[float]] = {}
    for t, d in zip(t_ms, dur, strict=True):
        windows.setdefault(int(t / (window_s * 1e3)), []).append(d)
    series = [round(flop * len(ds) / sum(ds) / 1e12, 1) for _, ds in sorted(windows.items())]
    return {"iterations": n, "span_ms": round(t_ms[-1], 1), "window_ms": window_s * 1e3, "tflops_per_window": series}


def settle_measure(timer, shape, settle_s: float, iterations: int) -> ms.Timing | None:
    timer.run_for(shape, settle_s)
    return timer.measure(shape, iterations, 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--grid", action="store_true", help="also run the grid and re-measure its best shapes two ways")
    ap.add_argument("--cooldown", action="store_true", help="also trace a shape after cool-downs of several lengths")
    ap.add_argument("--no-traces", action="store_true", help="skip the heavy/light traces")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--settle-s", type=float, default=0.25)
    ap.add_argument("--top", type=int, default=10, help="grid shapes re-measured")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args()

    from tools.matmul_bench.measure import MatmulTimer

    if args.cpu_smoke:  # the plumbing only: tiny shapes, no traces (they use CUDA events)
        global HEAVY, LIGHT, GRID, EXTRA_FINALISTS
        HEAVY, LIGHT, GRID, EXTRA_FINALISTS = (128, 128, 128), (64, 64, 64), [64, 128], [(96, 64, 64)]
    timer = MatmulTimer("cpu" if args.cpu_smoke else args.device, "bf16")
    report: dict = {"traces": {}, "remeasure": []}
    timer.warm_up(min_s=0.1 if args.cpu_smoke else 3.0, max_s=0.5 if args.cpu_smoke else 30.0,
                  batch_s=0.02 if args.cpu_smoke else 0.5)
    if not args.cpu_smoke and args.cooldown:
        report["cooldown"] = {}
        for cool_s in (0.0, 0.05, 0.1, 0.2, 0.3, 0.5):
            timer.run_for(HEAVY, 1.0)
            timer.cool_down(cool_s)
            t = trace(timer, TRACE_SHAPES[1], 0.1, 0.01)
            report["cooldown"][str(cool_s)] = t
            print(f"cool-down {cool_s:.2f} s then {'x'.join(map(str, TRACE_SHAPES[1]))}: {t['tflops_per_window']}", flush=True)
    if not args.cpu_smoke and not args.no_traces:
        for shape in TRACE_SHAPES:
            for pre_name, pre in (("after_heavy", HEAVY), ("after_light", LIGHT)):
                timer.run_for(pre, 1.0)
                t = trace(timer, shape, 0.6, 0.01)
                key = f"{'x'.join(map(str, shape))} {pre_name}"
                report["traces"][key] = t
                s = t["tflops_per_window"]
                print(f"trace {key:32s} first windows {s[:6]} ... last {s[-3:]} (of {len(s)})", flush=True)
    if args.grid:
        shapes = ms.grid_shapes(GRID, GRID, GRID)
        t0 = time.monotonic()
        grid = ms.exhaustive(timer.measure, shapes, iterations=5 if args.cpu_smoke else 100,
                             warmup=1 if args.cpu_smoke else 50)
        report["grid"] = {"wall_s": round(time.monotonic() - t0, 1),
                          "all_in_order": [("x".join(map(str, t.shape)), ms.round_tflops(t.mean_tflops)) for t in grid.tried.values()]}
        top = [t.shape for t in grid.finals[:args.top]]
        candidates = sorted(dict.fromkeys([*top, *EXTRA_FINALISTS]), key=ms.flop)
        grid_mean = {t.shape: t.mean_tflops for t in grid.tried.values()}
        print(f"grid: best {grid.best.mean_tflops:.1f} at {grid.best.shape}, {report['grid']['wall_s']} s", flush=True)
        for rnd in range(args.rounds):
            for how in ("published", "settled"):
                for shape in candidates:
                    if how == "published":
                        t = timer.measure(shape, 100, 50)
                    else:
                        t = settle_measure(timer, shape, 0.02 if args.cpu_smoke else args.settle_s, 100)
                    report["remeasure"].append({"round": rnd, "how": how, "shape": "x".join(map(str, shape)),
                                                "grid_tflops": ms.round_tflops(grid_mean.get(shape, 0.0)),
                                                "mean_tflops": ms.round_tflops(t.mean_tflops), "median_tflops": ms.round_tflops(t.median_tflops)})
        print(f"{'shape':>18s} {'grid':>6s} | published rounds | settled rounds", flush=True)
        for shape in candidates:
            name = "x".join(map(str, shape))
            rows = [r for r in report["remeasure"] if r["shape"] == name]
            pub = [r["mean_tflops"] for r in rows if r["how"] == "published"]
            sett = [r["mean_tflops"] for r in rows if r["how"] == "settled"]
            print(f"{name:>18s} {grid_mean.get(shape, 0.0):6.1f} | {' '.join(f'{v:6.1f}' for v in pub)} | "
                  f"{' '.join(f'{v:6.1f}' for v in sett)}", flush=True)
    timer.close()
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
