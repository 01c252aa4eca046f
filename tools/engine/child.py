"""Child side of a subprocess tool: `python -m tools.engine.child TOOL [MODULE]`, params as JSON on stdin.

MODULE (a dotted name or a .py path) is where the spec lives when it is not `tools.TOOL`: tests use
it for fault-injection tools that must not be in the registry.

Protocol (JSON lines on stdout, nothing else there):
    {"event": "progress", "fraction": 0.25, "message": "..."}     zero or more
    {"event": "image", "field": "plot_png", "png": "<base64>"}      per image field, read from the descriptor
                                                                    it was written through (attachments.py)
    {"event": "result", "result": {...}, "provenance": {...}}      exactly one on success
    {"event": "error", "message": "..."}                            on a ToolFailure
Anything the tool (or a library, or C code) prints goes to stderr: file descriptor 1 is pointed at
stderr before the tool runs, and the protocol writes to a private duplicate of the original stdout.
Exit status 0 after a result or error event; anything else is a crash the parent reports.
"""

import base64
import json
import os
import sys


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print("usage: python -m tools.engine.child TOOL_NAME [MODULE] < params.json", file=sys.stderr)
        return 2
    wire = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # stray prints, C libraries and NCCL logs must not corrupt the wire
    sys.stdout = sys.stderr

    def emit(event: dict) -> None:
        wire.write(json.dumps(event, default=str) + "\n")
        wire.flush()

    try:
        return _run(sys.argv[1:], emit)
    except ModuleNotFoundError as e:   # the job's Python lacks what the tool imports: say what to set, no traceback
        from .job_python import missing_module_message

        emit({"event": "error", "message": missing_module_message(sys.argv[1], e.name or str(e), sys.executable)})
        return 0


def _run(args: list[str], emit) -> int:
    import importlib.util
    import platform

    from . import attachments
    from .bounds import bound_result
    from .job_python import missing_module_message, stack_provenance
    from .registry import load_spec
    from .spec import ToolFailure
    from .on_node import NODE_ENV
    from .store import host_provenance, torch_provenance

    spec = load_spec(*args)
    if spec.needs_torch and importlib.util.find_spec("torch") is None:
        emit({"event": "error", "message": missing_module_message(spec.name, "torch", sys.executable)})
        return 0
    params = spec.Params.model_validate_json(sys.stdin.read())

    def progress(fraction: float, message: str) -> None:
        emit({"event": "progress", "fraction": float(fraction), "message": str(message)})

    attachments.collect()
    try:
        result = spec.run(params, progress)
    except ToolFailure as e:
        emit({"event": "error", "message": str(e)})
        return 0
    result = bound_result(spec, result)   # a huge result is cut here, before it crosses the pipe
    for field in type(result).image_fields:   # one line each: a line is at most processes.MAX_LINE_BYTES
        data = attachments.read(getattr(result, field, None) or "")
        if data is not None:
            emit({"event": "image", "field": field, "png": base64.b64encode(data).decode()})
    provenance = torch_provenance()
    if spec.job_python:   # the job's Python, whose stack the answer is about
        provenance = {**stack_provenance(), "python": platform.python_version(), "python_path": sys.executable}
    if os.environ.get(NODE_ENV):   # started on a named node: the node's host, GPUs and driver, not the caller's
        provenance = {**host_provenance(), **provenance}
    emit({"event": "result", "result": result.model_dump(mode="json"), "provenance": provenance})
    return 0


if __name__ == "__main__":
    sys.exit(main())
