"""``hactl proxy``: a RocketMQ 5 gRPC (v2 MessagingService) gateway in front of
ha-controller, so that the official RocketMQ SDKs work against it (docs/grpc.md).

Needs the optional ``grpcio`` dependency; nothing else in ha_controller imports
this package.
"""

from ha_controller.proxy.service import Gateway, ProxyConfig

__all__ = ["Gateway", "ProxyConfig"]
