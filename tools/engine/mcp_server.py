"""The MCP wiring: every tool in the registry, the knowledge tree as resources, a diagnose prompt.

    mleng serve                              # stdio (what MCP hosts launch); also `python server.py`
    mleng serve --http 127.0.0.1:8765        # streamable HTTP at /mcp; prints a random bearer token
    MLENG_HTTP_TOKEN=... mleng serve --http 0.0.0.0:8765   # your own token (>= 32 characters)
    mleng serve --http 127.0.0.1:8765 --no-auth   # no token: only where no other user logs in

Generic: one loop over `registry()` builds the tool list, and every call goes through the same path
(validate off the event loop -> JobManager.start -> wait up to wait_s -> result or job handle).
Nothing here names a tool. Tool input schemas are the tools' own Params schemas, compacted
(schemas.py), not schemas rebuilt from a function signature.
Anything that touches a GPU runs in a child process (runner.py); this process never imports torch.
"""

import argparse
import base64
import functools
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.server import MCPServer
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ResourceNotFoundError, ToolError
from mcp.types import CallToolResult, ImageContent, TextContent, ToolAnnotations
from mcp.types import Tool as MCPTool
from pydantic import Field, ValidationError

from .data import PACKAGE_DIR
from .home import UnsafeHome, private_dir, read_private, write_private
from .job_python import set_job_python
from .jobs import ANONYMOUS, MANAGER, Busy, Cancelled, Job
from .registry import registry
from .schemas import compact, for_hosts, without_guards
from .rendering import answer_record, answer_text, validation_message
from .on_node import NODE_MAX_CHARS, NODE_PATTERN
from .spec import SUBPROCESS_TIMEOUT_S, Params, ToolFailure, ToolSpec, takes_node

log = logging.getLogger("mleng")

# The execution options' bounds, stated once in INSTRUCTIONS and enforced by CallOptions.
WAIT_MAX_S, TIMEOUT_MAX_S = 3600, 86400

INSTRUCTIONS = f"""mleng runs real diagnostics and benchmarks on this machine's GPUs, network, storage and
SLURM cluster and reads them against known-good figures. Cheap read-only probes (env_report, gpu_health,
log_triage) before GPU benchmarks. Each result has a verdict, findings with units, and `next` (tools or
knowledge:// pages; knowledge://index lists them).
Execution options, where a tool's schema lists them:
- wait_s (seconds, 0-{WAIT_MAX_S}, default 60): how long the call waits; a longer run answers with a job
  handle (result.job.job_id): follow it with job_status, stop it with job_cancel.
- timeout_s (seconds, 1-{TIMEOUT_MAX_S}; {SUBPROCESS_TIMEOUT_S:g} unless the schema shows a default): past it the run is
  killed and the call fails.
- node (a node name: letters, digits, _ . -): run the tool on that node (srun; ssh without SLURM).
Optional fields may be left out (null means the same); a boolean left out is false unless its schema
says otherwise; a number shown without a lower bound is positive (an integer >= 1);
unknown arguments are refused. Guards are enforced but not shown: lengths from 32 characters, lists
from 20 items, maxima from 100,000, character-set patterns."""



