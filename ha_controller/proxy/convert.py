"""The wire edge of the gateway: v2 protobufs <-> our broker protobufs and routes.

Every v2 type is converted here and only here (one module owns the conversion, so
no other module sees a v2 type); the servicer works with the results.  Property
names are RocketMQ's, as our brokers use them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp

from ha_controller.client.siphash import queue_for_message_group
from ha_controller.filter.selector import check_subscription
from ha_controller.proto import broker_pb2
from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s
from ha_controller.protocol.errors import (
    AccessDenied,
    BadRequest,
    BrokerIsolated,
    BrokerUnavailable,
    ConnectionClosed,
    EscapeFailed,
    HaError,
    IllegalConsumerGroup,
    IllegalDeliveryTime,
    IllegalFilterExpression,
    IllegalInvisibleTime,
    IllegalLiteTopic,
    IllegalMessageGroup,
    IllegalMessageId,
    IllegalMessageKey,
    IllegalMessageTag,
    IllegalPropertyKey,
    IllegalTopic,
    InSyncReplicasNotEnough,
    LiteSubscriptionQuotaExceeded,
    MessageBodyEmpty,
    MessageTooLarge,
    MessageTypeConflict,
    NotMaster,
    NotRecallable,
    NotWritable,
    Overloaded,
    PropertiesTooLarge,
    ReceiptHandleExpired,
    RequestTimeout,
    ServiceStopping,
    TopicNotFound,
)
from ha_controller.protocol.priority import check_priority
from ha_controller.protocol.properties import (
    PROPERTY_BORN_TIMESTAMP,
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_LITE_TOPIC,
    PROPERTY_MESSAGE_GROUP,
    PROPERTY_PREPARED_QUEUE_OFFSET,
    PROPERTY_PRIORITY,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_TAGS,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TRAN_MSG,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_UNIQ_KEY,
)
from ha_controller.protocol.properties import now_ms as now_ms_clock
from ha_controller.protocol.topics import TopicMessageType
from ha_controller.protocol.topics import message_type_of as topic_message_type_of
from ha_controller.protocol.validation import (
    DEFAULT_LIMITS,
    SYSTEM_PROPERTIES,
    MessageLimits,
    check_lite_topic,
    check_message,
)
from ha_controller.proxy.handles import InvalidHandle
from ha_controller.routing import Perm, TopicRouteData

__all__ = [
    "PROPERTY_MESSAGE_GROUP",
    "PROPERTY_TIMER_DELIVER_MS",
    "PROPERTY_TRAN_MSG",
    "ALL_MESSAGE_TYPES",
    "QueueRef",
    "assignments",
    "code_for",
    "endpoints_of",
    "filter_of",
    "message_to_v2",
    "ms_of_duration",
    "ms_of_timestamp",
    "route_queues",
    "send_entry",
    "status",
    "writable_queues",
]

#: Properties our brokers set or read that a received message does not show as user
#: properties (RocketMQ's ``MessageConst.STRING_HASH_SET``, and our brokers' own).  As
#: with RocketMQ, the message group (``__SHARDINGKEY``) and a committed transaction's
#: ``__transactionId__`` are shown: the SDKs' own tests read them there.  A v2 client
#: may set none of ``SYSTEM_PROPERTIES`` as a user property (ILLEGAL_MESSAGE_PROPERTY_KEY).
HIDDEN_PROPERTIES: Final = SYSTEM_PROPERTIES - {PROPERTY_MESSAGE_GROUP, PROPERTY_TRANSACTION_ID}

#: what QueryRoute says each queue accepts, by the topic's type (RocketMQ's
#: RouteActivity; a MIXED topic lists the four types every SDK knows)
ALL_MESSAGE_TYPES: Final[tuple[v2.MessageType, ...]] = (
    v2.NORMAL,
    v2.FIFO,
    v2.DELAY,
    v2.TRANSACTION,
)
_ACCEPTED: Final[dict[TopicMessageType, tuple[v2.MessageType, ...]]] = {
    TopicMessageType.NORMAL: (v2.NORMAL,),
    TopicMessageType.FIFO: (v2.FIFO,),
    TopicMessageType.DELAY: (v2.DELAY,),
    TopicMessageType.TRANSACTION: (v2.TRANSACTION,),
    TopicMessageType.PRIORITY: (v2.PRIORITY,),
    TopicMessageType.LITE: (v2.LITE,),
    TopicMessageType.MIXED: ALL_MESSAGE_TYPES,
}
#: a v2 message type as a topic message type
TOPIC_TYPE_OF_V2: Final = {
    v2.NORMAL: TopicMessageType.NORMAL,
    v2.FIFO: TopicMessageType.FIFO,
    v2.DELAY: TopicMessageType.DELAY,
    v2.TRANSACTION: TopicMessageType.TRANSACTION,
    v2.PRIORITY: TopicMessageType.PRIORITY,
    v2.LITE: TopicMessageType.LITE,
}


def accepted_types(topic_type: TopicMessageType) -> tuple[v2.MessageType, ...]:
    return _ACCEPTED[topic_type]


def status(code: int = v2.OK, message: str = "OK") -> v2.Status:
    return v2.Status(code=code, message=message)  # type: ignore[arg-type]


#: the v2 status of each refusal of ``ha_controller.protocol.validation``, as RocketMQ's
#: proxy answers the same check
_VALIDATION_CODES: Final[tuple[tuple[type[HaError], int], ...]] = (
    (MessageTooLarge, v2.MESSAGE_BODY_TOO_LARGE),
    (MessageBodyEmpty, v2.MESSAGE_BODY_EMPTY),
    (PropertiesTooLarge, v2.MESSAGE_PROPERTIES_TOO_LARGE),
    (IllegalPropertyKey, v2.ILLEGAL_MESSAGE_PROPERTY_KEY),
    (IllegalMessageTag, v2.ILLEGAL_MESSAGE_TAG),
    (IllegalMessageKey, v2.ILLEGAL_MESSAGE_KEY),
    (IllegalMessageGroup, v2.ILLEGAL_MESSAGE_GROUP),
    (IllegalMessageId, v2.ILLEGAL_MESSAGE_ID),
    (IllegalDeliveryTime, v2.ILLEGAL_DELIVERY_TIME),
    (IllegalInvisibleTime, v2.ILLEGAL_INVISIBLE_TIME),
    (IllegalFilterExpression, v2.ILLEGAL_FILTER_EXPRESSION),
    (IllegalTopic, v2.ILLEGAL_TOPIC),
    (IllegalConsumerGroup, v2.ILLEGAL_CONSUMER_GROUP),
    (MessageTypeConflict, v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE),
    (IllegalLiteTopic, v2.ILLEGAL_LITE_TOPIC),
    (LiteSubscriptionQuotaExceeded, v2.LITE_SUBSCRIPTION_QUOTA_EXCEEDED),
)


def code_for(exc: BaseException) -> int:
    """The v2 status code for an error from our brokers or the gateway.

    The official producers retry (another queue) on every code except
    TOO_MANY_REQUESTS, so only real overload maps to it."""
    if isinstance(exc, InvalidHandle | ReceiptHandleExpired):
        return v2.INVALID_RECEIPT_HANDLE
    if isinstance(exc, TopicNotFound):
        return v2.TOPIC_NOT_FOUND
    if isinstance(exc, NotRecallable):
        return v2.NOT_FOUND
    if isinstance(exc, Overloaded):
        return v2.TOO_MANY_REQUESTS
    if isinstance(exc, InSyncReplicasNotEnough):
        return v2.SLAVE_PERSISTENCE_TIMEOUT
    if isinstance(exc, RequestTimeout | TimeoutError):
        return v2.PROXY_TIMEOUT
    if isinstance(
        exc, NotMaster | NotWritable | BrokerIsolated | BrokerUnavailable | ConnectionClosed
    ):
        return v2.HA_NOT_AVAILABLE
    if isinstance(exc, ServiceStopping | EscapeFailed):
        return v2.HA_NOT_AVAILABLE
    if isinstance(exc, AccessDenied):  # the client ACL: the user lacks a permission
        return v2.FORBIDDEN
    for cls, code in _VALIDATION_CODES:  # RocketMQ's proxy's code for the same check
        if isinstance(exc, cls):
            return code
    if isinstance(exc, BadRequest):
        return v2.BAD_REQUEST
    if isinstance(exc, HaError):
        return v2.INTERNAL_SERVER_ERROR
    return v2.INTERNAL_ERROR


def ms_of_timestamp(ts: Timestamp) -> int:
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def timestamp_of_ms(ms: int) -> Timestamp:
    return Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


#: Seconds beyond this (year 5138) are taken for milliseconds: rocketmq-python-client
#: 5.1.2 documents ``Message.delivery_timestamp`` in ms but puts it in
#: ``Timestamp.seconds`` unchanged.
_MS_IN_SECONDS_FIELD: Final = 100_000_000_000


def delivery_ms(ts: Timestamp) -> int:
    """A v2 delivery timestamp in ms, tolerating an SDK that put ms in ``seconds``."""
    if ts.seconds > _MS_IN_SECONDS_FIELD:
        return ts.seconds
    return ms_of_timestamp(ts)


def ms_of_duration(d: Duration) -> int:
    return d.seconds * 1000 + d.nanos // 1_000_000


def duration_of_ms(ms: int) -> Duration:
    return Duration(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def endpoints_of(addr: str) -> v2.Endpoints:
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    scheme = v2.IPv6 if ":" in host else v2.IPv4
    if not host.replace(".", "").isdigit() and scheme == v2.IPv4:
        scheme = v2.DOMAIN_NAME
    return v2.Endpoints(scheme=scheme, addresses=[v2.Address(host=host, port=int(port))])


def _permission(perm: int, readable: bool, writable: bool) -> int:
    r = readable and Perm.is_readable(perm)
    w = writable and Perm.is_writeable(perm)
    if r and w:
        return v2.READ_WRITE
    if r:
        return v2.READ
    if w:
        return v2.WRITE
    return v2.NONE


@dataclass(frozen=True, slots=True, order=True)
class QueueRef:
    """One queue of a topic in one broker group, and where the group is served."""

    broker_name: str
    queue_id: int
    addr: str
    readable: bool
    writable: bool


def route_queues(route: TopicRouteData) -> list[QueueRef]:
    """Queues of groups that have an id 0 (their master, or the slave acting for
    it: the nameserver's RIP-32 rewrite), sorted by (group, queue)."""
    out: list[QueueRef] = []
    for qd in route.queue_datas:
        broker = route.broker(qd.broker_name)
        addr = broker.broker_addrs.get(0) if broker is not None else None
        if addr is None:
            continue  # no master and nobody acting: nothing to read or write there
        out.extend(
            QueueRef(
                qd.broker_name,
                qid,
                addr,
                qid < qd.read_queue_nums and Perm.is_readable(qd.perm),
                qid < qd.write_queue_nums and Perm.is_writeable(qd.perm),
            )
            for qid in range(max(qd.read_queue_nums, qd.write_queue_nums))
        )
    return sorted(out)


def writable_queues(route: TopicRouteData) -> list[QueueRef]:
    return [q for q in route_queues(route) if q.writable]


def fifo_queue(queues: list[QueueRef], message_group: str) -> QueueRef:
    """A message group's queue among the writable ones (SipHash-2-4, as our SDK)."""
    return queues[queue_for_message_group(message_group, len(queues))]


def _broker_pb(name: str, gateway: v2.Endpoints) -> v2.Broker:
    return v2.Broker(name=name, id=0, endpoints=gateway)


def v2_queues(
    route: TopicRouteData,
    gateway: v2.Endpoints,
    topic_type: TopicMessageType = TopicMessageType.MIXED,
) -> list[v2.MessageQueue]:
    """QueryRoute: every queue as broker id 0 at the gateway's endpoints, accepting the
    topic's message types; an acting group's queues are READ (the nameserver wiped its
    write perm)."""
    perms = {qd.broker_name: qd.perm for qd in route.queue_datas}
    accepted = accepted_types(topic_type)
    return [
        v2.MessageQueue(
            topic=v2.Resource(name=route.topic),
            id=q.queue_id,
            permission=_permission(perms[q.broker_name], q.readable, q.writable),  # type: ignore[arg-type]
            broker=_broker_pb(q.broker_name, gateway),
            accept_message_types=accepted,
        )
        for q in route_queues(route)
    ]


def assignments(
    route: TopicRouteData,
    gateway: v2.Endpoints,
    topic_type: TopicMessageType = TopicMessageType.MIXED,
) -> list[v2.Assignment]:
    """QueryAssignment: one assignment per readable group, queue id -1 (POP from
    any queue), like RocketMQ's proxy."""
    readable = sorted({q.broker_name for q in route_queues(route) if q.readable})
    accepted = accepted_types(topic_type)
    return [
        v2.Assignment(
            message_queue=v2.MessageQueue(
                topic=v2.Resource(name=route.topic),
                id=-1,
                permission=v2.READ,
                broker=_broker_pb(name, gateway),
                accept_message_types=accepted,
            )
        )
        for name in readable
    ]


def filter_of(expr: v2.FilterExpression) -> tuple[list[str], str]:
    """A v2 filter as a POP's ``(tags, sql92)``: TAG ``a || b`` -> (["a", "b"], ""),
    "*" or empty -> ([], "") (all); SQL -> ([], the expression), parsed here so that a
    bad one is refused (``FilterSyntaxError``: ILLEGAL_FILTER_EXPRESSION) before any
    broker is asked."""
    text = expr.expression.strip()
    if expr.type == v2.SQL:
        check_subscription(None, text)
        return [], text
    if expr.type not in (v2.TAG, v2.FILTER_TYPE_UNSPECIFIED):
        raise IllegalFilterExpression(f"unknown filter type {int(expr.type)}")
    if not text or text == "*":
        return [], ""
    return [t.strip() for t in text.split("||") if t.strip()], ""


def message_type_of(msg: v2.Message) -> int:
    sp = msg.system_properties
    if sp.message_type != v2.MESSAGE_TYPE_UNSPECIFIED:
        return sp.message_type
    if sp.HasField("message_group"):
        return v2.FIFO
    if sp.HasField("delivery_timestamp"):
        return v2.DELAY
    if sp.HasField("priority"):
        return v2.PRIORITY
    if sp.HasField("lite_topic"):
        return v2.LITE
    return v2.NORMAL


@dataclass(frozen=True, slots=True)
class SendPlan:
    """A v2 message translated for SEND_MESSAGE."""

    entry: broker_pb2.SendEntry
    message_type: int
    message_id: str
    message_group: str | None
    born_host: str
    #: a LITE message's lite topic: it picks the queue, as a message group does
    lite_topic: str | None = None

    @property
    def topic_type(self) -> TopicMessageType:
        """The kind the topic must take (by the properties, as RocketMQ's proxy tells)."""
        return topic_message_type_of(self.entry.properties)


def send_entry(
    msg: v2.Message,
    topic: str,
    *,
    limits: MessageLimits = DEFAULT_LIMITS,
    now_ms: int | None = None,
) -> SendPlan:
    """v2 Message -> our SendEntry (properties as RocketMQ names them), after every
    check RocketMQ's proxy makes (``ha_controller.protocol.validation``), each refused
    with its typed error.  The stored born time is the gateway's clock, as with
    RocketMQ's proxy (the SDK's goes to BORN_TIMESTAMP): the brokers time transaction
    checks from it, and an SDK's clock, or its whole seconds, must not make a half
    message look older than it is."""
    sp = msg.system_properties
    now = now_ms if now_ms is not None else now_ms_clock()
    kind = message_type_of(msg)
    if kind not in TOPIC_TYPE_OF_V2:
        raise BadRequest(f"message type {kind} is not supported")
    if not sp.message_id or sp.message_id.isspace():
        raise IllegalMessageId("message id cannot be empty")
    deliver = delivery_ms(sp.delivery_timestamp) if sp.HasField("delivery_timestamp") else None
    check_message(
        body=msg.body,
        tag=sp.tag if sp.HasField("tag") else None,
        keys=list(sp.keys),
        properties=msg.user_properties,
        reserved=SYSTEM_PROPERTIES,
        message_group=sp.message_group if sp.HasField("message_group") else None,
        deliver_ms=deliver,
        now_ms=now,
        limits=limits,
    )
    props = dict(msg.user_properties)
    message_id = sp.message_id
    props[PROPERTY_UNIQ_KEY] = message_id
    props[PROPERTY_PRODUCER_GROUP] = topic  # a gRPC producer's group is its topic (as RocketMQ)
    if sp.HasField("tag"):
        props[PROPERTY_TAGS] = sp.tag
    if sp.keys:
        props[PROPERTY_KEYS] = " ".join(sp.keys)
    if sp.HasField("born_timestamp"):
        props[PROPERTY_BORN_TIMESTAMP] = str(ms_of_timestamp(sp.born_timestamp))
    group: str | None = None
    if kind == v2.FIFO:
        if not sp.message_group:
            raise IllegalMessageGroup("a FIFO message needs a message group")
        group = sp.message_group
        props[PROPERTY_MESSAGE_GROUP] = group
    elif kind == v2.DELAY:
        if deliver is None:
            raise IllegalDeliveryTime("a DELAY message needs a delivery timestamp")
        props[PROPERTY_TIMER_DELIVER_MS] = str(deliver)
    elif kind == v2.TRANSACTION:
        props[PROPERTY_TRAN_MSG] = "true"
    if sp.HasField("priority"):
        # whatever the declared type, as RocketMQ's proxy (SendMessageActivity): the
        # properties tell the kind the topic must take, and a broker drops the priority
        # of a message of another kind.  (Node.js SDK 1.0.8 declares priority 0 NORMAL.)
        check_priority(sp.priority)
        props[PROPERTY_PRIORITY] = str(sp.priority)
    lite = _lite_topic_of(msg, kind, limits)
    if lite is not None:
        props[PROPERTY_LITE_TOPIC] = lite
    entry = broker_pb2.SendEntry(body=msg.body, properties=props, born_ts_ms=now)
    return SendPlan(entry, kind, message_id, group, sp.born_host, lite)


def _lite_topic_of(msg: v2.Message, kind: int, limits: MessageLimits) -> str | None:
    """A LITE message's lite topic, checked as RocketMQ's proxy does (ILLEGAL_LITE_TOPIC);
    a ``lite_topic`` on a message of another type is refused."""
    sp = msg.system_properties
    if kind != v2.LITE:
        if sp.HasField("lite_topic"):
            raise MessageTypeConflict(
                f"a {v2.MessageType.Name(kind)} message cannot carry a lite topic"
            )
        return None
    check_lite_topic(sp.lite_topic, limits.max_lite_topic_bytes)
    return sp.lite_topic


def _received_type(props: Mapping[str, str]) -> int:
    if PROPERTY_MESSAGE_GROUP in props:
        return v2.FIFO
    if PROPERTY_TIMER_DELIVER_MS in props or PROPERTY_DELAY in props:
        return v2.DELAY
    if PROPERTY_PREPARED_QUEUE_OFFSET in props or PROPERTY_TRAN_MSG in props:
        return v2.TRANSACTION
    if PROPERTY_PRIORITY in props:
        return v2.PRIORITY
    if PROPERTY_LITE_TOPIC in props:
        return v2.LITE
    return v2.NORMAL


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


def _md5_hex(body: bytes) -> str:
    """A body digest for corruption checks, not security."""
    return hashlib.md5(body, usedforsecurity=False).hexdigest().upper()


def message_to_v2(
    m: broker_pb2.Message,
    *,
    topic: str,
    receipt_handle: str | None = None,
    invisible_ms: int | None = None,
) -> v2.Message:
    """One of our broker messages as a v2 message (as RocketMQ's proxy builds it)."""
    props = dict(m.properties)
    sp = v2.SystemProperties(
        message_id=props.get(PROPERTY_UNIQ_KEY) or m.msg_id,
        # MD5 as RocketMQ's proxy sends it: the SDKs disagree on CRC32's text form
        # (Java/Python hex, Node.js 1.0.8 decimal) but all read MD5 as upper-case hex
        body_digest=v2.Digest(type=v2.MD5, checksum=_md5_hex(m.body)),
        body_encoding=v2.IDENTITY,
        message_type=_received_type(props),  # type: ignore[arg-type]
        born_timestamp=timestamp_of_ms(m.born_ts_ms),
        born_host=m.born_host,
        store_timestamp=timestamp_of_ms(m.store_ts_ms),
        store_host=m.store_host,
        queue_id=m.queue_id,
        queue_offset=m.queue_offset,
        # the broker's count: RECONSUME_TIME, plus the re-pops of an orderly batch
        delivery_attempt=max(m.reconsume_times, _int(props.get(PROPERTY_RECONSUME_TIME))) + 1,
    )
    if PROPERTY_TAGS in props:
        sp.tag = props[PROPERTY_TAGS]
    if props.get(PROPERTY_KEYS):
        sp.keys.extend(props[PROPERTY_KEYS].split())
    if PROPERTY_MESSAGE_GROUP in props:
        sp.message_group = props[PROPERTY_MESSAGE_GROUP]
    deliver = props.get(PROPERTY_TIMER_DELIVER_MS, "")
    if deliver.isdigit():
        sp.delivery_timestamp.CopyFrom(timestamp_of_ms(int(deliver)))
    priority = props.get(PROPERTY_PRIORITY, "")
    if priority.isdigit():
        sp.priority = int(priority)
    if props.get(PROPERTY_LITE_TOPIC):
        sp.lite_topic = props[PROPERTY_LITE_TOPIC]
    if receipt_handle is not None:
        sp.receipt_handle = receipt_handle
    if invisible_ms is not None:
        sp.invisible_duration.CopyFrom(duration_of_ms(invisible_ms))
    user = {k: v for k, v in props.items() if k not in HIDDEN_PROPERTIES}
    return v2.Message(
        topic=v2.Resource(name=topic), user_properties=user, system_properties=sp, body=m.body
    )


def recover_command(
    check: broker_pb2.CheckTransactionStateRequest, tx_id: str
) -> v2s.TelemetryCommand:
    """CHECK_TRANSACTION_STATE -> the v2 telemetry command the SDK's checker answers."""
    msg = message_to_v2(check.message, topic=check.message.topic)
    msg.system_properties.message_type = v2.TRANSACTION
    return v2s.TelemetryCommand(
        recover_orphaned_transaction_command=v2s.RecoverOrphanedTransactionCommand(
            message=msg, transaction_id=tx_id
        )
    )


def topics_of(resources: Iterable[v2.Resource]) -> list[str]:
    return [r.name for r in resources if r.name]
