"""`mleng eval`: score a baseline router's first tool call on the eval cases.

    mleng eval --cases evals/cases.jsonl --router bm25 --split heldout
    mleng eval --cases evals/cases.jsonl --router hybrid --json
    mleng eval --cases evals/cases.jsonl --split tune --descriptions new.json   # try a wording first
    python -m tools.evals.run --cases FILE ...    (the same, without the console script)

Tool names and descriptions come from the live MCP server through the in-memory client
(`list_tools`), so what is scored is exactly what an agent sees. The abstention threshold (and the
hybrid's weight) are calibrated on the tune splits of evals/cases.jsonl and evals/public_cases.jsonl,
never on the cases scored, unless those are a tune split themselves.
"""

import argparse
import json
import sys
import time
from pathlib import Path

from ..engine.data import EVAL_CASES_DIR
from .metrics import NONE, evaluate, load_cases
from .routers import ROUTERS, ToolText, calibrate, make_router, rankings

TUNE_CASES = (EVAL_CASES_DIR / "cases.jsonl", EVAL_CASES_DIR / "public_cases.jsonl")


def live_tools() -> list[ToolText]:
    """list_tools() from the real server over the in-memory MCP client."""
    import anyio
    from mcp import Client

    from ..engine.mcp_server import build_server

    async def fetch():
        async with Client(build_server()) as client:
            return (await client.list_tools()).tools

    return [ToolText(t.name, t.description or "", t.title or "") for t in anyio.run(fetch)]


def route(router_kind: str, tools: list[ToolText], cases: list[dict], tune: list[dict]) -> tuple[list[list[str]], dict]:
    """Rankings for `cases`, with the router calibrated on `tune`. Also returns the calibration."""
    router = make_router(router_kind, tools)
    threshold = calibrate(router, tune)
    scores = router.scores([c["symptom"] for c in cases])
    calibration = {"threshold": round(threshold, 4)}
    if router_kind == "hybrid":
        calibration.update(weight=router.weight, scales=[round(s, 4) for s in router.scales])
    if router_kind == "pages":
        calibration.update(weights=list(router.weights), scales=[round(s, 4) for s in router.scales])
    return rankings(scores, router.tools, threshold), calibration


def _fmt_rate(report: dict, key: str) -> str:
    value = report[key]
    if value is None:
        return f"{key:<20} n/a (no cases)"
    k, n = report["counts"][key]
    lo, hi = report["ci95"][key]
    return f"{key:<20} {value:6.1%}  ({k}/{n}, 95% CI {lo:.1%}-{hi:.1%})"


def format_report(report: dict) -> str:
    lines = [f"router {report['router']} on {report['cases']} split={report['split']}: n={report['n']} "
             f"(threshold {report['calibration']['threshold']}, {report['seconds']} s)"]
    for key in ("top1", "top1_acceptable", "top3", "abstain_accuracy", "false_call_rate", "false_abstain_rate"):
        lines.append("  " + _fmt_rate(report, key))
    lines.append("  top1 by difficulty: " + ", ".join(f"{k} {v['top1']:.0%} (n={v['n']})"
                                                   for k, v in report["by_difficulty"].items()))
    lines.append("  per tool (first call):       support  predicted  precision  recall")
    for label, row in report["per_tool"].items():
        p = "-" if row["precision"] is None else f"{row['precision']:.2f}"
        r = "-" if row["recall"] is None else f"{row['recall']:.2f}"
        lines.append(f"    {label:<26} {row['support']:>7} {row['predicted']:>10} {p:>10} {r:>7}")
    if report["confusion"]:
        lines.append("  wrong first calls (expected -> predicted: count, ids):")
        for row in report["confusion"][:15]:
            lines.append(f"    {row['expected']} -> {row['predicted']}: {row['count']}  {', '.join(row['ids'][:6])}")
    return "\n".join(lines)


def cases_path(given: str) -> Path:
    """`given` when it is a file; else the shipped file of that name, so the README's
    `mleng eval --cases evals/cases.jsonl` works from the wheel and from any directory."""
    path = Path(given)
    shipped = EVAL_CASES_DIR / path.name
    return path if path.is_file() or not shipped.is_file() else shipped


def with_descriptions(tools: list[ToolText], overrides: dict) -> list[ToolText]:
    """`tools` with the descriptions in `overrides` ({name: text}) swapped in."""
    unknown = sorted(set(overrides) - {t.name for t in tools})
    if unknown or not all(isinstance(v, str) for v in overrides.values()):
        raise ValueError(f"expected {{tool name: description}} for known tools; unknown: {unknown}")
    return [ToolText(t.name, overrides.get(t.name, t.description), t.title) for t in tools]


def check_names(cases: list[dict], tools: list[ToolText]) -> list[str]:
    """Tool names that cases use but the server does not offer."""
    known = {t.name for t in tools} | {NONE}
    return sorted({n for c in cases for n in c["expected"] + c["acceptable"] if n not in known})


def main(argv: list[str] | None = None, tools: list[ToolText] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mleng eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="cases.jsonl",
                        help="JSON-lines cases file (schema in tools/evals/metrics.py); a name the package ships "
                             "(cases.jsonl, public_cases.jsonl, or evals/<name> as in a checkout) is found in it "
                             "[default: the shipped cases.jsonl]")
    parser.add_argument("--router", choices=ROUTERS, default="bm25", help="baseline router (default bm25)")
    parser.add_argument("--split", default="all",
                        help="which cases of the file to score: tune, heldout or all (default all)")
    parser.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    parser.add_argument("--descriptions", metavar="FILE",
                        help="what-if: a JSON object {tool: description} that replaces those live descriptions "
                             "(try a wording on the tune split before editing the tool)")
    args = parser.parse_args(argv)

    started = time.monotonic()
    args.cases = str(cases_path(args.cases))
    try:
        cases = load_cases(args.cases, args.split)
        tune = [c for path in TUNE_CASES for c in load_cases(path, "tune")]
    except (OSError, ValueError) as e:
        print(f"mleng eval: {e}", file=sys.stderr)
        return 2
    if not cases:
        print(f"mleng eval: no cases with split={args.split} in {args.cases}", file=sys.stderr)
        return 2
    tools = tools if tools is not None else live_tools()
    if args.descriptions:
        try:
            tools = with_descriptions(tools, json.loads(Path(args.descriptions).read_text()))
        except (OSError, ValueError) as e:
            print(f"mleng eval: --descriptions {args.descriptions}: {e}", file=sys.stderr)
            return 2
    unknown = check_names(cases, tools)
    if unknown:  # scored as misses: no router can pick a tool the server does not offer
        print(f"mleng eval: warning: cases name tools the server does not offer: {', '.join(unknown)}",
              file=sys.stderr)
    try:
        ranked, calibration = route(args.router, tools, cases, tune)
    except RuntimeError as e:  # e.g. the embedding weights are not installed
        print(f"mleng eval: {e}", file=sys.stderr)
        return 2
    report = {"router": args.router, "cases": str(args.cases), "split": args.split, **evaluate(cases, ranked),
              "calibration": calibration, "seconds": round(time.monotonic() - started, 1),
              "predictions": [{"id": c["id"], "expected": c["expected"], "top3": r[:3]} for c, r in zip(cases, ranked)]}
    print(json.dumps(report, indent=1) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