def version() -> str:
    """The installed package's version (pyproject.toml is the one place it is written)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("mleng")
    except PackageNotFoundError:  # a checkout that was never installed
        return "0+checkout"


class CallOptions(Params):
    """How long a subprocess tool's call waits and how long its run may take (not the tool's own inputs)."""

    # Described once, in INSTRUCTIONS: 17 copies of the same two sentences cost every agent ~4 KB.
    wait_s: float = Field(60.0, ge=0, le=WAIT_MAX_S, description="Seconds the call waits (server instructions).")
    timeout_s: float | None = Field(None, ge=1, le=TIMEOUT_MAX_S, description="Hard limit, seconds (server instructions).")
    node: str | None = Field(None, max_length=NODE_MAX_CHARS, pattern=NODE_PATTERN,
                             description="SLURM node to run on (server instructions).")


@functools.cache
def input_schema(spec: ToolSpec) -> dict:
    """The tool's Params schema as hosts take it (schemas.for_hosts), plus wait_s / timeout_s (and node) on
    subprocess tools, with only their type and the tool's own timeout: the server instructions say once what
    they do and their bounds, and CallOptions enforces them (built once per tool)."""
    schema = for_hosts(spec.Params.model_json_schema())
    if spec.runs == "subprocess":
        timeout = {"type": "number"} | ({} if spec.timeout_s == SUBPROCESS_TIMEOUT_S else {"default": spec.timeout_s})
        schema["properties"] = {**schema.get("properties", {}), "wait_s": {"type": "number"}, "timeout_s": timeout}
        if takes_node(spec):
            # its form is in the instructions; NODE_MAX_CHARS is a guard like the tools' own
            schema["properties"]["node"] = without_guards({"type": "string", "maxLength": NODE_MAX_CHARS})
    return schema


@functools.cache
def output_schema(spec: ToolSpec) -> dict:
    return compact(spec.Result.model_json_schema(mode="serialization"), inputs=False)


def _annotations(spec: ToolSpec) -> ToolAnnotations:
    return ToolAnnotations(title=spec.summary, read_only_hint=spec.read_only, destructive_hint=spec.destructive,
                           idempotent_hint=spec.idempotent, open_world_hint=spec.open_world)


def _split_arguments(spec: ToolSpec, arguments: dict) -> tuple[Params, CallOptions]:
    """Validate a call's arguments (on a worker thread: a model validator may be slow on a bad input)."""
    arguments = dict(arguments or {})
    options = set(CallOptions.model_fields) - ({"node"} if not takes_node(spec) else set())
    allowed = set(spec.Params.model_fields) | (options if spec.runs == "subprocess" else set())
    unknown = sorted(set(arguments) - allowed)
    if unknown:
        raise ToolError(f"unknown argument(s) for {spec.name}: {', '.join(unknown)[:300]}; "
                        f"accepted: {', '.join(sorted(allowed))}")
    # Only a subprocess tool takes execution options; an in-process tool's field of the same name is its own
    # (job_status's wait_s was taken here as the call's wait and never reached it).
    common = ({k: arguments.pop(k) for k in list(arguments) if k in CallOptions.model_fields}
              if spec.runs == "subprocess" else {})
    problems = []   # both models are checked, so one answer names every bad argument
    try:
        params = spec.Params(**arguments)
    except ValidationError as e:
        problems.append(e)
    try:
        options = CallOptions(**common)
    except ValidationError as e:
        problems.append(e)
    if problems:
        raise ToolError(validation_message(spec, *problems))
    return params, options


def to_call_result(spec: ToolSpec, result) -> CallToolResult:
    """Text: the human view and the rows, each fact once (rendering.answer_text). Structured content: the
    model view (rendering.answer_record: no detail fields, long quotes cut; the store keeps the record whole). A host hands its model
    one of the two, never both (docs/benchmarks.md), so neither repeats the other's facts. PNGs the result declares
    (Result.image_fields) are attached as images: the bytes the run wrote, read back from its own
    descriptor (attachments.py); a path is never re-opened here."""
    content: list[Any] = [TextContent(type="text", text=answer_text(spec, result))]
    for field in type(result).image_fields:
        png = result._images.get(field)
        if png and getattr(result, field, None):
            content.append(ImageContent(type="image", mime_type="image/png", data=base64.b64encode(png).decode()))
    return CallToolResult(content=content, structured_content=answer_record(result))


async def _follow(ctx: Context | None, job: Job, wait_s: float):
    """Wait for `job` up to wait_s, reporting progress; a cancelled call stops the run and frees its GPUs."""
    deadline = time.monotonic() + wait_s
    reported, pause = -1.0, 0.001
    try:
        while not job.finished.is_set() and time.monotonic() < deadline:
            job.check_deadline()
            if ctx is not None and job.fraction > reported:
                reported = job.fraction
                await ctx.report_progress(round(reported * 100, 1), total=100, message=job.message)
            await anyio.sleep(pause)
            pause = min(pause * 2, 0.1)  # fast calls answer within milliseconds, long ones poll at 10 Hz
    except BaseException:  # the client cancelled the call while we waited
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(job.cancel)
        raise
    return job.outcome()


def session_owner(ctx: Context | None) -> str | None:
    """Who owns the jobs this call starts (jobs.py). An HTTP client with a session (the handshake era's
    Mcp-Session-Id) owns its jobs; a sessionless HTTP request (the 2026 era is stateless) is ANONYMOUS:
    it reaches a job only through the unguessable id its call returned. stdio and in-process clients are
    the server's one client (None)."""
    connection = getattr(getattr(ctx, "session", None), "_connection", None) if ctx is not None else None
    session_id = getattr(connection, "session_id", None)
    if session_id:
        return f"session:{session_id}"
    return ANONYMOUS if _SERVING_HTTP else None


_SERVING_HTTP = False   # set by _serve_http: many clients share this process


async def call_tool(spec: ToolSpec, arguments: dict, ctx: Context | None = None) -> CallToolResult:
    """One tool call, start to answer. Every failure becomes a ToolError with a message for the agent."""
    params, options = await anyio.to_thread.run_sync(_split_arguments, spec, arguments)
    try:
        job = MANAGER.start(spec, params, options.timeout_s, owner=session_owner(ctx), node=options.node)
        wait_s = options.wait_s if spec.runs == "subprocess" else float("inf")
        result = await _follow(ctx, job, wait_s)
    except (Busy, Cancelled, ToolFailure) as e:
        raise ToolError(str(e)) from None
    return await anyio.to_thread.run_sync(to_call_result, spec, result)


