"""Who may talk to the HTTP server: whoever holds its bearer token.

These tools read the owner's files, write files, occupy GPUs and submit SLURM jobs as the owner, and a
loopback port is reachable by every user of the host (login nodes are shared). So, as Jupyter does:
- every request must carry `Authorization: Bearer <token>` (401 otherwise), on loopback too;
- the token is MLENG_HTTP_TOKEN (at least 32 characters) or, when none is given, a random one made at
  start, printed once with the URL and written 0600 to $MLENG_HOME/http-<port>.token (removed at exit);
- `--no-auth` (loopback only, said out loud at start) serves without a token for a single-user machine.
  A web page the user visits could then still reach the server through DNS rebinding (its own name
  resolving to 127.0.0.1), so every request's Host, and Origin when sent, must name a loopback address
  (compared as parsed addresses: `[0:0:0:0:0:0:0:1]`, `127.0.0.2` and `::1` are all loopback) or
  `localhost`; anything else gets 403 before it reaches MCP.
- A connection must complete its request headers within HEADER_TIMEOUT_S of opening (or of its last
  answer): uvicorn alone kept half-sent requests open forever, and ~1,000 of them, sent without any
  token, used up a 1,024-descriptor limit and shut every token holder out (review 2026-12-01, F17). The
  descriptor limit is also raised to its hard limit at start.
- A session that sends nothing for SESSION_IDLE_S is closed, and at most MAX_SESSIONS are open at once
  (a new one beyond that is refused): each costs ~8 KB, and a token holder opening thousands would
  otherwise keep them for the SDK's default 30 minutes, up to 10,000 of them. Both can be set from the
  environment (MLENG_HTTP_SESSION_IDLE_S, MLENG_HTTP_MAX_SESSIONS).
"""

import argparse
import errno
import hmac
import ipaddress
import os
import secrets
import socket
import sys
from urllib.parse import urlsplit

from .home import private_dir, remove_private, write_private

TOKEN_ENV = "MLENG_HTTP_TOKEN"
MIN_TOKEN_CHARS = 32
HEADER_TIMEOUT_S = 10.0   # a real client sends its headers in milliseconds
SESSION_IDLE_S = 600.0    # an agent polling a job handle calls well within this
MAX_SESSIONS = 64         # one person's agents and inspectors, with room to spare


def is_loopback(host: str) -> bool:
    """True for 'localhost' and any spelling of a loopback address (brackets and a port allowed)."""
    host = (host or "").strip().lower()
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:       # host:port (an IPv6 address has several colons)
        host = host.split(":", 1)[0]
    if host in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _origin_host(origin: str) -> str:
    return urlsplit(origin).netloc if "://" in origin else origin


async def _refuse(send, status: int, message: str, extra_headers=()) -> None:
    body = ('{"error": "%s"}' % message).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), *extra_headers]})
    await send({"type": "http.response.body", "body": body})


class BearerTokenMiddleware:
    """Pure ASGI: refuse every HTTP request whose Authorization header is not `Bearer <token>`."""

    def __init__(self, app, token: str):
        self.app, self.expected = app, f"Bearer {token}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            got = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(got, self.expected):
                await _refuse(send, 401, "missing or wrong bearer token (Authorization: Bearer $MLENG_HTTP_TOKEN)",
                              [(b"www-authenticate", b"Bearer")])
                return
        await self.app(scope, receive, send)


