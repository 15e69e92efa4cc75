"""The gateway process: gRPC listener, optional admin HTTP, broker heartbeats;
phased shutdown (stop accepting, let calls finish for a grace period, close).

Settings: :class:`ha_controller.config.ProxyConfig`, from
:func:`ha_controller.config.load_proxy_config` (TOML file, ``HAC_*`` env, flags).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from pathlib import Path

import grpc

from ha_controller import config
from ha_controller.admin_http import build_admin_app, start_http
from ha_controller.config import load_proxy_config, parse_host_port
from ha_controller.proto.rocketmq.v2 import service_pb2_grpc
from ha_controller.proxy.auth import AuthInterceptor
from ha_controller.proxy.limits import server_options
from ha_controller.proxy.service import Gateway
from ha_controller.readyfile import format_addr, write_ready_file

__all__ = ["ProxyConfig", "load_proxy_config", "serve"]

log = logging.getLogger(__name__)

#: In-flight calls (long polls included) get this long to finish on shutdown.
SHUTDOWN_GRACE_S = 3.0
#: plus the options that follow from the gateway's bounds (proxy/limits.py)
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 5000),
]


def ProxyConfig(  # a function, so that hactl's ``proxy.ProxyConfig(...)`` keeps working
    *,
    namesrv: Iterable[str],
    listen: str = "0.0.0.0:8081",
    http: str | None = None,
    fifo_groups: Iterable[str] = (),
    long_polling_timeout_s: int = 20,
) -> config.ProxyConfig:
    """Transitional: a :class:`ha_controller.config.ProxyConfig` from the keywords that
    ``hactl proxy`` passed before settings had a loader.

    Use :func:`load_proxy_config` (re-exported here) instead; remove this once
    ``hactl proxy`` does.  The class itself is ``ha_controller.config.ProxyConfig``
    (also ``ha_controller.proxy.ProxyConfig``).
    """
    return config.ProxyConfig(
        namesrv_addrs=tuple(namesrv),
        listen=listen,
        http_listen=http,
        fifo_groups=tuple(sorted(fifo_groups)),
        long_polling_timeout_ms=long_polling_timeout_s * 1000,
    )


def server_credentials(tls: config.TlsConfig) -> grpc.ServerCredentials | None:
    """The gRPC listener's TLS from the gateway's [tls] (None when off): its
    certificate, and under ``require_client_cert`` client certificates verified
    against ``ca_file`` (the SDKs must then present one)."""
    if not tls.enabled:
        return None
    assert tls.cert_file and tls.key_file  # checked by TlsConfig
    ca = Path(tls.ca_file).read_bytes() if tls.ca_file and tls.require_client_cert else None
    return grpc.ssl_server_credentials(
        [(Path(tls.key_file).read_bytes(), Path(tls.cert_file).read_bytes())],
        root_certificates=ca,
        require_client_auth=tls.require_client_cert,
    )


async def serve(
    cfg: config.ProxyConfig, stop: asyncio.Event, ready_file: str | Path | None
) -> None:
    gateway = Gateway(cfg)
    server = grpc.aio.server(
        options=[*GRPC_OPTIONS, *server_options(cfg)],
        # the bounds outermost: a malformed or excess call never reaches the ACL checks
        interceptors=[gateway.bounds, AuthInterceptor(gateway.auth)],
    )
    service_pb2_grpc.add_MessagingServiceServicer_to_server(gateway, server)
    host, port = parse_host_port(cfg.listen)
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    credentials = server_credentials(cfg.tls)
    if credentials is None:
        bound = server.add_insecure_port(target)
    else:
        bound = server.add_secure_port(target, credentials)
    if bound == 0:
        raise OSError(f"cannot listen on {cfg.listen}")
    gateway.advertised = format_addr(host, bound)
    runner = None
    addresses = {"rpc": gateway.advertised}
    try:
        await server.start()
        if cfg.http_listen:
            h_host, h_port = parse_host_port(cfg.http_listen)
            app = build_admin_app(gateway.metrics.registry, ready=lambda: (True, "serving"))
            runner, (b_host, b_port) = await start_http(
                app, h_host, h_port, cfg.tls.server_context()
            )
            addresses["http"] = format_addr(b_host, b_port)
        log.info(
            "gateway serving apache.rocketmq.v2.MessagingService on %s (%s)",
            gateway.advertised,
            "plaintext" if credentials is None else "TLS",
        )
        if ready_file:
            write_ready_file(ready_file, **addresses)
        async with asyncio.TaskGroup() as tg:
            background = tg.create_task(gateway.run(stop), name="proxy-background")
            await stop.wait()
            log.info("stopping: no new calls, %.0f s for in-flight ones", SHUTDOWN_GRACE_S)
            await server.stop(SHUTDOWN_GRACE_S)
            await background
    finally:
        await server.stop(0)
        if runner is not None:
            await runner.cleanup()
        await gateway.aclose()
        log.info("gateway stopped")
