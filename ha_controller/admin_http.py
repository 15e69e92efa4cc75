"""The admin HTTP surface shared by every service: /healthz, /readyz, /metrics.

Services add their own ``/api/v1`` routes.  With an admin token (``admin_token``),
every path but the probes and the metrics (:data:`OPEN_PATHS`: what Kubernetes and
Prometheus scrape without credentials) answers 401 unless the request carries
``Authorization: Bearer <token>``; the token is compared in constant time and never
logged.
"""

from __future__ import annotations

import hmac
import ssl
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

#: Paths served without the admin token.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def _token_ok(request: web.Request, token: str) -> bool:
    given = request.headers.get("Authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


def _unauthorized(has_header: bool) -> web.Response:
    why = (
        "the bearer token does not match this service's admin_token"
        if has_header
        else "this endpoint needs the admin token: send 'Authorization: Bearer <admin_token>'"
    )
    resp = web.json_response({"error": "unauthorized", "reason": why}, status=401)
    resp.headers["WWW-Authenticate"] = 'Bearer realm="ha-controller"'
    return resp


def token_middleware(token: str) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Demand the bearer token on every path outside :data:`OPEN_PATHS`."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path not in OPEN_PATHS and not _token_ok(request, token):
            return _unauthorized("Authorization" in request.headers)
        return await handler(request)

    return check


def build_admin_app(
    registry: CollectorRegistry,
    *,
    ready: Callable[[], tuple[bool, str]],
    routes: Iterable[web.RouteDef] = (),
    token: str | None = None,
) -> web.Application:
    """The service's admin app; with ``token`` everything but :data:`OPEN_PATHS`
    needs it (an unknown path too: 401 before 404, so nothing is learnt without it)."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        ok, why = ready()
        return web.json_response({"ready": ok, "reason": why}, status=200 if ok else 503)

    async def metrics(_: web.Request) -> web.Response:
        body = generate_latest(registry)
        resp = web.Response(body=body)
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    app = web.Application(middlewares=[token_middleware(token)] if token else [])
    app.add_routes(
        [
            web.get("/healthz", healthz),
            web.get("/readyz", readyz),
            web.get("/metrics", metrics),
            *routes,
        ]
    )
    return app


def require_token(token: str | None, handler: Handler) -> Handler:
    """Wrap a mutating handler: with a token configured, demand ``Bearer <token>``."""

    async def wrapped(request: web.Request) -> web.StreamResponse:
        if token and not _token_ok(request, token):
            return _unauthorized("Authorization" in request.headers)
        return await handler(request)

    return wrapped


async def start_http(
    app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> tuple[web.AppRunner, tuple[str, int]]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context, reuse_address=True)
    await site.start()
    server = site._server  # aiohttp exposes no public accessor for the bound port
    assert server is not None
    sockets = getattr(server, "sockets", None) or []
    sock = sockets[0].getsockname()
    return runner, (str(sock[0]), int(sock[1]))
