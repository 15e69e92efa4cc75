"""What each request touches: the resources it is authorised against and the actions
it needs, for every request code (:data:`RULES`) and every gRPC method of the gateway
(:data:`GRPC_RULES`).

A request :class:`Need` is a list of :class:`Check` (one of some actions on one
resource, each checked against the user's ACL), or the ``Super`` role (``admin``), or
the cluster itself (``members``: requests only brokers and nameservers send, such as a
peer's lock vote).  Names are mapped the way RocketMQ maps them:

- ``%RETRY%G`` and ``%DLQ%G`` are group ``G``'s topics: authorised as ``Group:G`` with
  ``Sub`` (RocketMQ's ``Resource.ofGroup``);
- the brokers' own topics (``RMQ_SYS_*``, ``rmq_sys_*``, ``SCHEDULE_TOPIC_*``: the
  transaction half/op topics, the delay and timer topics, POP's revive log, the offset
  records) are for ``Super`` users and the cluster only, whatever a user's entries say
  (their messages are other applications' pending transactions, delayed messages and
  acknowledgements);
- END_TRANSACTION is authorised against the topic of the half message it resolves, not
  the topic the request names (:data:`END_TRANSACTION_TOPIC`: the broker, which holds
  the half message, supplies it to the guard).

A request code not in :data:`RULES` needs ``Super`` (a handler added later is refused
to users until someone writes its rule); ``tests/unit/test_acl_rules_table.py``
checks that every code is here and that docs/security.md's table says what these
rules do.

Sans-IO.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf.message import DecodeError, Message

from ha_controller.acl.model import Action, Resource
from ha_controller.proto import acl_pb2, broker_pb2, common_pb2, nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.properties import AUTO_CREATE_TOPIC, DLQ_PREFIX, RETRY_PREFIX
from ha_controller.protocol.topics import SYSTEM_TOPIC_PREFIXES

__all__ = [
    "ADMIN",
    "ANY_USER",
    "END_TRANSACTION_TOPIC",
    "GRPC_RULES",
    "MEMBERS",
    "RULES",
    "Check",
    "Need",
    "Rule",
    "need_of",
    "system_topic",
]

PUB: Final = frozenset({Action.PUB})
SUB: Final = frozenset({Action.SUB})
SUB_GET: Final = frozenset({Action.SUB, Action.GET})
SUB_UPDATE: Final = frozenset({Action.SUB, Action.UPDATE})
ROUTE: Final = frozenset({Action.PUB, Action.SUB, Action.GET})
CREATE_UPDATE: Final = frozenset({Action.CREATE, Action.UPDATE})
DELETE: Final = frozenset({Action.DELETE})


@dataclass(frozen=True, slots=True)
class Check:
    """One of ``actions`` on ``resource`` (a literal one)."""

    resource: Resource
    actions: frozenset[Action]

    def text(self) -> str:
        return f"{self.resource.key()} {'|'.join(sorted(a.value for a in self.actions))}"


@dataclass(frozen=True, slots=True)
class Need:
    """What one request needs: every check, or the Super role, or the cluster."""

    checks: tuple[Check, ...] = ()
    admin: bool = False
    members: bool = False
    #: why the Super role or the cluster is needed (for the refusal's message)
    why: str = ""

    def __add__(self, other: Need) -> Need:
        return Need(
            tuple(dict.fromkeys((*self.checks, *other.checks))),
            self.admin or other.admin,
            self.members or other.members,
            self.why or other.why,
        )


ANY_USER: Final = Need()
ADMIN: Final = Need(admin=True)
MEMBERS: Final = Need(members=True, why="a request only cluster members send")


def system_topic(topic: str) -> bool:
    """Whether ``topic`` is one of the brokers' own (not a group's retry/DLQ topic)."""
    return topic.startswith(SYSTEM_TOPIC_PREFIXES)


def group_of_topic(topic: str) -> str | None:
    """The group whose retry or dead-letter topic ``topic`` is, or None."""
    for prefix in (RETRY_PREFIX, DLQ_PREFIX):
        if topic.startswith(prefix):
            return topic[len(prefix) :]
    return None


def topic_need(topic: str, actions: frozenset[Action]) -> Need:
    """``actions`` on topic ``topic``, mapped as the module says."""
    group = group_of_topic(topic)
    if group is not None:
        return Need((Check(Resource.group(group), SUB),))
    if system_topic(topic):
        return Need(admin=True, why=f"topic {topic[:128]!r} is the brokers' own")
    return Need((Check(Resource.topic(topic), actions),))


def route_need(topic: str) -> Need:
    """A route lookup: Pub, Sub or Get on the topic; the brokers' own topics' routes
    (and ``TBW102``, the auto-create template producers ask for) to any user."""
    if topic == AUTO_CREATE_TOPIC or system_topic(topic):
        return ANY_USER
    group = group_of_topic(topic)
    if group is not None:
        return Need((Check(Resource.group(group), SUB_GET),))
    return Need((Check(Resource.topic(topic), ROUTE),))


def group_need(group: str, actions: frozenset[Action] = SUB) -> Need:
    """``actions`` on the group (an empty name too: the guard's name check refuses it)."""
    return Need((Check(Resource.group(group), actions),))


def _sum(needs: Iterable[Need]) -> Need:
    out = ANY_USER
    for n in needs:
        out = out + n
    return out


# ---- the rule of each request code -------------------------------------------------------

#: END_TRANSACTION's topic: the half message's real topic, looked up by the broker that
#: holds it (``(half_queue_offset, transaction_id) -> topic or None``); the request's
#: own topic where no broker supplies it (a nameserver, a half not found).
HalfTopic = Callable[[Any], str | None]
END_TRANSACTION_TOPIC: Final = "END_TRANSACTION_TOPIC"


@dataclass(frozen=True)
class Rule:
    """The request type and what a request of it needs, with the docs' words for it
    (``resources`` / ``actions`` columns of docs/security.md's table)."""

    request: type[Message] | None
    need: Callable[..., Need] | None
    resources: str
    actions: str
    note: str = ""


def _send(req: Any) -> Need:
    return topic_need(req.topic, PUB)


def _recall(req: Any) -> Need:
    return topic_need(req.topic, PUB)


def _end_transaction(req: Any, half_topic: HalfTopic | None = None) -> Need:
    topic = half_topic(req) if half_topic is not None else None
    return topic_need(topic if topic is not None else req.topic, PUB)


def _consume(req: Any) -> Need:
    return topic_need(req.topic, SUB) + group_need(req.consumer_group)


def _query_offset(req: Any) -> Need:
    return topic_need(req.topic, SUB_GET) + group_need(req.consumer_group, SUB_GET)


def _update_offset(req: Any) -> Need:
    return topic_need(req.topic, SUB_UPDATE) + group_need(req.consumer_group, SUB_UPDATE)


def _queue_query(req: Any) -> Need:
    return topic_need(req.topic, SUB_GET)


def _lock(req: Any) -> Need:
    if req.only_this_broker:
        return MEMBERS  # a peer broker's quorum vote
    topics = dict.fromkeys(mq.topic for mq in req.mqs)
    return group_need(req.consumer_group) + _sum(topic_need(t, SUB) for t in topics)


def _client(req: Any) -> Need:
    # producer groups are not authorised here (RocketMQ checks none either): a
    # transaction check goes only to a producer whose user may publish to the half
    # message's topic (broker_agent.special.transaction)
    return _sum(group_need(g) for g in req.consumer_groups)


def _consumer_list(req: Any) -> Need:
    return group_need(req.consumer_group, SUB_GET)


def _consume_stats(req: Any) -> Need:
    return group_need(req.consumer_group, SUB_GET)


def _create_topic(req: Any) -> Need:
    return topic_need(req.topic.topic_name, CREATE_UPDATE)


def _delete_topic(req: Any) -> Need:
    return topic_need(req.topic.topic_name, DELETE)


def _subscription_group(req: Any) -> Need:
    return group_need(req.config.group_name, CREATE_UPDATE)


def _route(req: Any) -> Need:
    return route_need(req.topic)


def _cluster_only(_: Any = None) -> Need:
    return MEMBERS


def _super_only(_: Any = None) -> Need:
    return Need(admin=True, why="managing users and ACLs")


def _switch_admin(_: Any = None) -> Need:
    return Need(admin=True, why="switching a group's master")


_ANY = (None, None)

RULES: Final[dict[int, Rule]] = {
    RequestCode.SEND_MESSAGE: Rule(
        broker_pb2.SendMessageRequest, _send, "Topic:<topic>", "Pub", "retry/DLQ topic: Group Sub"
    ),
    RequestCode.PULL_MESSAGE: Rule(
        broker_pb2.PullMessageRequest, _consume, "Topic:<topic>, Group:<group>", "Sub"
    ),
    RequestCode.QUERY_CONSUMER_OFFSET: Rule(
        broker_pb2.ConsumerOffsetRequest,
        _query_offset,
        "Topic:<topic>, Group:<group>",
        "Sub or Get",
    ),
    RequestCode.UPDATE_CONSUMER_OFFSET: Rule(
        broker_pb2.ConsumerOffsetRequest,
        _update_offset,
        "Topic:<topic>, Group:<group>",
        "Sub or Update",
    ),
    RequestCode.UPDATE_AND_CREATE_TOPIC: Rule(
        broker_pb2.CreateTopicRequest, _create_topic, "Topic:<topic>", "Create or Update"
    ),
    RequestCode.GET_ALL_TOPIC_CONFIG: Rule(None, None, "-", "any user", "the topic list"),
    RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: Rule(
        broker_pb2.QueueOffsetRequest, _queue_query, "Topic:<topic>", "Sub or Get"
    ),
    RequestCode.GET_MAX_OFFSET: Rule(
        broker_pb2.QueueOffsetRequest, _queue_query, "Topic:<topic>", "Sub or Get"
    ),
    RequestCode.GET_MIN_OFFSET: Rule(
        broker_pb2.QueueOffsetRequest, _queue_query, "Topic:<topic>", "Sub or Get"
    ),
    RequestCode.GET_EARLIEST_MSG_STORETIME: Rule(
        broker_pb2.QueueOffsetRequest, _queue_query, "Topic:<topic>", "Sub or Get"
    ),
    RequestCode.QUERY_MESSAGE: Rule(
        broker_pb2.QueryMessageRequest, _queue_query, "Topic:<topic>", "Sub or Get"
    ),
    RequestCode.VIEW_MESSAGE_BY_ID: Rule(
        broker_pb2.ViewMessageRequest,
        _super_only,
        "-",
        "Super",
        "the request names no topic; the answer may hold any",
    ),
    RequestCode.HEART_BEAT: Rule(
        broker_pb2.ClientHeartbeat,
        _client,
        "Group:<consumer group> (each)",
        "Sub",
        "producer groups: see below",
    ),
    RequestCode.UNREGISTER_CLIENT: Rule(
        broker_pb2.ClientHeartbeat, _client, "Group:<consumer group> (each)", "Sub"
    ),
    RequestCode.END_TRANSACTION: Rule(
        broker_pb2.EndTransactionRequest,
        _end_transaction,
        "Topic:<topic of the half message>",
        "Pub",
        "not the topic the request names",
    ),
    RequestCode.GET_CONSUMER_LIST_BY_GROUP: Rule(
        broker_pb2.ConsumerListRequest, _consumer_list, "Group:<group>", "Sub or Get"
    ),
    RequestCode.CHECK_TRANSACTION_STATE: Rule(
        None, None, "-", "served by producers", "a broker asks a producer"
    ),
    RequestCode.LOCK_BATCH_MQ: Rule(
        broker_pb2.LockBatchRequest,
        _lock,
        "Group:<group>, Topic:<topic> (each queue's)",
        "Sub",
        "a peer's vote: cluster only",
    ),
    RequestCode.UNLOCK_BATCH_MQ: Rule(
        broker_pb2.LockBatchRequest,
        _lock,
        "Group:<group>, Topic:<topic> (each queue's)",
        "Sub",
        "a peer's vote: cluster only",
    ),
    RequestCode.GET_ALL_CONSUMER_OFFSET: Rule(common_pb2.Empty, _super_only, "-", "Super"),
    RequestCode.GET_ALL_DELAY_OFFSET: Rule(common_pb2.Empty, _super_only, "-", "Super"),
    RequestCode.GET_TIMER_CHECK_POINT: Rule(common_pb2.Empty, _super_only, "-", "Super"),
    RequestCode.REGISTER_BROKER: Rule(None, _cluster_only, "-", "cluster"),
    RequestCode.UNREGISTER_BROKER: Rule(None, _cluster_only, "-", "cluster"),
    RequestCode.GET_ROUTEINFO_BY_TOPIC: Rule(
        nameserver_pb2.GetRouteInfoRequest,
        _route,
        "Topic:<topic>",
        "Pub, Sub or Get",
        "retry topic: Group Sub or Get; system topics and TBW102: any user",
    ),
    RequestCode.GET_BROKER_CLUSTER_INFO: Rule(None, None, "-", "any user"),
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: Rule(
        broker_pb2.UpdateSubscriptionGroupRequest,
        _subscription_group,
        "Group:<group>",
        "Create or Update",
    ),
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: Rule(None, None, "-", "any user"),
    RequestCode.GET_CONSUME_STATS: Rule(
        broker_pb2.ConsumeStatsRequest, _consume_stats, "Group:<group>", "Sub or Get"
    ),
    RequestCode.DELETE_TOPIC_IN_BROKER: Rule(
        broker_pb2.CreateTopicRequest, _delete_topic, "Topic:<topic>", "Delete"
    ),
    RequestCode.DELETE_TOPIC_IN_NAMESRV: Rule(
        broker_pb2.CreateTopicRequest, _delete_topic, "Topic:<topic>", "Delete"
    ),
    RequestCode.QUERY_DATA_VERSION: Rule(None, _cluster_only, "-", "cluster"),
    RequestCode.RECALL_MESSAGE: Rule(
        broker_pb2.RecallMessageRequest, _recall, "Topic:<topic>", "Pub"
    ),
    RequestCode.GET_BROKER_MEMBER_GROUP: Rule(None, None, "-", "any user"),
    RequestCode.BROKER_HEARTBEAT: Rule(None, _cluster_only, "-", "cluster"),
    RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE: Rule(None, _cluster_only, "-", "cluster"),
    RequestCode.EXCHANGE_BROKER_HA_INFO: Rule(None, _cluster_only, "-", "cluster"),
    RequestCode.CONTROLLER_ALTER_SYNC_STATE_SET: Rule(None, _cluster_only, "-", "cluster"),
    RequestCode.CONTROLLER_ELECT_MASTER: Rule(
        None, _switch_admin, "-", "Super", "hactl group switch"
    ),
    RequestCode.CONTROLLER_GET_REPLICA_INFO: Rule(None, _cluster_only, "-", "cluster"),
    RequestCode.GET_BROKER_EPOCH_CACHE: Rule(None, _cluster_only, "-", "cluster"),
    RequestCode.NOTIFY_BROKER_ROLE_CHANGED: Rule(None, _cluster_only, "-", "cluster"),
    RequestCode.POP_MESSAGE: Rule(
        broker_pb2.PopMessageRequest, _consume, "Topic:<topic>, Group:<group>", "Sub"
    ),
    RequestCode.ACK_MESSAGE: Rule(
        broker_pb2.AckMessageRequest, _consume, "Topic:<topic>, Group:<group>", "Sub"
    ),
    RequestCode.CHANGE_MESSAGE_INVISIBLETIME: Rule(
        broker_pb2.AckMessageRequest, _consume, "Topic:<topic>, Group:<group>", "Sub"
    ),
    RequestCode.WATCH_ROUTE: Rule(
        nameserver_pb2.WatchRouteRequest, _route, "Topic:<topic>", "Pub, Sub or Get", "as a route"
    ),
    RequestCode.GET_BROKER_STATUS: Rule(None, None, "-", "any user"),
    RequestCode.RPC_PING: Rule(None, None, "-", "any connection", "answered before any guard"),
    RequestCode.HA_REPORT_OFFSET: Rule(None, _cluster_only, "-", "cluster", "the HA port"),
    RequestCode.HA_TRANSFER: Rule(None, _cluster_only, "-", "cluster", "the HA port"),
    RequestCode.GET_COMMITLOG_RANGE: Rule(None, _cluster_only, "-", "cluster"),
    RequestCode.HA_HELLO: Rule(None, _cluster_only, "-", "cluster", "the HA port"),
    RequestCode.HA_AUTH: Rule(None, _cluster_only, "-", "cluster", "the HA port"),
    RequestCode.HA_EPOCH: Rule(None, _cluster_only, "-", "cluster", "the HA port"),
    RequestCode.GET_TRANSACTION_OFFSETS: Rule(common_pb2.Empty, _super_only, "-", "Super"),
    RequestCode.GET_RECALL_TABLE: Rule(common_pb2.Empty, _super_only, "-", "Super"),
    RequestCode.GET_POP_ACK_TABLE: Rule(common_pb2.Empty, _super_only, "-", "Super"),
    RequestCode.AUTH_CREATE_USER: Rule(acl_pb2.UserRequest, _super_only, "-", "Super"),
    RequestCode.AUTH_UPDATE_USER: Rule(acl_pb2.UserRequest, _super_only, "-", "Super"),
    RequestCode.AUTH_DELETE_USER: Rule(acl_pb2.UserQuery, _super_only, "-", "Super"),
    RequestCode.AUTH_GET_USER: Rule(acl_pb2.UserQuery, _super_only, "-", "Super"),
    RequestCode.AUTH_LIST_USER: Rule(acl_pb2.UserQuery, _super_only, "-", "Super"),
    RequestCode.AUTH_CREATE_ACL: Rule(acl_pb2.AclRequest, _super_only, "-", "Super"),
    RequestCode.AUTH_UPDATE_ACL: Rule(acl_pb2.AclRequest, _super_only, "-", "Super"),
    RequestCode.AUTH_DELETE_ACL: Rule(acl_pb2.AclQuery, _super_only, "-", "Super"),
    RequestCode.AUTH_GET_ACL: Rule(acl_pb2.AclQuery, _super_only, "-", "Super"),
    RequestCode.AUTH_LIST_ACL: Rule(acl_pb2.AclQuery, _super_only, "-", "Super"),
    RequestCode.GET_ACL_TABLE: Rule(None, _cluster_only, "-", "cluster", "holds secret keys"),
    RequestCode.PUT_ACL_TABLE: Rule(None, _cluster_only, "-", "cluster"),
    RequestCode.PUT_RECALLS: Rule(None, _cluster_only, "-", "cluster"),
    RequestCode.PREPARE_SWITCH: Rule(None, _cluster_only, "-", "cluster"),
}


def parse(cls: type[Message], body: bytes) -> Any:
    msg = cls()
    try:
        msg.ParseFromString(body)
    except (DecodeError, ValueError, RuntimeError):
        return None
    return msg


def need_of(method: int, body: bytes, *, half_topic: HalfTopic | None = None) -> Need:
    """What request ``method`` with ``body`` needs.  An undecodable body needs nothing
    beyond its code's rule (its handler refuses it as ``BadRequest``); a code without
    a rule needs ``Super``."""
    rule = RULES.get(method)
    if rule is None:
        return Need(admin=True, why="a request without an ACL rule")
    if rule.need is None:
        return ANY_USER
    if rule.request is None:
        return rule.need(None)
    if rule.need in (_cluster_only, _super_only):
        return rule.need(None)
    req = parse(rule.request, body)
    if req is None:
        return ANY_USER
    if method == RequestCode.END_TRANSACTION:
        return _end_transaction(req, half_topic)
    return rule.need(req)


#: Codes whose requests name consumer groups that a broker then keeps (offsets,
#: consumer lists, locks, POP checkpoints): their names are checked always.
GROUP_CODES: Final[frozenset[int]] = frozenset(
    code
    for code, rule in RULES.items()
    if rule.need in (_consume, _query_offset, _update_offset, _lock, _client, _consumer_list)
)


#: Codes whose requests may be for cluster members only (refused to Super users too).
MAYBE_MEMBERS_ONLY: Final[frozenset[int]] = frozenset(
    code for code, rule in RULES.items() if rule.need in (_cluster_only, _lock)
)


# ---- the gateway's gRPC methods ----------------------------------------------------------


@dataclass(frozen=True)
class GrpcRule:
    """What a gRPC method needs (``need(request) -> Need``), with the docs' words."""

    need: Callable[[Any], Need] | None
    resources: str
    actions: str
    note: str = ""


def _grpc_send(req: Any) -> Need:
    return _sum(topic_need(m.topic.name, PUB) for m in req.messages)


def _grpc_group_topic(req: Any) -> Need:
    return group_need(req.group.name) + topic_need(req.topic.name, SUB)


def _grpc_receive(req: Any) -> Need:
    return group_need(req.group.name) + topic_need(req.message_queue.topic.name, SUB)


def _grpc_heartbeat(req: Any) -> Need:
    # consumer client types only (RocketMQ: a producer's heartbeat names no resource)
    from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2

    consumer = (
        v2.PUSH_CONSUMER,
        v2.SIMPLE_CONSUMER,
        v2.PULL_CONSUMER,
        v2.LITE_PUSH_CONSUMER,
        v2.LITE_SIMPLE_CONSUMER,
    )
    if req.client_type not in consumer:
        return ANY_USER
    return group_need(req.group.name)


def _grpc_group(req: Any) -> Need:
    return group_need(req.group.name) if req.group.name else ANY_USER


def _grpc_invisible(req: Any) -> Need:
    return group_need(req.group.name) + (
        topic_need(req.topic.name, SUB) if req.topic.name else ANY_USER
    )


def _grpc_route(req: Any) -> Need:
    return route_need(req.topic.name)


def _grpc_topic_pub(req: Any) -> Need:
    return topic_need(req.topic.name, PUB)


def grpc_settings_need(settings: Any) -> Need:
    """A Telemetry ``settings`` command: Pub on every topic a producer declares; Sub on
    a consumer's group and on every topic it subscribes (RocketMQ's proxy)."""
    need = ANY_USER
    if settings.HasField("publishing"):
        need = need + _sum(topic_need(t.name, PUB) for t in settings.publishing.topics)
    if settings.HasField("subscription"):
        sub = settings.subscription
        need = need + group_need(sub.group.name)
        need = need + _sum(topic_need(e.topic.name, SUB) for e in sub.subscriptions)
    return need


GRPC_RULES: Final[dict[str, GrpcRule]] = {
    "QueryRoute": GrpcRule(_grpc_route, "Topic:<topic>", "Pub, Sub or Get"),
    "Heartbeat": GrpcRule(_grpc_heartbeat, "Group:<group>", "Sub", "consumers only"),
    "SendMessage": GrpcRule(_grpc_send, "Topic:<topic>", "Pub"),
    "QueryAssignment": GrpcRule(_grpc_group_topic, "Topic:<topic>, Group:<group>", "Sub"),
    "ReceiveMessage": GrpcRule(_grpc_receive, "Topic:<topic>, Group:<group>", "Sub"),
    "AckMessage": GrpcRule(_grpc_group_topic, "Topic:<topic>, Group:<group>", "Sub"),
    "ForwardMessageToDeadLetterQueue": GrpcRule(
        _grpc_group_topic, "Topic:<topic>, Group:<group>", "Sub"
    ),
    "PullMessage": GrpcRule(None, "-", "not offered"),
    "UpdateOffset": GrpcRule(None, "-", "not offered"),
    "GetOffset": GrpcRule(None, "-", "not offered"),
    "QueryOffset": GrpcRule(None, "-", "not offered"),
    "EndTransaction": GrpcRule(
        _grpc_topic_pub,
        "Topic:<topic of the half message>",
        "Pub",
        "checked by the broker holding the half",
    ),
    "Telemetry": GrpcRule(
        None,
        "Topic:<each published topic>; Group:<group>, Topic:<each subscribed topic>",
        "Pub; Sub",
        "the settings command",
    ),
    "NotifyClientTermination": GrpcRule(_grpc_group, "Group:<group>", "Sub", "when named"),
    "ChangeInvisibleDuration": GrpcRule(_grpc_invisible, "Topic:<topic>, Group:<group>", "Sub"),
    "RecallMessage": GrpcRule(_grpc_topic_pub, "Topic:<topic>", "Pub"),
    "SyncLiteSubscription": GrpcRule(_grpc_group_topic, "Topic:<topic>, Group:<group>", "Sub"),
}