class LoopbackOnlyMiddleware:
    """Pure ASGI: without a token, only requests whose Host (and Origin, when present) are loopback."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            host = headers.get(b"host", b"").decode("latin-1")
            origin = headers.get(b"origin", b"").decode("latin-1")
            if not is_loopback(host) or (origin and origin != "null" and not is_loopback(_origin_host(origin))):
                await _refuse(send, 403, "Host and Origin must be loopback addresses when no token is set "
                                         "(DNS rebinding protection); set MLENG_HTTP_TOKEN to serve other names")
                return
        await self.app(scope, receive, send)


NO_AUTH_WARNING = ("--no-auth: this server answers anyone who can open a connection to it, and on a loopback "
                   "address that is every user of this host and every program they run: they can read your files, "
                   "write files as you, use your GPUs and submit SLURM jobs as you. Use it only on a machine no one "
                   "else logs into.")


def check_token(host: str, no_auth: bool) -> str | None:
    """The token the caller set (None with --no-auth); SystemExit with the reason when the choice is unsafe."""
    token = os.environ.get(TOKEN_ENV, "")
    if token and len(token) < MIN_TOKEN_CHARS:
        raise SystemExit(f"{TOKEN_ENV} is {len(token)} characters long; use at least {MIN_TOKEN_CHARS} random "
                         "characters (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`), or "
                         "leave it unset and a random token is made at start.")
    if no_auth and token:
        raise SystemExit(f"--no-auth and {TOKEN_ENV} both given: choose one.")
    if no_auth and not is_loopback(host):
        raise SystemExit(f"--no-auth serves only loopback addresses (127.0.0.1, ::1, localhost); {host} is not one. "
                         f"Leave --no-auth out: a token is then required (set {TOKEN_ENV} or use the one printed).")
    return None if no_auth else token


class TokenFile:
    """A token made at start: printed once with the URL, kept 0600 under $MLENG_HOME while the server runs.

    Written as a new file renamed into place (home.write_private), never into one that was there: a file
    another user made first would otherwise receive the token (review 2026-12-02, R1). Made only once the
    port is ours (`listening_socket`), and at exit removed only if it is still the file this process wrote:
    a second server that could not bind once deleted the first one's token (R13)."""

    def __init__(self, url: str, port: int):
        self.token = secrets.token_urlsafe(32)      # 256 random bits, 43 characters
        try:
            self.path = private_dir() / f"http-{port}.token"
            self._identity = write_private(self.path, self.token + "\n")
        except OSError as e:
            raise SystemExit(f"mleng: cannot keep the HTTP token under $MLENG_HOME: {e}") from None
        print(f"mleng: serving MCP at {url}\n"
              f"mleng: every request needs the header  Authorization: Bearer {self.token}\n"
              f"mleng: (a new random token at every start; also in {self.path}, mode 0600, removed at exit. "
              f"Set {TOKEN_ENV} to choose your own.)", file=sys.stderr, flush=True)

    def remove(self) -> None:
        remove_private(self.path, self._identity)


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the token file is written; a port in use is SystemExit saying so."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn: a just-closed port is free
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        if e.errno == errno.EADDRINUSE:
            raise SystemExit(f"mleng: {host}:{port} is taken: another program (another `mleng serve --http`?) "
                             "listens there. Choose another port, or stop that one first.") from None
        raise SystemExit(f"mleng: cannot listen on {host}:{port}: {e.strerror or e}.") from None
    return sock


def http_app(server, host: str, token: str | None):
    """The streamable-HTTP ASGI app: the bearer token checked on every request, or, with no token
    (--no-auth, loopback only), Host/Origin checks against DNS rebinding."""
    app = server.streamable_http_app(host=host, session_idle_timeout=_env_number("MLENG_HTTP_SESSION_IDLE_S",
                                                                                   SESSION_IDLE_S),
                                     max_sessions=int(_env_number("MLENG_HTTP_MAX_SESSIONS", MAX_SESSIONS)))
    return BearerTokenMiddleware(app, token) if token else LoopbackOnlyMiddleware(app)


def _env_number(name: str, default: float) -> float:
    """A positive number from the environment, or a clear error naming the variable."""
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value < 1e7:
        raise SystemExit(f"{name}={text!r}: expected a positive number (default {default:g})")
    return value


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """--http and --no-auth, for `python server.py` and `mleng serve` alike."""
    parser.add_argument("--http", metavar="HOST:PORT", help=(
        "serve streamable HTTP at http://HOST:PORT/mcp; every request needs a bearer token ($MLENG_HTTP_TOKEN, "
        "or a random one printed at start)"))
    parser.add_argument("--no-auth", action="store_true", help=(
        "loopback only: serve HTTP without a token. Every user of this host can then call every tool as you "
        "(read your files, use your GPUs, submit jobs); only for a machine no one else logs into"))
    parser.add_argument("--python", metavar="PATH", help=(
        "the Python your jobs use (with their torch, CUDA, NCCL): the measuring tools run in it "
        "[default: $MLENG_PYTHON, else this Python]"))


def header_deadline_protocol():
    """uvicorn's h11 protocol, closing a connection whose request headers are late (see the module doc)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeaderDeadline(H11Protocol):
        _deadline = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(HEADER_TIMEOUT_S, self._headers_late)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _headers_late(self) -> None:
            in_flight = self.cycle is not None and not self.cycle.response_complete
            if not in_flight and not self.transport.is_closing():
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            if self.cycle is not None and not self.cycle.response_complete:
                self._disarm()      # headers are in: the app owns the request now

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()         # the next request on this connection gets the same deadline

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeaderDeadline


def raise_descriptor_limit() -> int:
    """The soft limit on open descriptors raised to the hard one (often 1,024 -> 524,288); returns it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = 1_048_576 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            pass
    return soft
