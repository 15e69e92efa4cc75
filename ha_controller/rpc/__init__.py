"""asyncio RPC over TubeMQ framing: connections, server, client pool."""

from ha_controller.rpc.connection import (
    Dispatcher,
    RequestContext,
    RpcConnection,
    connect,
)
from ha_controller.rpc.limits import RpcLimits
from ha_controller.rpc.pool import ConnectionPool
from ha_controller.rpc.server import RpcServer

__all__ = [
    "ConnectionPool",
    "Dispatcher",
    "RequestContext",
    "RpcConnection",
    "RpcLimits",
    "RpcServer",
    "connect",
]
