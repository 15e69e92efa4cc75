"""``hactl proxy``: a RocketMQ 5 gRPC (v2 MessagingService) gateway in front of
ha-controller, so that the official RocketMQ SDKs work against it (docs/grpc.md).

Needs the optional ``grpcio`` dependency; nothing else in ha_controller imports
this package.  Its settings, :class:`~ha_controller.config.ProxyConfig`, live with
the other components' in :mod:`ha_controller.config` (re-exported here).
"""

from ha_controller.config import ProxyConfig
from ha_controller.proxy.service import Gateway

__all__ = ["Gateway", "ProxyConfig"]
