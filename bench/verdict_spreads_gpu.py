"""Run-to-run spread of the GPU checks fleet_sweep compares, for knowledge/data/verdict_rules.toml.

Repeats matmul_bench (quick, short budget) and memory_bandwidth_bench on one GPU --repeats times, each
through the tool's own run() and its sweep contract (the figures the sweep reads), and prints per
figure: the values' median, min-max, and the spread the one rule uses (1.4826 x MAD / median). Run on
a quiet GPU (nothing else on it: the script says so if NVML sees another process).

    python bench/verdict_spreads_gpu.py                      # GPU 0, 10 repeats (~3-4 min on one H200; values printed per repeat)
    python bench/verdict_spreads_gpu.py --repeats 12 --json spreads.json
    python bench/verdict_spreads_gpu.py --cpu-smoke          # the plumbing on a CPU (tiny, no GPU figures)
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def measure(name: str, **params) -> list:
    from tools.engine.registry import load_spec

    spec = load_spec(name)
    result = spec.run(spec.Params(**params), lambda f, m: None)
    return spec.sweep.measure(result)


def main() -> int:
    from tools.shared.judging import relative_spread, rule_for, threshold
    from tools.shared.occupancy import gpu_occupancy

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny CPU runs: the plumbing only")
    ap.add_argument("--json", help="write the values here too")
    args = ap.parse_args()
    if args.cpu_smoke:
        runs = [("memory_bandwidth_bench", {"device": "cpu", "size_mib": 16, "tests": ["copy"]})]
    else:
        busy = gpu_occupancy([args.device])
        if busy.busy:
            print(f"WARNING: GPU {args.device} is in use ({busy.why}): the spreads will measure the sharing")
        runs = [("matmul_bench", {"device": args.device, "mode": "quick", "time_budget_s": 10, "iterations": 50,
                                  "warmup": 10}),
                ("memory_bandwidth_bench", {"device": args.device})]
    values: dict[str, list[float]] = {}
    t0 = time.monotonic()
    for i in range(args.repeats):
        for name, params in runs:
            for m in measure(name, **params):
                if m.value is not None:
                    values.setdefault(m.figure.name, []).append(float(m.value))
        # every repeat's figures as they come: a run cut short still leaves its values in the log
        print(f"repeat {i + 1}/{args.repeats} at {time.monotonic() - t0:.0f} s: "
              + ", ".join(f"{k} {v[-1]:.4g}" for k, v in values.items()), flush=True)
    print(f"\n{'figure':<20} {'n':>3} {'median':>10} {'min':>10} {'max':>10} {'spread %':>9} {'threshold %':>12}")
    out = {}
    for name, vals in values.items():
        spread = relative_spread(vals)
        rule = rule_for(name)
        out[name] = {"values": vals, "median": statistics.median(vals), "spread": round(spread, 5)}
        print(f"{name:<20} {len(vals):>3} {statistics.median(vals):>10.4g} {min(vals):>10.4g} {max(vals):>10.4g} "
              f"{100 * spread:>9.2f} {100 * threshold(rule, max(spread, rule.spread)):>12.1f}")
        print(f"SPREAD {name} {spread:.4f} over {len(vals)} runs, {rule.unit}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
