"""What a model reads of each answer in the drills, in characters, for both kinds of MCP host.

    python bench/answer_sizes.py                       # this checkout, every local (post-mortem) drill
    python bench/answer_sizes.py --before /path/to/old  # the same drills in another checkout too, side by side

The scripted baseline (tools/evals/drills/baseline.py) plays each drill through the real server; every
answer it gets is measured twice: the text blocks (what Claude Desktop and other text-reading hosts hand
the model) and the structured content as JSON (what Claude Code, VS Code and Copilot's CLI hand it
instead). Prints one row per drill (calls, score, medians of both views) and the medians over all answers;
--json for machines. A checkout given with --before is run the same way in a child process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measure(root: Path) -> dict:
    sys.path.insert(0, str(root))
    from mcp import Client

    from tools.evals.drills.baseline import run_scenario
    from tools.evals.drills.scenarios import all_scenarios

    answers: list[dict] = []
    original = Client.call_tool

    async def recording(self, name, arguments=None, *args, **kwargs):
        result = await original(self, name, arguments, *args, **kwargs)
        text = "\n".join(getattr(b, "text", "") for b in result.content)
        structured = json.dumps(result.structured_content, separators=(",", ":")) if result.structured_content else ""
        answers.append({"tool": name, "text": len(text), "structured": len(structured)})
        return result

    Client.call_tool = recording
    drills = {}
    for scenario in all_scenarios():
        if scenario.place != "local":
            continue
        first = len(answers)
        attempt = run_scenario(scenario.id)
        mine = answers[first:]
        drills[scenario.id] = {"score": attempt.score, "calls": len(mine),
                               "text": [a["text"] for a in mine], "structured": [a["structured"] for a in mine]}
    return drills


def _median(values: list[int]) -> float:
    return statistics.median(values) if values else 0.0


def summary(drills: dict) -> dict:
    every_text = [n for d in drills.values() for n in d["text"]]
    every_structured = [n for d in drills.values() for n in d["structured"]]
    return {"answers": len(every_text), "median_text": _median(every_text),
            "median_structured": _median(every_structured),
            "score": sum(d["score"] for d in drills.values()), "drills": len(drills)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="another checkout to measure the same way, side by side")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(Path.cwd())))
        return
    runs = {}
    if args.before:
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child"], cwd=args.before, capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONPATH": args.before})
        runs["before"] = json.loads(out.stdout.strip().splitlines()[-1])
    runs["now"] = measure(ROOT)
    if args.json:
        print(json.dumps({k: {"drills": v, "summary": summary(v)} for k, v in runs.items()}))
        return
    print(f"{'drill':32} " + " ".join(f"{k + ' text':>12} {k + ' struct':>12} {k + ' score':>8}" for k in runs))
    for drill in runs["now"]:
        cells = []
        for run in runs.values():
            d = run.get(drill, {"text": [], "structured": [], "score": 0})
            cells.append(f"{_median(d['text']):12.0f} {_median(d['structured']):12.0f} {d['score']:8.1f}")
        print(f"{drill:32} " + " ".join(cells))
    for name, run in runs.items():
        s = summary(run)
        print(f"{name}: {s['answers']} answers over {s['drills']} drills, median text {s['median_text']:.0f} chars, "
              f"median structured {s['median_structured']:.0f} chars, score {s['score']:.1f}")
    if "before" in runs:
        common = runs["before"].keys() & runs["now"].keys()     # drills both checkouts have
        b, n = (summary({k: v for k, v in runs[r].items() if k in common}) for r in ("before", "now"))
        print(f"on the {len(common)} drills both have: before median text {b['median_text']:.0f}, structured "
              f"{b['median_structured']:.0f}; now {n['median_text']:.0f}, {n['median_structured']:.0f}")
        print(f"ratio now/before: text {n['median_text'] / max(b['median_text'], 1):.3f}, "
              f"structured {n['median_structured'] / max(b['median_structured'], 1):.3f}")


if __name__ == "__main__":
    main()
