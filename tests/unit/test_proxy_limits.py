"""The gateway's per-call bounds (ha_controller/proxy/limits.py): admission counting, the
log throttle, the config rules, and the interceptor on an in-process gRPC server over
loopback (a small servicer stands in for the gateway, whose own test is
tests/integration/test_gateway_bounds.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest
from fakes import FakeClock

from ha_controller.config import ConfigError, ProxyConfig
from ha_controller.proxy.limits import (
    PENDING_CALLS_FLOOR,
    REFUSAL_REASONS,
    Admission,
    CallBounds,
    ThrottledLog,
    server_options,
)
from ha_controller.proxy.metrics import ProxyMetrics
from ha_controller.testing import eventually

grpc = pytest.importorskip("grpc")

from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2  # noqa: E402
from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s  # noqa: E402
from ha_controller.proto.rocketmq.v2 import service_pb2_grpc  # noqa: E402

# ---- plain objects -----------------------------------------------------------------


def admission(total: int = 3, per_client: int = 2) -> Admission:
    return Admission(total=total, per_client=per_client, total_key="t", per_client_key="c")


def test_admission_names_the_clients_limit_first_then_the_total() -> None:
    a = admission()
    assert a.admit("x") is None and a.admit("x") is None
    assert a.admit("x") == "c"  # x's own limit
    assert a.admit("y") is None
    assert a.admit("z") == "t"  # the total
    assert a.active == 3 and a.held("x") == 2
    a.release("x")
    assert a.admit("z") is None


def test_admission_forgets_clients_without_slots_and_refuses_a_double_release() -> None:
    a = admission()
    assert a.admit("x") is None
    a.release("x")
    assert a.active == 0 and a.held("x") == 0
    with pytest.raises(ValueError, match="holds no slot"):
        a.release("x")


def test_throttled_log_writes_one_line_per_kind_per_interval(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock(100.0)
    log = ThrottledLog(logging.getLogger("t.throttle"), interval_s=10, clock=clock)
    with caplog.at_level(logging.INFO, logger="t.throttle"):
        assert log("a", logging.WARNING, "refused %s", "one")
        assert not log("a", logging.WARNING, "refused %s", "two")
        assert log("b", logging.WARNING, "other %s", "kind")  # kinds are independent
        assert not log("a", logging.WARNING, "refused %s", "three")
        clock.now += 10
        assert log("a", logging.WARNING, "refused %s", "four")
    assert [r.getMessage() for r in caplog.records] == [
        "refused one",
        "other kind",
        "refused four (3 like it since the last such line)",
    ]


def test_grpc_backlog_and_request_size_follow_the_config() -> None:
    opts = dict(server_options(ProxyConfig()))
    assert opts["grpc.max_receive_message_length"] == 16 * 1024 * 1024
    assert opts["grpc.server.max_pending_requests"] == PENDING_CALLS_FLOOR
    assert opts["grpc.server.max_pending_requests_hard_limit"] == PENDING_CALLS_FLOOR
    big = dict(server_options(ProxyConfig(max_concurrent_calls=10_000)))
    assert big["grpc.server.max_pending_requests"] == 20_000


@pytest.mark.parametrize(
    ("fields", "keys"),
    [
        (
            {"max_concurrent_calls_per_client": 10, "max_concurrent_calls": 5},
            "max_concurrent_calls",
        ),
        ({"max_concurrent_receives_per_client": 600}, "max_concurrent_receives_per_client"),
        ({"max_concurrent_receives": 5000}, "max_concurrent_receives, max_concurrent_calls"),
        ({"max_request_bytes": 1024 * 1024}, "max_request_bytes"),
        ({"max_messages_per_send": 0}, "max_messages_per_send"),
    ],
)
def test_bad_bounds_are_one_error_naming_the_keys(fields: dict[str, Any], keys: str) -> None:
    with pytest.raises(ConfigError, match=keys):
        ProxyConfig(**fields)


def test_send_refusal_names_the_limit_and_counts() -> None:
    metrics = ProxyMetrics()
    bounds = CallBounds(ProxyConfig(max_messages_per_send=4), metrics)
    assert bounds.send_refusal(4, "c") is None
    status = bounds.send_refusal(5, "c")
    assert status is not None and status.code == v2.PAYLOAD_TOO_LARGE
    assert "max_messages_per_send" in status.message and "at most 4" in status.message
    assert refused(metrics, "max_messages_per_send") == 1
    assert {refused(metrics, r) for r in REFUSAL_REASONS if r != "max_messages_per_send"} == {0}


def refused(metrics: ProxyMetrics, reason: str) -> float:
    value = metrics.registry.get_sample_value("hac_proxy_refused_total", {"reason": reason})
    assert value is not None
    return value


# ---- the interceptor on a real server ------------------------------------------------


class Servicer(service_pb2_grpc.MessagingServiceServicer):
    """Holds each call until ``release`` is set; one QueryRoute raises."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = 0

    async def QueryRoute(self, request: Any, context: Any) -> v2s.QueryRouteResponse:
        self.started += 1
        if request.topic.name == "boom":
            raise RuntimeError("the handler failed")
        await self.release.wait()
        return v2s.QueryRouteResponse(status=v2.Status(code=v2.OK))

    async def ReceiveMessage(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self.started += 1
        await self.release.wait()
        yield v2s.ReceiveMessageResponse(status=v2.Status(code=v2.MESSAGE_NOT_FOUND))

    async def Telemetry(self, request_iterator: Any, context: Any) -> None:
        self.started += 1
        async for cmd in request_iterator:
            await context.write(v2s.TelemetryCommand(status=cmd.status))


@pytest.fixture
async def served() -> AsyncIterator[tuple[Any, CallBounds, Servicer]]:
    cfg = ProxyConfig(
        max_request_bytes=5 * 1024 * 1024,
        max_concurrent_calls=6,
        max_concurrent_calls_per_client=4,
        max_concurrent_receives=3,
        max_concurrent_receives_per_client=2,
    )
    bounds = CallBounds(cfg, ProxyMetrics())
    servicer = Servicer()
    server = grpc.aio.server(options=server_options(cfg), interceptors=[bounds])
    service_pb2_grpc.add_MessagingServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield channel, bounds, servicer
    finally:
        servicer.release.set()
        await server.stop(0)


def meta(client: str) -> tuple[tuple[str, str], ...]:
    return (("x-mq-client-id", client),)


def route(topic: str = "t") -> v2s.QueryRouteRequest:
    return v2s.QueryRouteRequest(topic=v2.Resource(name=topic))


async def test_calls_over_the_limits_are_refused_and_every_slot_comes_back(
    served: tuple[Any, CallBounds, Servicer],
) -> None:
    channel, bounds, servicer = served
    stub = service_pb2_grpc.MessagingServiceStub(channel)

    async def receive(client: str) -> str:
        try:
            async for r in stub.ReceiveMessage(v2s.ReceiveMessageRequest(), metadata=meta(client)):
                return v2.Code.Name(r.status.code)
        except grpc.aio.AioRpcError as exc:
            return f"{exc.code().name}: {exc.details()}"
        return "no status"

    held = [asyncio.ensure_future(receive(c)) for c in ("a", "a", "b")]
    await eventually(lambda: bounds.receives.active == 3)
    assert await receive("a") == (
        "RESOURCE_EXHAUSTED: max_concurrent_receives_per_client (2) reached for client 'a': "
        "ReceiveMessage refused, retry later"
    )
    assert (await receive("c")).startswith("RESOURCE_EXHAUSTED: max_concurrent_receives (3)")
    routes = [asyncio.ensure_future(stub.QueryRoute(route(), metadata=meta(c))) for c in "bdd"]
    await eventually(lambda: bounds.calls.active == 6)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.QueryRoute(route(), metadata=meta("e"))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_concurrent_calls (6) reached" in (caught.value.details() or "")
    servicer.release.set()
    assert [await h for h in held] == ["MESSAGE_NOT_FOUND"] * 3
    assert [(await r).status.code for r in routes] == [v2.OK] * 3
    assert (bounds.calls.active, bounds.receives.active) == (0, 0)


async def test_no_slot_is_lost_to_failures_cancellations_or_refused_requests(
    served: tuple[Any, CallBounds, Servicer],
) -> None:
    channel, bounds, _ = served
    stub = service_pb2_grpc.MessagingServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as caught:  # the handler raises
        await stub.QueryRoute(route("boom"), metadata=meta("a"))
    assert caught.value.code() == grpc.StatusCode.UNKNOWN
    # larger than max_request_bytes: gRPC refuses it, the handler never runs
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.QueryRoute(route("x" * (5 * 1024 * 1024 + 1)), metadata=meta("a"))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    # the client gives up on a held call
    call = stub.QueryRoute(route(), metadata=meta("a"))
    await eventually(lambda: bounds.calls.active == 1)
    call.cancel()
    await eventually(lambda: bounds.calls.active == 0)
    assert (bounds.calls.active, bounds.receives.active) == (0, 0)


async def test_malformed_requests_end_invalid_argument_with_one_log_line(
    served: tuple[Any, CallBounds, Servicer], caplog: pytest.LogCaptureFixture
) -> None:
    channel, bounds, servicer = served
    garbage = b"\xff\xff\xff\xff\x0f"
    unary = channel.unary_unary("/apache.rocketmq.v2.MessagingService/QueryRoute")
    streaming = channel.stream_stream("/apache.rocketmq.v2.MessagingService/Telemetry")
    stub = service_pb2_grpc.MessagingServiceStub(channel)

    async def garbage_after_a_good_one() -> AsyncIterator[bytes]:
        yield v2s.TelemetryCommand(status=v2.Status(code=v2.OK)).SerializeToString()
        yield garbage

    async def only(payload: bytes) -> AsyncIterator[bytes]:
        yield payload

    with caplog.at_level(logging.DEBUG):
        for _ in range(5):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await unary(garbage, metadata=meta("m"))
            assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "QueryRoute: the request is not a valid protobuf message" in str(
                caught.value.details()
            )
        # a stream whose first request is malformed never reaches the handler
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for _ in streaming(only(garbage), metadata=meta("m")):
                pass
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert servicer.started == 0
        # a later malformed one ends the handler's stream, then the call
        got = []
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            async for reply in streaming(garbage_after_a_good_one(), metadata=meta("m")):
                got.append(v2s.TelemetryCommand.FromString(reply).status.code)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert got == [v2.OK] and servicer.started == 1
        # a good call still works
        servicer.release.set()
        assert (await stub.QueryRoute(route(), metadata=meta("m"))).status.code == v2.OK
    assert refused(bounds.metrics, "malformed") == 7
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    lines = [r.getMessage() for r in caplog.records if "malformed" in r.getMessage()]
    assert len(lines) == 1, lines
    assert (bounds.calls.active, bounds.receives.active) == (0, 0)
