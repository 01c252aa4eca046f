"""matmul_bench's search against the exhaustive grid, side by side in one process on one GPU.

1. matmul_bench (mode quick, bf16), run `--repeats` times: its MAMF (finalists measured from full
   clock), its sustained figure (the finalists once settled at their own load), best shapes and wall
   time (warm-up included);
2. the grid: M, N, K in 2048..14336 step 2048 (343 shapes), each shape 50 warm-up + 100 timed
   iterations, timed the same way (same MatmulTimer), card already warm, no cool-down: the classic
   finder's way, where each shape meets the clock its predecessor left;
3. the grid's best shapes measured again the way the search's finals are (full clock, then settled):
   the two methods' shapes compared on equal terms;
4. memory_bandwidth_bench's device copy figure beside a plain torch copy loop timed in the same run.

Target (H200): search best >= grid best, in <= 1/4 of the grid's time. Prints one SUMMARY line at
the end; --json FILE also writes everything. Takes about 4-5 minutes on one H200.

    python bench/mamf_vs_grid.py                 # GPU 0
    python bench/mamf_vs_grid.py --device 1 --json mamf_vs_grid.json
    python bench/mamf_vs_grid.py --skip-grid     # the search only (about half a minute per repeat)
"""

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools.matmul_bench import search as ms

GRID = list(range(2048, 14337, 2048))


def environment(device) -> dict:
    import torch

    env = {"date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "host": platform.node(),
           "gpu": "cpu" if device == "cpu" else torch.cuda.get_device_name(device), "torch": torch.__version__,
           "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None), "driver": None}
    try:
        import pynvml

        pynvml.nvmlInit()
        env["driver"] = pynvml.nvmlSystemGetDriverVersion()
    except Exception:
        pass
    return env


def _progress(label: str):
    """Print a progress line on stderr each time another tenth of the work is done."""
    shown = [-1]

    def show(fraction: float, message: str) -> None:
        if int(fraction * 10) > shown[0]:
            shown[0] = int(fraction * 10)
            print(f"  [{label} {fraction:4.0%}] {message}", file=sys.stderr, flush=True)
    return show


def run_search(device, budget: float | None, smoke: bool) -> dict:
    from tools.matmul_bench import SPEC, MatmulBenchParams

    extra = {"iterations": 5, "warmup": 1} if smoke else {}
    params = MatmulBenchParams(device=device, dtype="bf16", mode="quick", time_budget_s=budget, **extra)
    t0 = time.monotonic()
    r = SPEC.run(params, _progress("search"))
    wall = time.monotonic() - t0
    print(f"search: {r.mamf_tflops} TFLOPS at {r.best_shape} (sustained {r.sustained_tflops} at {r.sustained_shape}), "
          f"{r.shapes_tried} shapes, {wall:.1f} s "
          f"(warm-up {r.warmup_s} s, phases {r.phase_s}), verdict {r.verdict}", flush=True)
    for f in r.findings:
        print(f"  - {f}")
    return {"best_tflops": r.mamf_tflops, "best_shape": r.best_shape, "sustained_tflops": r.sustained_tflops,
            "sustained_shape": r.sustained_shape, "wall_s": round(wall, 1),
            "warmup_s": r.warmup_s, "phase_s": r.phase_s, "shapes_tried": r.shapes_tried, "iterations_total": r.iterations_total,
            "top_shapes": [s.model_dump() for s in r.top_shapes], "top_sustained": [s.model_dump() for s in r.top_sustained],
            "telemetry": r.telemetry, "verdict": r.verdict}


def run_grid(device, smoke: bool) -> dict:
    from tools.shared.gpu_sampler import GpuSampler
    from tools.matmul_bench.measure import MatmulTimer

    timer = MatmulTimer(device, "bf16")
    dims = [64, 128, 192] if smoke else GRID
    shapes = ms.grid_shapes(dims, dims, dims)
    with GpuSampler(None if smoke else device) as sampler:
        warm = timer.warm_up(min_s=0.1 if smoke else 3.0, max_s=0.5 if smoke else 30.0, batch_s=0.02 if smoke else 0.5)
        t0 = time.monotonic()
        out = ms.exhaustive(timer.measure, shapes, iterations=5 if smoke else 100, warmup=1 if smoke else 50,
                            progress=_progress("grid"))
        wall = time.monotonic() - t0
        # the grid's best shapes, measured as the search's finals are: from full clock, then settled
        plan = ms.TINY if smoke else ms.QUICK
        again = ms.final_measure(ms.Recorder(timer.measure), [t.shape for t in out.finals[:5]], 5 if smoke else 100,
                                 1 if smoke else 50, cool_down=timer.cool_down, cooldown_s=plan.cooldown_s,
                                 settle_s=plan.settle_s)
    timer.close()
    b = out.best
    fresh, settled = again.fresh[0], again.sustained[0]
    print(f"grid: {b.mean_tflops:.1f} TFLOPS at {'x'.join(map(str, b.shape))}, {len(out.tried)} shapes, {wall:.1f} s; "
          f"its top 5 measured the search's way: {fresh.mean_tflops:.1f} from full clock at {'x'.join(map(str, fresh.shape))}, "
          f"{settled.mean_tflops:.1f} sustained at {'x'.join(map(str, settled.shape))}", flush=True)
    return {"best_tflops": ms.round_tflops(b.mean_tflops), "best_shape": "x".join(map(str, b.shape)), "wall_s": round(wall, 1),
            "warmup_s": round(warm.seconds, 1), "top5_full_clock": [("x".join(map(str, t.shape)), ms.round_tflops(t.mean_tflops)) for t in again.fresh],
            "top5_sustained": [("x".join(map(str, t.shape)), ms.round_tflops(t.mean_tflops)) for t in again.sustained],
            "shapes": len(out.tried), "geomean_tflops": ms.round_tflops(out.geomean_tflops),
            "top5": [("x".join(map(str, t.shape)), ms.round_tflops(t.mean_tflops)) for t in out.finals[:5]],
            "all_in_order": [("x".join(map(str, t.shape)), ms.round_tflops(t.mean_tflops)) for t in out.tried.values()],
            "telemetry": sampler.summary()}


def plain_copy_tbps(device, size_mib: int = 1024, iterations: int = 50) -> float:
    """A plain torch copy loop: one clock around `iterations` back-to-back copies, bytes read + written."""
    import torch

    a = torch.rand(size_mib << 18, device="cpu" if device == "cpu" else f"cuda:{device}")
    b = torch.empty_like(a)
    for _ in range(5):
        b.copy_(a)
    if device == "cpu":
        t0 = time.perf_counter()
        for _ in range(iterations):
            b.copy_(a)
        seconds = time.perf_counter() - t0
    else:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iterations):
            b.copy_(a)
        end.record()
        torch.cuda.synchronize(device)
        seconds = start.elapsed_time(end) / 1e3
    return 2 * a.numel() * 4 * iterations / seconds / 1e12


