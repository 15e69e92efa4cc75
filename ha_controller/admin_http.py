"""The admin HTTP surface shared by every service: /healthz, /readyz, /metrics.

Services add their own ``/api/v1`` routes.  Mutating routes go through
``require_token`` when an admin token is configured.
"""

from __future__ import annotations

import hmac
import ssl
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_admin_app(
    registry: CollectorRegistry,
    *,
    ready: Callable[[], tuple[bool, str]],
    routes: Iterable[web.RouteDef] = (),
) -> web.Application:
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

    app = web.Application()
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
        if token:
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
                return web.json_response({"error": "unauthorized"}, status=401)
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
