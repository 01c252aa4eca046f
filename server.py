"""mleng MCP server: every tool in the registry, the knowledge tree as resources, a diagnose prompt.

    python server.py                       # stdio (what MCP hosts launch)
    python server.py --http 127.0.0.1:8765 # streamable HTTP at /mcp
    MLENG_HTTP_TOKEN=... python server.py --http 0.0.0.0:8765   # beyond loopback a bearer token is required

Wiring only: tools are built by one loop over `tools.registry()`; nothing here names a tool. Anything
that touches a GPU runs in a child process (tools/runner.py); this process never imports torch.
"""

import argparse
import hmac
import inspect
import ipaddress
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp.types import CallToolResult, ImageContent, TextContent, ToolAnnotations
from pydantic import Field, ValidationError

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `python /path/to/server.py` from anywhere

from tools import registry  # noqa: E402
from tools.harness import KNOWLEDGE_DIR, Params, ToolFailure, ToolSpec, interrupt_on_sigterm  # noqa: E402
from tools.jobs import MANAGER  # noqa: E402
from tools.runner import execute  # noqa: E402

log = logging.getLogger("mleng")
TOKEN_ENV = "MLENG_HTTP_TOKEN"
VERSION = "0.1.0"

INSTRUCTIONS = """mleng runs real diagnostics and benchmarks on this machine's GPUs, network, storage and
SLURM cluster, and reads the answers against known-good figures. Measure before guessing; start with
cheap read-only probes (env_report, gpu_health, log_triage) before GPU-heavy benchmarks. Each result
has a verdict, findings with units, and `next`: tools or knowledge:// pages to go to next. Long runs
return a job handle: follow it with job_status. Read knowledge://index for the reference shelf."""


def _common_params(spec: ToolSpec) -> list[inspect.Parameter]:
    """wait_s / timeout_s, offered on every subprocess tool."""
    if spec.runs != "subprocess":
        return []
    wait = Annotated[float, Field(ge=0, le=3600, description=(
        "Seconds to wait for the result. If the run takes longer, the call returns a job handle "
        "(result.job.job_id) and the run continues: follow it with job_status."))]
    timeout = Annotated[float, Field(ge=1, le=86400, description=(
        "Hard limit in seconds: past it every process of the run is killed and the call fails."))]
    return [inspect.Parameter("wait_s", inspect.Parameter.KEYWORD_ONLY, default=60.0, annotation=wait),
            inspect.Parameter("timeout_s", inspect.Parameter.KEYWORD_ONLY, default=spec.timeout_s,
                              annotation=timeout)]


def _flat_params(spec: ToolSpec) -> list[inspect.Parameter]:
    """One MCP argument per Params field, with its type, bounds and description (flat: easier for agents)."""
    out = []
    for name, field in spec.Params.model_fields.items():
        annotation = Annotated[(field.annotation, *field.metadata,
                                Field(description=field.description, examples=field.examples))]
        if field.default_factory is not None:
            default = field.default_factory()
        elif field.is_required():
            default = inspect.Parameter.empty
        else:
            default = field.default
        out.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation))
    return out


TEXT_JSON_LIMIT = 12_000  # characters of JSON in the text copy; structuredContent always has everything


def _to_call_result(spec: ToolSpec, result) -> CallToolResult:
    """Text: the human summary, then the result's JSON, bounded. Structured content: the whole result."""
    from tools.cli import format_result

    data = json.dumps(result.model_dump(mode="json", exclude_none=True), separators=(",", ":"))
    if len(data) > TEXT_JSON_LIMIT:
        data = (data[:TEXT_JSON_LIMIT] + f"… [truncated: {len(data)} characters in all; the structured result "
                "holds everything]")
    content: list[Any] = [TextContent(type="text", text=f"{format_result(spec, result)}\n\nResult JSON:\n{data}")]
    plot = getattr(result, "plot_png", None)  # a tool that draws a plot names the PNG file here
    if plot and Path(plot).is_file() and Path(plot).stat().st_size < 5_000_000:
        import base64

        content.append(ImageContent(type="image", mime_type="image/png",
                                    data=base64.b64encode(Path(plot).read_bytes()).decode()))
    return CallToolResult(content=content, structured_content=result.model_dump(mode="json"))


