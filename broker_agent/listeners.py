"""A broker's listeners: RPC, HA (a master's) and admin HTTP around one BrokerService."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from aiohttp import web

from broker_agent.service import BrokerService
from ha_controller.admin_http import build_admin_app, start_http
from ha_controller.config import BrokerConfig, parse_host_port
from ha_controller.readyfile import format_addr
from ha_controller.rpc import RpcServer

log = logging.getLogger(__name__)


def advertised(cfg: BrokerConfig, host: str, port: int) -> str:
    """The address other processes use: ``broker_ip1`` when set, else the bound one."""
    if cfg.broker_ip1:
        return f"{cfg.broker_ip1}:{port}"
    return format_addr(host, port)


def http_routes(service: BrokerService) -> list[web.RouteDef]:
    async def status(_: web.Request) -> web.Response:
        return web.json_response(service.core.status())

    return [web.get("/api/v1/status", status)]


@dataclass
class Listeners:
    """The RPC and admin HTTP listeners of one broker (the HA one is the service's)."""

    server: RpcServer
    runner: web.AppRunner

    async def aclose(self) -> None:
        await self.server.aclose(grace_s=2.0)
        await self.runner.cleanup()


async def open_listeners(service: BrokerService) -> Listeners:
    """Bind RPC, HA and admin HTTP for ``service`` and record the bound addresses on it."""
    cfg = service.cfg
    core = service.core
    # one [tls] for every listener: RPC, HA and admin HTTP (outgoing: core.pool)
    tls = cfg.tls.server_context()
    server = RpcServer(core.dispatcher, limits=cfg.limits, ssl_context=tls, name="broker")
    server.on_connection_closed(service.on_connection_closed)
    service.attach_listener(server)
    core.metrics.export_rpc(
        lambda: [server] if core.ha_master is None else [server, core.ha_master.server]
    )
    host, port = parse_host_port(cfg.listen)
    rpc_host, rpc_port = await server.start(host, port)
    core.addr = advertised(cfg, rpc_host, rpc_port)
    ha_addr = ""
    if core.ha_master is not None:
        ha_host, ha_port_req = parse_host_port(cfg.ha_listen)
        h, p = await core.ha_master.start(ha_host, ha_port_req, ssl_context=tls)
        ha_addr = advertised(cfg, h, p)
    else:
        ha_addr = advertised(cfg, *parse_host_port(cfg.ha_listen))
    core.ha_addr = ha_addr

    def ready() -> tuple[bool, str]:
        core.refresh_gauges()
        why = core.not_ready_reason()
        if why is not None:
            return False, why
        return True, core.acting.role

    app = build_admin_app(
        core.metrics.registry, ready=ready, routes=http_routes(service), token=cfg.admin_token
    )

    async def refresh(request: web.Request, handler: object) -> web.StreamResponse:
        if request.path == "/metrics":
            core.refresh_gauges()
        return await handler(request)  # type: ignore[operator,no-any-return]

    app.middlewares.append(web.middleware(refresh))
    hh, hp = parse_host_port(cfg.http_listen)
    runner, (http_host, http_port) = await start_http(app, hh, hp, tls)
    core.http_addr = format_addr(http_host, http_port)
    log.info(
        "broker %s/%d ready: rpc %s ha %s http %s (%s)",
        cfg.broker_name,
        cfg.broker_id,
        core.addr,
        ha_addr,
        core.http_addr,
        "isolated for pre-online" if core.isolated else core.acting.role,
    )
    return Listeners(server, runner)


def ready_info(service: BrokerService) -> dict[str, str]:
    core = service.core
    return {"rpc": core.addr, "http": core.http_addr, "ha": core.ha_addr}