def tool_entry(spec: ToolSpec) -> dict:
    """What tools/list says about one tool, as plain JSON."""
    return MCPTool(name=spec.name, title=spec.summary, description=spec.description,
                   input_schema=input_schema(spec), output_schema=output_schema(spec),
                   annotations=_annotations(spec)).model_dump(mode="json", by_alias=True, exclude_none=True)


def _source_key() -> str:
    """A digest of what the tool list is built from: the version, every module of the package and every
    data table (a new model preset in knowledge/data/*.toml changes a schema's choices). Contents, not
    sizes and mtimes: an edit that keeps both, or a copied tree, still changes the key (~25 ms for 1 MB)."""
    import hashlib

    from .data import KNOWLEDGE_DIR

    digest = hashlib.sha256(version().encode())
    files = sorted(PACKAGE_DIR.rglob("*.py")) + sorted((KNOWLEDGE_DIR / "data").glob("*.toml"))
    for path in files:
        digest.update(f"{path.relative_to(path.parents[1])}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def _trusted_cache(path: Path, key: str) -> list[dict] | None:
    """The cached list, only if it is ours, writable by nobody else, and built from this exact code and
    data: whoever can write the cache rewrites what every agent is told about every tool."""
    try:
        text = read_private(path, MAX_CACHE_BYTES)
    except UnsafeHome as e:
        log.warning("ignoring the cached tool list: %s", e)
        return None
    except OSError:
        return None
    try:
        cached = json.loads(text) if text is not None else None
    except ValueError:
        return None
    if not isinstance(cached, dict) or cached.get("key") != key or not isinstance(cached.get("tools"), list):
        return None
    return cached["tools"]


MAX_CACHE_BYTES = 16 << 20     # the list is ~100 KB; anything far larger is not one we wrote


def cached_tool_list() -> list[dict]:
    """tools/list for the registry, from $MLENG_HOME/cache when it was built from the code and data
    installed now; otherwise every tool module is imported, and the list is built and saved.

    Importing every tool module and building their JSON schemas is most of what the server adds to a
    bare SDK server's start-up. With the list cached, a tool's module is imported on its first call.
    A broken tool module is never cached.
    """
    from .registry import BROKEN

    key = _source_key()
    try:
        folder = private_dir("cache")
    except OSError as e:   # a read-only home costs start-up time, nothing else (an unsafe one: said once here)
        log.info("tool list not cached (%s)", e)
        return [tool_entry(spec) for spec in registry().values()]
    path = folder / f"tools-{key[:16]}.json"
    tools = _trusted_cache(path, key)
    if tools is not None:
        return tools
    tools = [tool_entry(spec) for spec in registry().values()]
    if not BROKEN:
        try:
            write_private(path, json.dumps({"key": key, "tools": tools}))
        except OSError as e:
            log.info("tool list not cached (%s)", e)
    return tools


class ToolServer(MCPServer):
    """MCPServer whose tools are ToolSpecs: listed with their own schemas, called through the jobs.

    With `specs` the server offers exactly those (tests add fault-injection tools). Without, it offers
    the registry from the cached tool list and imports a tool's module when it is first called.
    """

    def __init__(self, specs: list[ToolSpec] | None = None, **kwargs):
        super().__init__(**kwargs)
        self._given = {spec.name: spec for spec in specs} if specs is not None else None

    @functools.cached_property
    def _entries(self) -> list[dict]:
        if self._given is not None:
            return [tool_entry(spec) for spec in self._given.values()]
        return cached_tool_list()

    @functools.cached_property
    def _tools(self) -> list[MCPTool]:
        return [MCPTool.model_validate(entry) for entry in self._entries]

    def tool_names(self) -> list[str]:
        return [entry["name"] for entry in self._entries]

    def spec(self, name: str) -> ToolSpec | None:
        if self._given is not None:
            return self._given.get(name)
        if name not in self.tool_names():
            return None
        from .registry import load_spec

        return load_spec(name)

    async def list_tools(self) -> list[MCPTool]:
        return self._tools

    def _tool_input_schema(self, name: str) -> dict | None:
        return next((e["inputSchema"] for e in self._entries if e["name"] == name), None)

    async def call_tool(self, name: str, arguments: dict, context: Context | None = None):
        spec = self.spec(name)
        if spec is None:
            raise ToolError(f"unknown tool {name[:100]!r}; known tools: {', '.join(self.tool_names())}")
        return await call_tool(spec, arguments, context)


def _read_knowledge(path: str) -> str:
    """A page or data table of the knowledge tree, refusing anything that resolves outside it."""
    from .knowledge import knowledge_file

    target = knowledge_file(path)
    if target is None:
        raise ResourceNotFoundError(f"no knowledge page {path[:200]!r}: read knowledge://index for the list of pages")
    return target.read_text()


def knowledge_index() -> str:
    """A markdown list of every page: URI, title, summary (from each page's frontmatter)."""
    from .knowledge import load_pages

    lines = ["# mleng knowledge index", "", "Read a page with its URI. Search with the knowledge_search tool.", ""]
    for page in load_pages():
        lines.append(f"- `knowledge://{page.path}` — **{page.title}**: {page.summary}")
    return "\n".join(lines) + "\n"


def build_server(specs: list[ToolSpec] | None = None) -> ToolServer:
    """The MCP server over `specs` (default: every tool in the registry; tests add fault-injection tools)."""
    server = ToolServer(specs, name="mleng", title="mleng — GPU cluster diagnostics", version=version(),
                        instructions=INSTRUCTIONS)

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
        """Turn a symptom into an ordered plan of mleng tool calls (the tools that match it, best first)."""
        from .plan import plan_text

        return plan_text(symptom[:4000], server._entries)

    return server


# ---------------------------------------------------------------------------------------------------
# Shutdown: SIGTERM / SIGINT answer every call in flight with an error, kill every run, and exit.

SHUTDOWN_GRACE_S = 1.0   # time for the error answers of cancelled calls to reach the client


async def _exit_on_signal(token_file=None) -> None:
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for signum in signals:
            log.info("signal %d: stopping every run and exiting", signum)
            await anyio.to_thread.run_sync(MANAGER.cancel_all)   # calls in flight now answer with an error
            await anyio.sleep(SHUTDOWN_GRACE_S)
            sys.stdout.flush()
            if token_file is not None:
                token_file.remove()         # os._exit skips every finally
            # The stdio transport blocks a worker thread on reading stdin, which no cancellation reaches;
            # every child is already dead, so leave without waiting for it.
            os._exit(0)


async def _serve_stdio(server: ToolServer) -> None:
    async with anyio.create_task_group() as tg:
        tg.start_soon(_exit_on_signal)
        await server.run_stdio_async()
        tg.cancel_scope.cancel()


async def _serve_http(server: ToolServer, host: str, port: int, no_auth: bool) -> None:
    import uvicorn

    from .http_guard import (NO_AUTH_WARNING, TokenFile, check_token, header_deadline_protocol, http_app,
                             listening_socket, raise_descriptor_limit)

    global _SERVING_HTTP
    _SERVING_HTTP = True
    token = check_token(host, no_auth)
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/mcp"
    sock = listening_socket(host, port)       # the port first: a busy one leaves its server's token alone
    made = TokenFile(url, port) if token == "" else None
    if no_auth:
        print(f"mleng: serving MCP at {url} WITHOUT authentication.\nmleng: {NO_AUTH_WARNING}", file=sys.stderr,
              flush=True)
    elif made is None:
        print(f"mleng: serving MCP at {url} (Authorization: Bearer ${{MLENG_HTTP_TOKEN}})", file=sys.stderr, flush=True)
    try:
        raise_descriptor_limit()
        config = uvicorn.Config(http_app(server, host, made.token if made else token), host=host, port=port,
                                log_level="warning", http=header_deadline_protocol())
        web = uvicorn.Server(config)
        web.install_signal_handlers = lambda: None   # our handler answers calls in flight first
        async with anyio.create_task_group() as tg:
            tg.start_soon(_exit_on_signal, made)
            await web.serve(sockets=[sock])
            tg.cancel_scope.cancel()
    finally:
        sock.close()
        if made:
            made.remove()


def serve(http: str | None = None, no_auth: bool = False) -> None:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    if no_auth and not http:
        raise SystemExit("--no-auth applies to --http only (stdio is private to the program that started it).")
    server = build_server()
    try:
        if not http:
            anyio.run(_serve_stdio, server)
            return
        host, _, port = http.rpartition(":")
        if not host or not port.isdigit():
            raise SystemExit(f"--http wants HOST:PORT, e.g. 127.0.0.1:8765; got {http!r}")
        anyio.run(_serve_http, server, host.strip("[]"), int(port), no_auth)
    finally:
        MANAGER.cancel_all()  # nothing outlives the server: no orphan ranks holding GPUs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python server.py", description="mleng MCP server (stdio by default)")
    from .http_guard import add_serve_arguments

    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    if args.python:
        set_job_python(args.python)
    serve(args.http, args.no_auth)