def _validation_message(spec: ToolSpec, e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        where = ".".join(str(x) for x in err["loc"]) or "(arguments)"
        parts.append(f"{where}: {err['msg']} (got {err.get('input')!r})")
    return f"invalid arguments for {spec.name}: " + "; ".join(parts)


def make_tool_function(spec: ToolSpec):
    """An async MCP tool function for `spec`, with a signature the SDK turns into the input schema."""
    param_names = list(spec.Params.model_fields)

    allowed = set(param_names) | ({"wait_s", "timeout_s"} if spec.runs == "subprocess" else set())

    async def call(ctx: Context, **kwargs) -> Any:
        # The SDK drops arguments it does not know; an agent that misspells one must hear about it.
        raw = getattr(getattr(ctx, "_input_params", None), "arguments", None) or {}
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise ToolError(f"unknown argument(s) for {spec.name}: {', '.join(unknown)}; "
                            f"accepted: {', '.join(sorted(allowed))}")
        try:
            params = spec.Params(**{k: kwargs[k] for k in param_names if k in kwargs})
        except ValidationError as e:
            raise ToolError(_validation_message(spec, e)) from None
        if spec.runs == "in_process":
            try:
                result = await anyio.to_thread.run_sync(execute, spec, params)
            except ToolFailure as e:
                raise ToolError(str(e)) from None
            except Exception as e:
                log.exception("tool %s failed", spec.name)
                raise ToolError(f"internal error in {spec.name}: {type(e).__name__}: {e}") from None
            return _to_call_result(spec, result)
        return await _run_job(ctx, spec, params, kwargs.get("wait_s", 60.0), kwargs.get("timeout_s"))

    parameters = [inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context)]
    parameters += _flat_params(spec) + _common_params(spec)
    returns = Annotated[CallToolResult, spec.Result]
    call.__signature__ = inspect.Signature(parameters, return_annotation=returns)
    call.__annotations__ = {p.name: p.annotation for p in parameters} | {"return": returns}
    call.__name__ = spec.name
    return call


async def _run_job(ctx: Context, spec: ToolSpec, params: Params, wait_s: float, timeout_s: float | None):
    job = MANAGER.start(spec, params, timeout_s)
    deadline = time.monotonic() + wait_s
    reported = -1.0
    try:
        while not job.finished.is_set() and time.monotonic() < deadline:
            if job.fraction > reported:
                reported = job.fraction
                await ctx.report_progress(round(reported * 100, 1), total=100, message=job.message)
            await anyio.sleep(0.1)
    except BaseException:  # client cancelled the call while we waited: stop the run, free the GPUs
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(job.cancel)
        raise
    if not job.finished.is_set():
        from tools.harness import JobRef

        handle = spec.Result(verdict="info", job=JobRef(job_id=job.id, state=job.state, elapsed_s=job.elapsed_s()),
                             findings=[f"{spec.name} is still running after {job.elapsed_s():.0f} s"
                                       f" ({job.fraction:.0%}: {job.message}). Follow it with"
                                       f" job_status(job_id='{job.id}'); stop it with job_cancel."],
                             next=["job_status", "job_cancel"])
        return _to_call_result(spec, handle)
    if job.state != "done":
        raise ToolError(job.error or f"{spec.name} {job.state}")
    return _to_call_result(spec, job.result)


def _annotations(spec: ToolSpec) -> ToolAnnotations:
    return ToolAnnotations(title=spec.summary, read_only_hint=spec.read_only, destructive_hint=spec.destructive,
                           idempotent_hint=spec.idempotent, open_world_hint=spec.open_world)


def _read_knowledge(path: str) -> str:
    """A file under knowledge/, refusing anything that resolves outside it."""
    root = KNOWLEDGE_DIR.resolve()
    target = (root / path).resolve()
    if not target.is_relative_to(root) or target.suffix not in (".md", ".toml") or not target.is_file():
        raise ResourceNotFoundError(
            f"no knowledge page {path!r}: read knowledge://index for the list of pages")
    return target.read_text()


