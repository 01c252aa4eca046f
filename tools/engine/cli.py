"""`mleng` — the command line: a generic loop over the registry, like the server.

    mleng list                                   the tools, one line each
    mleng run TOOL [--field value ...] [--json]  run one tool (same as python -m tools.TOOL ...)
    mleng doctor [--json]                        quick, safe checks of this machine
    mleng serve [--http HOST:PORT [--no-auth]]   the MCP server (same as python server.py)
    mleng eval --cases FILE [--router bm25]      tool-selection evals (tools/evals/run.py)
    mleng drill list|start|grade|stop|baseline  fault drills (tools/evals/drills/cli.py)

`python -m tools.<name>` is `tool_main(SPEC)` here: the same parser and the same execution path.
"""

import argparse
import json
import sys
import threading
import types
import typing

from pydantic import ValidationError

from .data import PACKAGE
from .processes import interrupt_on_sigterm
from .rendering import format_result, validation_problems
from .spec import ToolFailure, ToolSpec, takes_node


# ---------------------------------------------------------------------------------------------------
# One tool from argv

def _is_list(annotation) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_is_list(a) for a in typing.get_args(annotation) if a is not type(None))
    return origin in (list, tuple, set)


def _is_bool(annotation) -> bool:
    return annotation is bool or (typing.get_origin(annotation) in (typing.Union, types.UnionType)
                                  and bool in typing.get_args(annotation))


