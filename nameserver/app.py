"""The nameserver process: RPC listener, admin HTTP, scanner; phased shutdown."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from aiohttp import web

from ha_controller.admin_http import build_admin_app, start_http
from ha_controller.config import NameserverConfig, parse_host_port
from ha_controller.protocol.errors import TopicNotFound
from ha_controller.readyfile import format_addr, write_ready_file
from ha_controller.rpc import RpcServer
from nameserver.service import NameserverService

log = logging.getLogger(__name__)


def http_routes(service: NameserverService) -> list[web.RouteDef]:
    async def groups(_: web.Request) -> web.Response:
        return web.json_response(service.groups_view())

    async def route(request: web.Request) -> web.Response:
        topic = request.match_info["topic"]
        try:
            data = service.route_or_raise(topic)
        except TopicNotFound as exc:
            return web.json_response({"error": str(exc)}, status=404)
        return web.json_response(data.to_json())

    async def cluster(_: web.Request) -> web.Response:
        return web.json_response(service.table.cluster_info())

    return [
        web.get("/api/v1/groups", groups),
        web.get("/api/v1/routes/{topic}", route),
        web.get("/api/v1/cluster", cluster),
    ]


async def serve(cfg: NameserverConfig, stop: asyncio.Event, ready_file: str | Path | None) -> None:
    service = NameserverService(cfg)
    tls = cfg.tls.server_context()
    server = RpcServer(service.dispatcher, limits=cfg.limits, ssl_context=tls, name="nameserver")
    server.on_connection_closed(service.on_connection_closed)
    service.metrics.export_rpc(lambda: [server])
    host, port = parse_host_port(cfg.listen)
    rpc_host, rpc_port = await server.start(host, port)
    app = build_admin_app(
        service.metrics.registry,
        ready=lambda: (True, "serving"),
        routes=http_routes(service),
        token=cfg.admin_token,
    )
    http_host, http_port = parse_host_port(cfg.http_listen)
    runner, (hh, hp) = await start_http(app, http_host, http_port, tls)
    rpc_addr, http_addr = format_addr(rpc_host, rpc_port), format_addr(hh, hp)
    log.info("nameserver ready: rpc %s http %s", rpc_addr, http_addr)
    if ready_file:
        write_ready_file(ready_file, rpc=rpc_addr, http=http_addr)
    try:
        await service.run(stop)
    finally:
        await server.aclose(grace_s=2.0)
        await runner.cleanup()
        log.info("nameserver stopped")
