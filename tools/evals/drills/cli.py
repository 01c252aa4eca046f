"""`mleng drill`: fault drills an agent must solve end to end.

    mleng drill list [--json]                    the scenarios, where each runs, and which CI runs
    mleng drill start ID [--json] [--wait-s S]   set the place up, inject, print the operator's message
    mleng drill grade ID --diagnosis FILE        score a diagnosis (JSON; FILE may be - for stdin)
    mleng drill stop                             undo everything (idempotent; also after a failed start)
    mleng drill baseline [ID ...] [--ci] [--wait-s S]  the scripted baseline agent: start, solve, grade, stop
    python -m tools.evals.drills.cli ...          (the same without the console script)

Only one drill runs at a time (the namespace cluster is one per machine). Its state is in
$MLENG_HOME/drill/state.json (0600); `stop` reads it and undoes each step in reverse.
"""

from __future__ import annotations

import argparse
import json
import sys

from ...shared.safe_read import read_limited
from .cluster import DrillError
from .grade import FORMAT_NOTES, MAX_DIAGNOSIS_BYTES, diagnosis_format, grade, parse_diagnosis
from .scenarios import ScenarioError, all_scenarios, load_scenario
from .session import start, stop


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mleng drill", description="fault drills for agents (evals/README.md)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="the scenarios")
    p_list.add_argument("--json", action="store_true")
    p_start = sub.add_parser("start", help="set a scenario up and print the operator's message")
    p_start.add_argument("id")
    p_start.add_argument("--json", action="store_true")
    p_start.add_argument("--wait-s", type=float, default=300, help="how long to wait for the namespace cluster")
    p_grade = sub.add_parser("grade", help="score a diagnosis")
    p_grade.add_argument("id")
    p_grade.add_argument("--diagnosis", required=True, help="a JSON file, or - for standard input")
    p_grade.add_argument("--json", action="store_true")
    sub.add_parser("stop", help="undo the running drill")
    p_base = sub.add_parser("baseline", help="the scripted baseline agent (no model)")
    p_base.add_argument("ids", nargs="*")
    p_base.add_argument("--ci", action="store_true", help="only the scenarios marked ci = true")
    p_base.add_argument("--json", action="store_true")
    p_base.add_argument("--wait-s", type=float, default=600, help="how long each drill waits for the namespace cluster")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            scenarios = all_scenarios()
            if args.json:
                print(json.dumps([{"id": s.id, "place": s.place, "nodes": s.nodes, "topic": s.topic, "ci": s.ci}
                                  for s in scenarios], indent=1))
            else:
                print(f"{'id':<28} {'runs on':<11} {'topic':<16} ci")
                for s in scenarios:
                    where = f"cluster x{s.nodes}" if s.place == "cluster" else s.place
                    print(f"{s.id:<28} {where:<11} {s.topic:<16} {'ci' if s.ci else ''}")
            return 0
        if args.command == "start":
            context = start(args.id, args.wait_s)
            if args.json:
                print(json.dumps(context, indent=1))
            else:
                print(start_text(args.id, context))
            return 0
        if args.command == "grade":
            scenario = load_scenario(args.id)
            result = grade(scenario, parse_diagnosis(read_diagnosis(args.diagnosis)))
            print(json.dumps(result.as_dict(), indent=1) if args.json
                  else f"{result.scenario}: score {result.score:g} — {result.reason}")
            return 0
        if args.command == "stop":
            problems = stop()
            for p in problems:
                print(f"not undone: {p}", file=sys.stderr)
            print("drill stopped" if not problems else f"drill stop left {len(problems)} problem(s); run it again")
            return 1 if problems else 0
        if args.command == "baseline":
            from .baseline import main as baseline_main

            return baseline_main(args.ids, ci_only=args.ci, as_json=args.json, wait_s=args.wait_s)
    except (ScenarioError, DrillError, ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 2


def read_diagnosis(name: str) -> str:
    """The diagnosis text: standard input for "-", else a regular file (safe_read: a FIFO, a device or a
    directory is refused, never waited on), at most MAX_DIAGNOSIS_BYTES either way (the agent wrote it)."""
    data = (sys.stdin.buffer.read(MAX_DIAGNOSIS_BYTES + 1) if name == "-"
            else read_limited(name, MAX_DIAGNOSIS_BYTES, field="--diagnosis"))
    if len(data) > MAX_DIAGNOSIS_BYTES:
        raise ValueError(f"the diagnosis is larger than {MAX_DIAGNOSIS_BYTES >> 20} MiB; a diagnosis is a small JSON object")
    return data.decode("utf-8", errors="replace")


def start_text(drill_id: str, context: dict) -> str:
    """What `drill start` prints: the operator's message, the place, the server, and how to answer."""
    lines = [context["message"] + "\n"]
    lines += [f"{key}: {context[key]}" for key in ("nodes", "partition", "env", "job_id") if key in context]
    lines.append("MCP server: " + " ".join(f"{k}={v}" for k, v in context.get("env", {}).items())
                 + (" " if context.get("env") else "") + " ".join(context["server"]) + " (stdio)")
    lines.append(f"When done: write the diagnosis as JSON, {diagnosis_format()}, to FILE ({FORMAT_NOTES}); then "
                 f"mleng drill grade {drill_id} --diagnosis FILE; then mleng drill stop")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
