"""What the gateway tests share: waiting until the gateway routes topics, and reading its
lite-subscription gauge (with our own v2 stubs: the test process never imports an SDK)."""

from __future__ import annotations

import functools
import urllib.request
from typing import Any

from ha_controller.testing import ProcessHandle, eventually_sync


def wait_routed(proxy: ProcessHandle, *topics: str) -> None:
    """Until the gateway answers a route for every one of ``topics``."""
    import grpc

    from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
    from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s
    from ha_controller.proto.rocketmq.v2 import service_pb2_grpc

    with grpc.insecure_channel(proxy.rpc) as channel:
        stub: Any = service_pb2_grpc.MessagingServiceStub(channel)

        def routed(topic: str) -> bool:
            req = v2s.QueryRouteRequest(topic=v2.Resource(name=topic))
            status = stub.QueryRoute(req, timeout=5).status
            assert status.code == v2.OK, f"{topic}: {status.message}"
            return True

        for topic in topics:
            eventually_sync(functools.partial(routed, topic), timeout=20, interval=0.2)


def lite_subscriptions(proxy: ProcessHandle) -> int:
    """The gateway's ``hac_proxy_lite_subscriptions`` (0 when it shows none)."""
    with urllib.request.urlopen(f"http://{proxy.http}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("hac_proxy_lite_subscriptions "):
                return int(float(line.split()[1]))
    return 0
