"""RocketMQ's rules for messages and consumers, and topic message types, over real
processes: our SDK against the brokers, and a raw v2 client (our own stubs) against
``hactl proxy``, each refusal with the status RocketMQ's proxy answers.  The official
SDKs run the same cases in tests/integration/test_grpc_proxy.py (Python),
test_node_sdk.py and test_java_sdk.py.

One group (a master and a slave, so that the slave's copy of a topic's type is seen)
and one gateway.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message, ReceivedMessage
from ha_controller.client.producer import Producer
from ha_controller.client.simple_consumer import SimpleConsumer
from ha_controller.client.transaction import TransactionResolution
from ha_controller.protocol.errors import (
    HaError,
    IllegalConsumerGroup,
    IllegalDeliveryTime,
    IllegalInvisibleTime,
    IllegalMessageKey,
    IllegalMessageTag,
    IllegalPropertyKey,
    IllegalTopic,
    MessageBodyEmpty,
    MessageTooLarge,
    MessageTypeConflict,
    PropertiesTooLarge,
)
from ha_controller.protocol.topics import TopicMessageType
from ha_controller.testing import Cluster, ProcessHandle, eventually, run_cluster

grpc = pytest.importorskip("grpc")

from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2  # noqa: E402
from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s  # noqa: E402
from ha_controller.proto.rocketmq.v2 import service_pb2_grpc  # noqa: E402

pytestmark = pytest.mark.timeout(180)

KB = 1024
MIB = 1024 * 1024
T = TopicMessageType
TOPICS = {
    "R-NORMAL": T.NORMAL,
    "R-FIFO": T.FIFO,
    "R-DELAY": T.DELAY,
    "R-TX": T.TRANSACTION,
    "R-MIXED": T.MIXED,
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, ProcessHandle]]:
    c = run_cluster(("broker-a",), 2, workdir=tmp_path_factory.mktemp("rules"))
    proxy = None
    try:
        proxy = c.run_proxy()
        yield c, proxy
    finally:
        if proxy is not None:
            proxy.stop()
        c.stop()


@pytest.fixture(scope="module")
def topics(cluster: tuple[Cluster, ProcessHandle]) -> dict[str, T]:
    c, _ = cluster

    async def create() -> None:
        async with NameserverClient([c.namesrv]) as ns:
            for topic, kind in TOPICS.items():
                await ns.create_topic(topic, queues=2, message_type=kind)

            async def routed() -> bool:
                for topic in TOPICS:
                    await ns.route(topic)
                return True

            await eventually(routed, timeout=20)

    asyncio.run(create())
    return TOPICS


async def _commit(message: ReceivedMessage) -> TransactionResolution:
    return TransactionResolution.COMMIT


async def _stored(c: Cluster, topic: str) -> int:
    """Messages stored in ``topic`` (every queue's max offset)."""
    async with NameserverClient([c.namesrv]) as ns:
        return sum(q.max_offset for q in await ns.queue_offsets(await ns.route(topic)))


# ---- our SDK ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (lambda: Message("R-NORMAL", b""), MessageBodyEmpty),
        (lambda: Message("R-NORMAL", b"x" * (4 * MIB + 1)), MessageTooLarge),
        (lambda: Message("R-NORMAL", b"x", keys=["k" * (16 * KB + 1)]), PropertiesTooLarge),
        (lambda: Message("R-NORMAL", b"x", keys=["\x00"]), IllegalMessageKey),
        (lambda: Message("R-NORMAL", b"x", tags="a|b"), IllegalMessageTag),
        (lambda: Message("R-NORMAL", b"x", tags="\x01"), IllegalMessageTag),
        (
            lambda: Message("R-NORMAL", b"x", properties={str(i): "v" for i in range(129)}),
            PropertiesTooLarge,
        ),
        (
            lambda: Message("R-NORMAL", b"x", properties={"k" * (8 * KB): "v" * (8 * KB + 1)}),
            PropertiesTooLarge,
        ),
        (lambda: Message("R-NORMAL", b"x", properties={"\x00": "v"}), IllegalPropertyKey),
        (lambda: Message("R-NORMAL", b"x", properties={"RECONSUME_TIME": "1"}), IllegalPropertyKey),
        (
            lambda: Message(
                "R-DELAY", b"x", deliver_ts_ms=int(time.time() * 1000) + 25 * 3600 * 1000
            ),
            IllegalDeliveryTime,
        ),
        (lambda: Message("rmq_sys_x", b"x"), IllegalTopic),
    ],
)
async def test_our_sdk_refuses_what_rocketmq_refuses_before_sending(
    cluster: tuple[Cluster, ProcessHandle],
    topics: dict[str, T],
    message: Callable[[], Message],
    error: type[HaError],
) -> None:
    c, _ = cluster
    before = await _stored(c, "R-NORMAL")
    async with Producer(c.namesrv, group="rules-p") as producer:
        with pytest.raises(error):
            await producer.send(message())
    assert await _stored(c, "R-NORMAL") == before
    assert not error.retriable