def run_membw(device, smoke: bool) -> dict:
    from tools.memory_bandwidth_bench import SPEC, MemoryBandwidthParams

    extra = {"size_mib": 64, "tests": ["copy", "read", "write"], "iterations": 3} if smoke else {}
    r = SPEC.run(MemoryBandwidthParams(device=device, **extra), lambda f, m: None)
    plain = plain_copy_tbps(device, size_mib=64 if smoke else 1024, iterations=5 if smoke else 50)
    print(f"memory_bandwidth_bench: copy {r.copy_tbps} TB/s (read {r.read_tbps}, write {r.write_tbps}; spec "
          f"{r.spec_tbps}); plain torch copy loop {plain:.3f} TB/s; h2d pinned {r.h2d_pinned_gbps} GB/s, "
          f"d2h pinned {r.d2h_pinned_gbps} GB/s, link Gen{r.pcie_gen} x{r.pcie_width}; verdict {r.verdict}", flush=True)
    return {"tool": r.model_dump(mode="json"), "plain_copy_tbps": round(plain, 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=2, help="how many times to run the search (shows its spread)")
    ap.add_argument("--budget", type=float, default=None, help="time_budget_s for the search, warm-up included (tool default for quick: 25)")
    ap.add_argument("--skip-grid", action="store_true")
    ap.add_argument("--skip-membw", action="store_true")
    ap.add_argument("--json", type=Path, default=None, help="write all figures to this file")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny shapes on the CPU: checks this script's plumbing only")
    args = ap.parse_args()

    import torch

    device = "cpu" if args.cpu_smoke else args.device
    if device != "cpu" and not torch.cuda.is_available():
        print("needs a GPU (torch.cuda.is_available() is False); --cpu-smoke checks the plumbing", file=sys.stderr)
        return 2
    report = {"environment": environment(device)}
    print(json.dumps(report["environment"]), flush=True)
    report["searches"] = [run_search(device, args.budget, args.cpu_smoke) for _ in range(args.repeats)]
    if not args.skip_grid:
        report["grid"] = run_grid(device, args.cpu_smoke)
    if not args.skip_membw:
        report["membw"] = run_membw(device, args.cpu_smoke)
    best = max(report["searches"], key=lambda s: s["best_tflops"])
    slowest = max(s["wall_s"] for s in report["searches"])
    slowest_search = max(s["wall_s"] - s["warmup_s"] for s in report["searches"])
    line = (f"SUMMARY {report['environment']['gpu']} | search best {best['best_tflops']} TFLOPS at {best['best_shape']} "
            f"(runs: {', '.join(str(s['best_tflops']) for s in report['searches'])}; slowest run {slowest_search:.1f} s "
            f"after warm-up, {slowest} s with it)")
    if "grid" in report:
        g = report["grid"]
        grid_s = max(g["wall_s"], 0.1)  # --cpu-smoke: the tiny grid may round to 0.0 s
        line += (f" | grid best {g['best_tflops']} TFLOPS at {g['best_shape']} in {g['wall_s']} s (after warm-up)"
                 f" | best ratio (worst search run / grid) {min(s['best_tflops'] for s in report['searches']) / g['best_tflops']:.3f}"
                 f" | sustained: search runs {', '.join(str(s['sustained_tflops']) for s in report['searches'])} vs the grid's"
                 f" top 5 settled {g['top5_sustained'][0][1]} (worst ratio"
                 f" {min(s['sustained_tflops'] for s in report['searches']) / g['top5_sustained'][0][1]:.3f})"
                 f" | time ratio (slowest search / grid, both warm) {slowest_search / grid_s:.2f}"
                 f", both with their warm-ups {slowest / (grid_s + g['warmup_s']):.2f}")
    if "membw" in report:
        m = report["membw"]
        line += f" | membw copy {m['tool']['copy_tbps']} TB/s vs plain torch copy {m['plain_copy_tbps']} TB/s"
    print(line, flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