def knowledge_index() -> str:
    """A markdown list of every page: URI, title, summary (from each page's frontmatter)."""
    from tools._knowledge import load_pages

    lines = ["# mleng knowledge index", "", "Read a page with its URI. Search with the knowledge_search tool.", ""]
    for page in load_pages():
        lines.append(f"- `knowledge://{page.path}` — **{page.title}**: {page.summary}")
    return "\n".join(lines) + "\n"


def build_server(specs: list[ToolSpec] | None = None) -> MCPServer:
    """The MCP server over `specs` (default: every tool in the registry; tests add fault-injection tools)."""
    server = MCPServer("mleng", title="mleng — GPU cluster diagnostics", version=VERSION, instructions=INSTRUCTIONS)
    for spec in registry().values() if specs is None else specs:
        server.add_tool(make_tool_function(spec), name=spec.name, title=spec.summary,
                        description=spec.description, annotations=_annotations(spec), structured_output=True)

    server.resource("knowledge://index", name="knowledge-index", title="Knowledge tree index",
                    description="Every knowledge page with its URI, title and one-line summary.",
                    mime_type="text/markdown")(knowledge_index)

    @server.resource("knowledge://{+path}", name="knowledge-page", title="Knowledge page",
                     description="A page of the mleng knowledge tree (markdown) or a data table (TOML).",
                     mime_type="text/markdown")
    def knowledge_page(path: str) -> str:
        return _read_knowledge(path)

    @server.prompt(name="diagnose", title="Diagnose a GPU-cluster problem")
    def diagnose(symptom: str) -> str:
        """Turn a symptom into an ordered plan of mleng tool calls."""
        tools = "\n".join(f"- {s.name}: {s.summary}" for s in registry().values())
        return (f"A user reports: {symptom}\n\nWork out the cause with measurements, not guesses. Plan first: "
                "list the 2-4 tools below that bear on this symptom, cheapest and read-only first (version and "
                "health checks, log triage) before GPU-heavy benchmarks or multi-rank runs, and say what each "
                "result would rule in or out. Search the knowledge tree (knowledge_search) for what the numbers "
                "should be. Then run the first tool, read its verdict, findings and `next`, and continue. "
                f"Finish with the named culprit (rank, node, link, setting) and the fix.\n\nTools:\n{tools}")

    return server


# ---------------------------------------------------------------------------------------------------
# HTTP: loopback by default; any other address needs a bearer token that every request must carry.

def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class BearerTokenMiddleware:
    """Pure ASGI: refuse every HTTP request whose Authorization header is not `Bearer <token>`."""

    def __init__(self, app, token: str):
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            got = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(got, self.expected):
                body = b'{"error": "missing or wrong bearer token (Authorization: Bearer $MLENG_HTTP_TOKEN)"}'
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def http_app(server: MCPServer, host: str):
    """The streamable-HTTP ASGI app, guarded by a token when one is set or the bind is not loopback."""
    token = os.environ.get(TOKEN_ENV, "")
    if not _is_loopback(host) and not token:
        raise SystemExit(f"refusing to serve HTTP on {host} without a token: these tools read logs and occupy "
                         f"GPUs. Set {TOKEN_ENV} to a long random secret (clients send 'Authorization: Bearer "
                         "<token>'), or bind to 127.0.0.1.")
    app = server.streamable_http_app(host=host)
    return BearerTokenMiddleware(app, token) if token else app


def serve(http: str | None = None) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    server = build_server()
    interrupt_on_sigterm()  # a host stopping the server with SIGTERM still gets every job's ranks killed
    try:
        if not http:
            server.run()
            return
        host, _, port = http.rpartition(":")
        if not host or not port.isdigit():
            raise SystemExit(f"--http wants HOST:PORT, e.g. 127.0.0.1:8765; got {http!r}")
        host = host.strip("[]")
        app = http_app(server, host)
        import uvicorn

        uvicorn.run(app, host=host, port=int(port), log_level="warning")
    finally:
        MANAGER.cancel_all()  # nothing outlives the server: no orphan ranks holding GPUs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python server.py", description="mleng MCP server (stdio by default)")
    parser.add_argument("--http", metavar="HOST:PORT", help="serve streamable HTTP at http://HOST:PORT/mcp")
    args = parser.parse_args(argv)
    serve(args.http)


if __name__ == "__main__":
    main()