async def test_brokers_take_a_4mib_body_with_its_properties_and_no_more(
    cluster: tuple[Cluster, ProcessHandle], topics: dict[str, T]
) -> None:
    """RocketMQ's store counts the body alone against maxMessageSize: a 4 MiB body with
    16 KiB of properties is taken (ours refused it: the properties counted, and 2 KiB
    were kept spare), one byte more of body is not, also when the client would send it."""
    c, _ = cluster
    props = {"k" * (8 * KB): "v" * (8 * KB)}
    async with Producer(c.namesrv, group="rules-p") as producer:
        receipt = await producer.send(Message("R-NORMAL", b"b" * (4 * MIB), properties=props))
        assert receipt.broker_name == "broker-a"
    before = await _stored(c, "R-NORMAL")
    async with Producer(c.namesrv, group="rules-p", max_message_bytes=8 * MIB) as lenient:
        with pytest.raises(MessageTooLarge, match="body of 4194305 bytes"):
            await lenient.send(Message("R-NORMAL", b"b" * (4 * MIB + 1)))
    assert await _stored(c, "R-NORMAL") == before


async def test_a_topic_takes_only_its_message_type(
    cluster: tuple[Cluster, ProcessHandle], topics: dict[str, T]
) -> None:
    """The brokers refuse, before storing anything, a message of a kind its topic does
    not take (our SDK does not know topics' types; the broker's answer reaches it
    typed); a MIXED topic takes every kind; the slave holds the type too."""
    c, _ = cluster
    later = int(time.time() * 1000) + 60_000
    kinds: dict[str, Callable[[str], Message]] = {
        "NORMAL": lambda t: Message(t, b"n"),
        "FIFO": lambda t: Message(t, b"f", message_group="g"),
        "DELAY": lambda t: Message(t, b"d", deliver_ts_ms=later),
        "DELAY_LEVEL": lambda t: Message(t, b"d", delay_level=3),
    }
    async with Producer(c.namesrv, group="rules-p", checker=_commit) as producer:
        for topic, topic_type in topics.items():
            for kind, make in kinds.items():
                takes = topic_type in (T.MIXED, T(kind.removesuffix("_LEVEL")))
                if takes:
                    await producer.send(make(topic))
                    continue
                before = await _stored(c, topic)
                with pytest.raises(MessageTypeConflict, match=f"expected type is {topic_type}"):
                    await producer.send(make(topic))
                assert await _stored(c, topic) == before, (topic, kind)
        for topic, topic_type in topics.items():
            tx = producer.begin_transaction()
            if topic_type in (T.MIXED, T.TRANSACTION):
                await producer.send(Message(topic, b"t"), tx)
                await tx.commit()
            else:
                with pytest.raises(MessageTypeConflict):
                    await producer.send(Message(topic, b"t"), tx)

    slave = c.broker("broker-a", 1).rpc

    async def slave_knows() -> bool:
        async with NameserverClient([c.namesrv]) as ns:
            table = await ns.broker_topics(slave)
        return all(t in table and table[t].message_type is kind for t, kind in topics.items())

    await eventually(slave_knows, timeout=30)


async def test_our_consumers_refuse_rocketmqs_groups_and_invisible_times(
    cluster: tuple[Cluster, ProcessHandle], topics: dict[str, T]
) -> None:
    c, _ = cluster
    with pytest.raises(IllegalConsumerGroup, match="built-in"):
        SimpleConsumer(c.namesrv, "DEFAULT_CONSUMER", ["R-NORMAL"])
    with pytest.raises(IllegalInvisibleTime, match="too large"):
        SimpleConsumer(c.namesrv, "rules-c", ["R-NORMAL"], invisible_duration_s=12 * 3600 + 1)


# ---- the gateway: RocketMQ's proxy's codes ------------------------------------------------


@pytest.fixture
async def stub(cluster: tuple[Cluster, ProcessHandle]) -> AsyncIterator[Any]:
    _, proxy = cluster
    async with grpc.aio.insecure_channel(proxy.rpc) as channel:
        yield service_pb2_grpc.MessagingServiceStub(channel)