def tool_parser(spec: ToolSpec, prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=spec.description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, field in spec.Params.model_fields.items():
        flags = [f"--{name.replace('_', '-')}"] + ([f"--{name}"] if "_" in name else [])
        default = "(required)" if field.is_required() else repr(
            field.default_factory() if field.default_factory else field.default)
        help_text = f"{field.description} [default: {default}]".replace("%", "%%")  # argparse formats help with %
        if _is_bool(field.annotation):
            parser.add_argument(*flags, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        elif _is_list(field.annotation):
            # extend: a repeated flag adds to the list (--extra-sbatch=--qos=high --extra-sbatch=--exclusive)
            parser.add_argument(*flags, dest=name, nargs="+", action="extend", default=None, help=help_text)
        else:
            parser.add_argument(*flags, dest=name, default=None, help=help_text)
    parser.add_argument("--json", action="store_true", help="print the result as JSON (for machines)")
    parser.add_argument("--timeout-s", type=float, default=None,
                        help=f"stop the run after this many seconds [default: {spec.timeout_s:g}]")
    if takes_node(spec):
        parser.add_argument("--node", default=None, help="run on this SLURM node through srun (inside the "
                            "allocation that holds it, else a one-node job of its own)")
    if "wait_s" not in spec.Params.model_fields:       # job_status's wait_s is its own (how long it waits)
        parser.add_argument("--wait-s", dest="call_wait_s", type=float, default=None,
                            help="print the job handle (what an MCP caller gets) if the run is still going after "
                                 "this many seconds, then keep following it: a job cannot outlive this command")
    return parser


def _coerce(value):
    """CLI strings are handed to pydantic, which converts them; JSON objects/lists are parsed first."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def run_tool_cli(spec: ToolSpec, argv: list[str], prog: str) -> int:
    from .jobs import MANAGER, Cancelled, wait

    args = tool_parser(spec, prog).parse_args(argv)
    raw = {k: _coerce(v) for k, v in vars(args).items() if k in spec.Params.model_fields and v is not None}
    try:
        params = spec.Params(**raw)
    except ValidationError as e:
        for line in validation_problems(e, flag_style=True):
            print(f"error: {line}", file=sys.stderr)
        return 2
    progress = ProgressBar() if (sys.stderr.isatty() and not args.json) else None
    interrupt_on_sigterm()  # `timeout 60 mleng run ...` must not leave ranks behind
    try:
        job = MANAGER.start(spec, params, args.timeout_s, node=getattr(args, "node", None))
        if getattr(args, "call_wait_s", None) is not None:
            interim = wait(job, args.call_wait_s, progress)
            if interim.job is not None:
                _print_result(spec, interim, args.json, progress)
        result = wait(job, float("inf"), progress)
    except KeyboardInterrupt:
        MANAGER.cancel_all()
        print("\ninterrupted: every process of the run was killed", file=sys.stderr)
        return 130
    except (Cancelled, ToolFailure) as e:
        if progress:
            progress.clear()
        print(f"error: {e}", file=sys.stderr)
        return 1
    _print_result(spec, result, args.json, progress)
    return {"ok": 0, "info": 0, "warn": 0, "fail": 3}[result.verdict]


def _print_result(spec: ToolSpec, result, as_json: bool, progress) -> None:
    if progress:
        progress.clear()
    print(json.dumps(result.model_dump(mode="json"), indent=1) if as_json else format_result(spec, result), flush=True)


def tool_main(spec: ToolSpec) -> None:
    """`python -m tools.<name> [--field value ...] [--json]`: run one tool from the command line."""
    sys.exit(run_tool_cli(spec, sys.argv[1:], prog=f"python -m {PACKAGE}.{spec.name}"))


class ProgressBar:
    """A one-line progress bar on stderr (only on a terminal)."""

    def __init__(self, width: int = 30):
        self.width, self.lock = width, threading.Lock()

    def __call__(self, fraction: float, message: str) -> None:
        done = int(self.width * min(max(fraction, 0.0), 1.0))
        with self.lock:
            sys.stderr.write(f"\r[{'#' * done}{' ' * (self.width - done)}] {fraction:4.0%} {message[:70]:<70}")
            sys.stderr.flush()

    def clear(self) -> None:
        sys.stderr.write("\r" + " " * (self.width + 80) + "\r")
        sys.stderr.flush()


# ---------------------------------------------------------------------------------------------------

def run_help() -> int:
    """`mleng run` / `mleng run --help`: how to run one tool, and the tools."""
    from .registry import registry

    print("usage: mleng run TOOL [--field value ...] [--json] [--timeout-s S]\n\n"
          "Runs one tool and prints its answer (--json: the result as JSON). A tool's own fields: mleng run TOOL "
          "--help.\nMeasuring tools run in the Python your jobs use: $MLENG_PYTHON (default: this Python).\n\ntools:")
    for spec in registry().values():
        print(f"  {spec.name:<24} {spec.summary}")
    return 0


def tool_table(specs) -> str:
    """The README's tool table, from the specs: name, summary and where the tool runs."""
    from .spec import takes_node

    def runs(spec) -> str:
        if spec.runs == "in_process":
            return "in-process"
        return "subprocess, across nodes" if spec.spans_nodes else (
            "subprocess, `node=` for another node" if takes_node(spec) else "subprocess")

    rows = [f"| `{s.name}` | {s.summary} | {runs(s)} |" for s in sorted(specs, key=lambda s: s.name)]
    return "\n".join(["| tool | what it answers | runs |", "|---|---|---|", *rows]) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["eval"]:  # the eval harness owns its flags; argparse's REMAINDER would refuse leading options
        from ..evals.run import main as eval_main

        return eval_main(argv[1:])
    if argv[:1] == ["drill"]:  # fault drills (tools/evals/drills): their own subcommands and flags
        from ..evals.drills.cli import main as drill_main

        return drill_main(argv[1:])
    if argv[:1] == ["run"] and argv[1:2] in ([], ["-h"], ["--help"]):
        return run_help()
    parser = argparse.ArgumentParser(prog="mleng", description="GPU cluster diagnostics and benchmarks for ML engineers")
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="list the tools")
    p_list.add_argument("--markdown", action="store_true", help="the README's tool table (tests/test_cli.py checks it)")
    p_run = sub.add_parser("run", help="run one tool: mleng run TOOL --help", add_help=False)
    p_run.add_argument("tool")
    p_run.add_argument("rest", nargs=argparse.REMAINDER)
    p_doc = sub.add_parser("doctor", help="quick, safe checks of this machine")
    p_doc.add_argument("--json", action="store_true")
    p_srv = sub.add_parser("serve", help="run the MCP server (stdio, or --http HOST:PORT)")
    from .http_guard import add_serve_arguments

    add_serve_arguments(p_srv)
    sub.add_parser("eval", help="tool-selection evals: mleng eval --cases FILE [--router bm25|embed|hybrid] [--json]")
    sub.add_parser("drill", help="fault drills: mleng drill list|start ID|grade ID --diagnosis FILE|stop|baseline")
    args = parser.parse_args(argv)

    if args.command == "list":
        from .registry import registry

        if args.markdown:
            print(tool_table(registry().values()), end="")
            return 0
        for spec in registry().values():
            print(f"{spec.name:<24} {spec.runs:<11} {spec.summary}")
        return 0
    if args.command == "run":
        from .registry import get_spec

        try:
            spec = get_spec(args.tool)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return run_tool_cli(spec, args.rest, prog=f"mleng run {spec.name}")
    if args.command == "doctor":
        from .doctor import doctor

        return doctor(args.json)
    if args.command == "serve":
        from .job_python import set_job_python
        from .mcp_server import serve

        if args.python:
            set_job_python(args.python)
        serve(args.http, args.no_auth)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
