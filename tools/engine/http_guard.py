"""Who may talk to the HTTP server: a bearer token, or, on loopback without one, loopback pages only.

These tools read logs and occupy GPUs, so:
- Bound beyond loopback, the server refuses to start without MLENG_HTTP_TOKEN (at least 32
  characters), and every request must carry `Authorization: Bearer <token>` (401 otherwise).
- On loopback without a token, a web page the user visits could still reach the server through DNS
  rebinding (its own name resolving to 127.0.0.1). So every request's Host, and Origin when sent,
  must name a loopback address (compared as parsed addresses: `[0:0:0:0:0:0:0:1]`, `127.0.0.2` and
  `::1` are all loopback) or `localhost`; anything else gets 403 before it reaches MCP.
"""

import hmac
import ipaddress
import os
from urllib.parse import urlsplit

TOKEN_ENV = "MLENG_HTTP_TOKEN"
MIN_TOKEN_CHARS = 32


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


def http_app(server, host: str):
    """The streamable-HTTP ASGI app, guarded by a token when one is set and by Host/Origin checks otherwise."""
    token = os.environ.get(TOKEN_ENV, "")
    if token and len(token) < MIN_TOKEN_CHARS:
        raise SystemExit(f"{TOKEN_ENV} is {len(token)} characters long; use at least {MIN_TOKEN_CHARS} random "
                         "characters (e.g. `python -c 'import secrets; print(secrets.token_urlsafe(32))'`).")
    if not is_loopback(host) and not token:
        raise SystemExit(f"refusing to serve HTTP on {host} without a token: these tools read logs and occupy "
                         f"GPUs. Set {TOKEN_ENV} to a long random secret (clients send 'Authorization: Bearer "
                         "<token>'), or bind to 127.0.0.1.")
    app = server.streamable_http_app(host=host)
    return BearerTokenMiddleware(app, token) if token else LoopbackOnlyMiddleware(app)