_ids = iter(range(1, 1_000_000))


def _v2(topic: str, body: bytes = b"x", **sp: Any) -> v2.Message:
    m = v2.Message(topic=v2.Resource(name=topic), body=body)
    m.system_properties.message_id = f"01RULES{next(_ids):010d}"
    m.system_properties.message_type = sp.pop("message_type", v2.NORMAL)
    for name, value in sp.pop("user_properties", {}).items():
        m.user_properties[name] = value
    m.system_properties.keys.extend(sp.pop("keys", ()))
    if "deliver_ms" in sp:
        m.system_properties.delivery_timestamp.FromMilliseconds(sp.pop("deliver_ms"))
    for name, value in sp.items():
        setattr(m.system_properties, name, value)
    return m


def _later(ms: int) -> int:
    return int(time.time() * 1000) + ms


SEND_CASES: dict[str, tuple[Callable[[], v2.Message], int]] = {
    "fifo_to_normal": (
        lambda: _v2("R-NORMAL", message_type=v2.FIFO, message_group="g"),
        v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
    ),
    "delay_to_normal": (
        lambda: _v2("R-NORMAL", message_type=v2.DELAY, deliver_ms=_later(5000)),
        v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
    ),
    "tx_to_normal": (
        lambda: _v2("R-NORMAL", message_type=v2.TRANSACTION),
        v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
    ),
    "normal_to_fifo": (lambda: _v2("R-FIFO"), v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    "priority_to_normal": (
        lambda: _v2("R-NORMAL", message_type=v2.PRIORITY, priority=3),
        v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
    ),
    "empty_body": (lambda: _v2("R-NORMAL", b""), v2.MESSAGE_BODY_EMPTY),
    "body_over_4mib": (lambda: _v2("R-NORMAL", b"x" * (4 * MIB + 1)), v2.MESSAGE_BODY_TOO_LARGE),
    "empty_tag": (lambda: _v2("R-NORMAL", tag=""), v2.ILLEGAL_MESSAGE_TAG),
    "tag_with_bar": (lambda: _v2("R-NORMAL", tag="a|b"), v2.ILLEGAL_MESSAGE_TAG),
    "key_over_16kb": (
        lambda: _v2("R-NORMAL", keys=["k" * (16 * KB + 1)]),
        v2.MESSAGE_PROPERTIES_TOO_LARGE,
    ),
    "key_control": (lambda: _v2("R-NORMAL", keys=["\x00"]), v2.ILLEGAL_MESSAGE_KEY),
    "props_129": (
        lambda: _v2("R-NORMAL", user_properties={str(i): "v" for i in range(129)}),
        v2.MESSAGE_PROPERTIES_TOO_LARGE,
    ),
    "props_system_key": (
        lambda: _v2("R-NORMAL", user_properties={"UNIQ_KEY": "v"}),
        v2.ILLEGAL_MESSAGE_PROPERTY_KEY,
    ),
    "message_group_64": (
        lambda: _v2("R-FIFO", message_type=v2.FIFO, message_group="g" * 64),
        v2.ILLEGAL_MESSAGE_GROUP,
    ),
    "delivery_over_24h": (
        lambda: _v2("R-DELAY", message_type=v2.DELAY, deliver_ms=_later(25 * 3600 * 1000)),
        v2.ILLEGAL_DELIVERY_TIME,
    ),
    "no_message_id": (lambda: _v2("R-NORMAL", message_id=""), v2.ILLEGAL_MESSAGE_ID),
    "system_topic": (lambda: _v2("rmq_sys_x"), v2.ILLEGAL_TOPIC),
}


async def test_the_gateway_refuses_with_rocketmqs_codes_and_stores_nothing(
    cluster: tuple[Cluster, ProcessHandle], topics: dict[str, T], stub: Any
) -> None:
    c, _ = cluster
    before = {t: await _stored(c, t) for t in ("R-NORMAL", "R-FIFO", "R-DELAY")}
    wrong = []
    for name, (make, code) in SEND_CASES.items():
        resp = await stub.SendMessage(v2s.SendMessageRequest(messages=[make()]))
        if resp.status.code != code:
            wrong.append(f"{name}: {v2.Code.Name(resp.status.code)} {resp.status.message}")
    # a batch with one bad message: refused whole, its good message not stored either
    batch = [_v2("R-NORMAL"), _v2("R-NORMAL", tag="a|b")]
    resp = await stub.SendMessage(v2s.SendMessageRequest(messages=batch))
    assert resp.status.code == v2.ILLEGAL_MESSAGE_TAG
    assert not wrong, "\n".join(wrong)
    assert {t: await _stored(c, t) for t in before} == before

    # what RocketMQ takes: a 4 MiB body with 16 KiB of user properties, tag and key
    fat = _v2(
        "R-FIFO",
        b"b" * (4 * MIB),
        message_type=v2.FIFO,
        message_group="g",
        tag="t" * (4 * KB),
        keys=["m" * (4 * KB)],
        user_properties={"p" * (4 * KB): "v" * (4 * KB)},
    )
    resp = await stub.SendMessage(v2s.SendMessageRequest(messages=[fat]))
    assert resp.status.code == v2.OK, resp.status.message
    # a normal send's transaction id is its message id, as RocketMQ's broker answers
    normal = _v2("R-NORMAL")
    resp = await stub.SendMessage(v2s.SendMessageRequest(messages=[normal]))
    assert resp.entries[0].transaction_id == normal.system_properties.message_id


async def test_the_gateway_offers_each_queue_for_its_topics_types(
    cluster: tuple[Cluster, ProcessHandle], topics: dict[str, T], stub: Any
) -> None:
    accepted = {}
    for topic in topics:
        resp = await stub.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name=topic)))
        assert resp.status.code == v2.OK, resp.status.message
        accepted[topic] = {tuple(q.accept_message_types) for q in resp.message_queues}
    assert accepted == {
        "R-NORMAL": {(v2.NORMAL,)},
        "R-FIFO": {(v2.FIFO,)},
        "R-DELAY": {(v2.DELAY,)},
        "R-TX": {(v2.TRANSACTION,)},
        "R-MIXED": {(v2.NORMAL, v2.FIFO, v2.DELAY, v2.TRANSACTION)},
    }
    bad = await stub.QueryRoute(v2s.QueryRouteRequest(topic=v2.Resource(name="rmq_sys_x")))
    assert bad.status.code == v2.ILLEGAL_TOPIC


