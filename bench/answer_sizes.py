"""What a model reads of each answer in the drills, in characters and tokens, for both kinds of MCP host.

    python bench/answer_sizes.py                       # this checkout, every local (post-mortem) drill
    python bench/answer_sizes.py --before /path/to/old  # the same drills in another checkout too, side by side
    python bench/answer_sizes.py --before /tmp/6dba660 --bpe anthropic/tokenizer.json   # and byte-level BPE tokens
    python bench/answer_sizes.py --drills pm-clean-log pm-init-hang   # only these drills (the test's ten)

The scripted baseline (tools/evals/drills/baseline.py) plays each drill through the real server; every
answer it gets is measured twice: the text blocks (what Claude Desktop and other text-reading hosts hand
the model) and the structured content as compact JSON (what Claude Code, VS Code and Copilot's CLI hand it
instead; an answer without structured content, a tool error, reaches those hosts as its text, and is
counted so). Each view is counted in characters, in WordPiece tokens (the MiniLM tokenizer of the test
extra) and, with --bpe, in the tokens of that `tokenizers` file (bench/agent_reading_cost.py says which
one and where it comes from). Prints one row per drill (calls, score, medians of both views) and the
medians over all answers; --json for machines. A checkout given with --before is run the same way in a
child process, and its answers are counted by the same counters here.
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
VIEWS = ("text", "structured")


def measure(root: Path, names: list[str] | None = None) -> dict:
    """Every local drill (or those of `names`) played by the scripted baseline in the checkout `root`: per drill
    its score and the answers in both views, as strings."""
    sys.path.insert(0, str(root))
    from mcp import Client

    from tools.evals.drills.baseline import run_scenario
    from tools.evals.drills.scenarios import all_scenarios

    answers: list[dict] = []
    original = Client.call_tool

    async def recording(self, name, arguments=None, *args, **kwargs):
        result = await original(self, name, arguments, *args, **kwargs)
        text = "\n".join(getattr(b, "text", "") for b in result.content)
        structured = (json.dumps(result.structured_content, separators=(",", ":"), ensure_ascii=False)
                      if result.structured_content else text)
        answers.append({"tool": name, "text": text, "structured": structured})
        return result

    Client.call_tool = recording
    drills = {}
    for scenario in all_scenarios():
        if scenario.place != "local" or (names and scenario.id not in names):
            continue
        first = len(answers)
        attempt = run_scenario(scenario.id)
        drills[scenario.id] = {"score": attempt.score, "answers": answers[first:]}
    return drills


def counters(bpe: Path | None) -> dict:
    """unit -> a function counting it in a text: characters, WordPiece tokens where the test extra is installed,
    byte-level BPE tokens with --bpe."""
    sys.path.insert(0, str(ROOT / "bench"))
    from agent_reading_cost import token_counter, wordpiece

    units = {"chars": len, "tokens_wordpiece": wordpiece()}
    if bpe:
        units["tokens_bpe"] = token_counter(bpe)
    return {unit: count for unit, count in units.items() if count}


def sizes(drills: dict, units: dict) -> dict:
    """drill -> score, calls, tools and, per view and unit, the size of each answer."""
    out = {}
    for drill, played in drills.items():
        answers = played["answers"]
        out[drill] = {"score": played["score"], "calls": len(answers), "tools": [a["tool"] for a in answers],
                      **{view: {unit: [count(a[view]) for a in answers] for unit, count in units.items()}
                         for view in VIEWS}}
    return out


def medians(measured: dict, names=None) -> dict:
    """view -> unit -> the median over every answer of the drills `names` (all when None)."""
    chosen = [d for name, d in measured.items() if names is None or name in names]
    units = next(iter(chosen))["text"].keys() if chosen else ()
    return {view: {unit: statistics.median([n for d in chosen for n in d[view][unit]] or [0]) for unit in units}
            for view in VIEWS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="another checkout to measure the same way, side by side")
    parser.add_argument("--bpe", type=Path, metavar="TOKENIZER_JSON", help="also count tokens with this file")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--drills", nargs="+", metavar="ID", help="only these local drills (default: every one)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(Path.cwd(), args.drills)))
        return
    if args.bpe and not args.bpe.is_file():
        parser.error(f"--bpe {args.bpe}: no such file (a tokenizers JSON file)")
    units = counters(args.bpe)
    played = {}
    if args.before:
        out = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child",
                              *(["--drills", *args.drills] if args.drills else [])], cwd=args.before,
                             capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": args.before})
        played["before"] = json.loads(out.stdout.strip().splitlines()[-1])
    played["now"] = measure(ROOT, args.drills)
    runs = {name: sizes(drills, units) for name, drills in played.items()}
    common = set.intersection(*(set(r) for r in runs.values()))     # drills every checkout has
    report = {name: {"drills": run, "median": medians(run), "median_common": medians(run, common),
                     "score": sum(d["score"] for d in run.values())} for name, run in runs.items()}
    if "before" in runs:
        b, n = report["before"]["median_common"], report["now"]["median_common"]
        report["ratio_common"] = {v: {u: round(n[v][u] / max(b[v][u], 1), 3) for u in units} for v in VIEWS}
        report["common_drills"] = sorted(common)
    if args.json:
        print(json.dumps(report))
        return
    print_table(report, runs, units)


def print_table(report: dict, runs: dict, units: dict) -> None:
    """Per drill, all its answers added up (what the model read in it), each view and unit, before and now."""
    columns = [(name, view, unit) for name in runs for view in VIEWS for unit in units]
    print(f"{'drill':28} " + " ".join(f"{n[:3]} {v[:4]} {u.removeprefix('tokens_')[:5]:>5}" for n, v, u in columns))
    for drill in runs["now"]:
        cells = []
        for name, view, unit in columns:
            d = runs[name].get(drill)
            cells.append(f"{sum(d[view][unit]) if d else 0:>15,}")
        print(f"{drill:28} " + " ".join(cells))
    for name, rep in report.items():
        if name in ("before", "now"):
            print(f"{name}: score {rep['score']:g}; median over all drills {json.dumps(rep['median'])}; "
                  f"over the drills both have {json.dumps(rep['median_common'])}")
    if "ratio_common" in report:
        print(f"ratio now/before on the {len(report['common_drills'])} drills both have: "
              f"{json.dumps(report['ratio_common'])}")


if __name__ == "__main__":
    main()
