"""The agent's seat: a shell command through which a model (or a person) uses mleng exactly as an MCP host
offers it, for drills played by a real model that has no MCP client of its own.

    python -m tools.evals.seat start            # a real server over HTTP on loopback, in the background
    python -m tools.evals.seat start --view structured   # answers as Claude Code / VS Code hand them
    python -m tools.evals.seat tools            # server instructions + every tool as a model sees it
    python -m tools.evals.seat call log_triage '{"paths": ["/tmp/x/rank0.log"]}'
    python -m tools.evals.seat read knowledge://debugging/hangs.md   # an MCP resource, as hosts read them
    python -m tools.evals.seat stop

`call` prints what a host hands the model. Hosts differ (measured, docs/benchmarks.md): Claude Desktop and most
others hand the result's text blocks (`--view text`, the default); Claude Code, VS Code and Copilot CLI hand only
its structuredContent when there is one (`--view structured`: that JSON, or the text when a result has none, as
for an error). A line per attached image either way. It keeps a log of every call (tool, arguments, characters answered, seconds) in the seat's
folder, so a drill's calls and answer sizes can be counted afterwards (`python -m tools.evals.seat log`).

The server is one process for the whole session (a job handle from one call is followed by the next);
its token and port live in $MLENG_HOME/seat (0700, through the home's door).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio

from ..engine.home import private_dir, read_private, write_private

MAX_STATE_BYTES = 4096
MAX_LOG_BYTES = 4 << 20


def seat_dir() -> Path:
    return private_dir("seat")


def _state() -> dict:
    data = read_private(seat_dir() / "seat.json", MAX_STATE_BYTES)
    if data is None:
        raise SystemExit("no seat is running: start one with `python -m tools.evals.seat start`")
    return json.loads(data)


VIEWS = ("text", "structured")


def start(view: str = "text") -> None:
    folder = seat_dir()
    if (folder / "seat.json").exists():
        raise SystemExit(f"a seat is already running ({folder / 'seat.json'}); stop it first")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_urlsafe(32)
    env = {**os.environ, "MLENG_HTTP_TOKEN": token}
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, str(root / "server.py"), "--http", f"127.0.0.1:{port}"],
                            cwd=os.getcwd(), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    state = {"pid": proc.pid, "port": port, "token": token, "view": view}
    write_private(folder / "seat.json", json.dumps(state))
    for _ in range(300):
        try:
            anyio.run(_list, state)
            print(f"seat ready: server pid {proc.pid} on 127.0.0.1:{port}, answers as the {view} view")
            return
        except Exception:
            if proc.poll() is not None:
                break
            time.sleep(0.2)
    stop()
    raise SystemExit(f"the server did not come up; run `python server.py --http 127.0.0.1:{port}` to see why")


def stop() -> None:
    path = seat_dir() / "seat.json"
    data = read_private(path, MAX_STATE_BYTES)
    if data is None:
        return
    state = json.loads(data)
    try:
        os.killpg(state["pid"], signal.SIGTERM)
        for _ in range(50):
            os.killpg(state["pid"], 0)
            time.sleep(0.1)
        os.killpg(state["pid"], signal.SIGKILL)
    except ProcessLookupError:
        pass
    path.unlink()


def _client(state: dict):
    import httpx2 as httpx
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {state['token']}"},
                             timeout=httpx.Timeout(30, read=900))
    return Client(streamable_http_client(f"http://127.0.0.1:{state['port']}/mcp", http_client=http))


async def _list(state: dict):
    async with _client(state) as c:
        return await c.list_tools()


async def _instructions(state: dict) -> str:
    async with _client(state) as c:
        return c.instructions or ""


def show_tools() -> None:
    state = _state()
    tools = anyio.run(_list, state).tools
    print("SERVER INSTRUCTIONS:\n" + anyio.run(_instructions, state) + "\n")
    for tool in tools:
        print(f"## {tool.name}\n{tool.description}\ninput schema: "
              f"{json.dumps(tool.input_schema, separators=(',', ':'))}\n")


async def _call(state: dict, name: str, arguments: dict):
    async with _client(state) as c:
        return await c.call_tool(name, arguments)


def call(name: str, arguments_json: str) -> None:
    state = _state()
    try:
        arguments = json.loads(arguments_json or "{}")
    except json.JSONDecodeError as e:
        raise SystemExit(f"arguments must be a JSON object: {e.msg}") from None
    t0 = time.monotonic()
    result = anyio.run(_call, state, name, arguments)
    texts = [b.text for b in result.content if getattr(b, "type", "") == "text"]
    images = sum(1 for b in result.content if getattr(b, "type", "") == "image")
    body = "\n".join(texts)
    if state.get("view") == "structured" and result.structured_content is not None:
        body = json.dumps(result.structured_content, ensure_ascii=False)
    answer = ("ERROR: " if result.is_error else "") + body + (f"\n[{images} image(s) attached]" if images else "")
    print(answer)
    record = {"tool": name, "arguments": arguments, "view": state.get("view", "text"), "chars": len(answer), "seconds": round(time.monotonic() - t0, 1),
              "error": bool(result.is_error), "at": time.time()}
    path = seat_dir() / "calls.jsonl"
    write_private(path, (read_private(path, MAX_LOG_BYTES) or b"") + json.dumps(record).encode() + b"\n")


async def _read(state: dict, uri: str):
    async with _client(state) as c:
        return await c.read_resource(uri)


def read(uri: str) -> None:
    result = anyio.run(_read, _state(), uri)
    print("\n".join(getattr(part, "text", "") for part in result.contents))


def show_log() -> None:
    print((read_private(seat_dir() / "calls.jsonl", MAX_LOG_BYTES) or b"").decode(), end="")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.evals.seat", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="verb", required=True)
    st = sub.add_parser("start")
    st.add_argument("--view", choices=VIEWS, default="text",
                    help="what a host hands the model: text blocks (Claude Desktop...) or structuredContent (Claude Code...)")
    sub.add_parser("stop")
    sub.add_parser("tools")
    sub.add_parser("log")
    c = sub.add_parser("call")
    c.add_argument("name")
    c.add_argument("arguments", nargs="?", default="{}")
    r = sub.add_parser("read")
    r.add_argument("uri")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)   # `... tools | head` ends quietly
    if args.verb == "start":
        start(args.view)
    elif args.verb == "call":
        call(args.name, args.arguments)
    elif args.verb == "read":
        read(args.uri)
    else:
        {"stop": stop, "tools": show_tools, "log": show_log}[args.verb]()


if __name__ == "__main__":
    main()