async def _receive_status(stub: Any, **fields: Any) -> int:
    request = v2s.ReceiveMessageRequest(
        group=v2.Resource(name=fields.pop("group", "rules-g")),
        message_queue=v2.MessageQueue(
            topic=v2.Resource(name=fields.pop("topic", "R-NORMAL")),
            id=-1,
            broker=v2.Broker(name="broker-a"),
        ),
        batch_size=1,
        filter_expression=fields.pop("filter", v2.FilterExpression(type=v2.TAG, expression="*")),
    )
    request.long_polling_timeout.FromMilliseconds(1000)
    request.invisible_duration.FromMilliseconds(fields.pop("invisible_ms", 10_000))
    async for response in stub.ReceiveMessage(request, timeout=10):
        if response.WhichOneof("content") == "status":
            return int(response.status.code)
    raise AssertionError("no status")


async def test_the_gateway_refuses_rocketmqs_invisible_times_groups_and_filters(
    cluster: tuple[Cluster, ProcessHandle], topics: dict[str, T], stub: Any
) -> None:
    assert await _receive_status(stub, invisible_ms=9999) == v2.ILLEGAL_INVISIBLE_TIME
    assert await _receive_status(stub, invisible_ms=43_200_001) == v2.ILLEGAL_INVISIBLE_TIME
    assert await _receive_status(stub, invisible_ms=10_000) in (v2.OK, v2.MESSAGE_NOT_FOUND)
    assert await _receive_status(stub, group="DEFAULT_CONSUMER") == v2.ILLEGAL_CONSUMER_GROUP
    bad_sql = v2.FilterExpression(type=v2.SQL, expression="a > > 1")
    assert await _receive_status(stub, filter=bad_sql) == v2.ILLEGAL_FILTER_EXPRESSION
    sql = v2.FilterExpression(type=v2.SQL, expression="a > 1")  # served
    assert await _receive_status(stub, filter=sql) in (v2.OK, v2.MESSAGE_NOT_FOUND)
    assert await _receive_status(stub, topic="TBW102") == v2.ILLEGAL_TOPIC
    unknown = await stub.EndTransaction(
        v2s.EndTransactionRequest(
            topic=v2.Resource(name="R-TX"),
            message_id="01UNKNOWN",
            transaction_id="01UNKNOWN",
            resolution=v2.COMMIT,
        )
    )
    assert unknown.status.code == v2.INVALID_TRANSACTION_ID
