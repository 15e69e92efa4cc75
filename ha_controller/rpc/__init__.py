"""asyncio RPC over TubeMQ framing: connections, server, client pool."""

from ha_controller.rpc.connection import (
    Dispatcher,
    Guard,
    RequestContext,
    RpcConnection,
    Signer,
    connect,
)
from ha_controller.rpc.limits import RpcLimits
from ha_controller.rpc.pool import ConnectionPool
from ha_controller.rpc.server import RpcServer

__all__ = [
    "ConnectionPool",
    "Dispatcher",
    "Guard",
    "RequestContext",
    "RpcConnection",
    "RpcLimits",
    "RpcServer",
    "Signer",
    "connect",
]
