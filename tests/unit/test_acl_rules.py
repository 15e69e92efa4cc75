"""The client ACL without sockets: the users file, signatures, the request-code table,
the dispatcher guard, group names, the gateway's SDK credentials and the client's
message-size check."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fakes import request_context

from ha_controller.acl import (
    ADMIN,
    ANY_USER,
    RULES,
    Acl,
    AclHolder,
    AclTable,
    Check,
    Credentials,
    Need,
    Perm,
    Resource,
    User,
    guard,
    load_acl_file,
    need_of,
    parse_acl,
    parse_perm,
)
from ha_controller.acl.rules import MEMBERS, SUB
from ha_controller.auth import ClusterAuth
from ha_controller.client.message import Message, check_size
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol import envelope
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    AccessDenied,
    BadRequest,
    ConfigError,
    MessageTooLarge,
    SignatureInvalid,
)
from ha_controller.protocol.topics import GROUP_NAME_MAX_LEN, group_name_problem
from ha_controller.proxy.auth import DATE_FORMAT, GatewayAuth, parse_authorization, sdk_signature
from ha_controller.rpc.connection import RequestContext

TABLE = parse_acl(
    {
        "users": [
            {
                "access_key": "app",
                "secret_key": "app-secret-key",
                "topic_perms": ["orders=PUB|SUB", "audit=SUB"],
                "group_perms": ["billing=SUB"],
            },
            {"access_key": "root", "secret_key": "root-secret-key", "admin": True},
        ]
    }
)
APP = TABLE.users["app"]
ROOT = TABLE.users["root"]
APP_CREDS = Credentials("app", "app-secret-key")


def acl_of(*users: User, allow_anonymous: bool = True, **kw: Any) -> Acl:
    table = AclTable(
        0,
        {u.username: u for u in users},
        {u.username: TABLE.entries_of(u.username) for u in users if TABLE.entries_of(u.username)},
    )
    return Acl(AclHolder(table), allow_anonymous=allow_anonymous, **kw)


def ctx(method: int, auth: envelope.RequestAuth | None = None) -> RequestContext:
    return request_context(method, timeout_ms=0, auth=auth)


def offsets(group: str, topic: str = "orders") -> bytes:
    return broker_pb2.ConsumerOffsetRequest(
        consumer_group=group, topic=topic, queue_id=0, offset=0
    ).SerializeToString()


def send(topic: str) -> bytes:
    return broker_pb2.SendMessageRequest(topic=topic, producer_group="p").SerializeToString()


# ---- the users file ----------------------------------------------------------------


def test_perm_text_round_trips() -> None:
    for text in ("DENY", "PUB", "SUB", "PUB|SUB"):
        assert parse_perm(text).text() == text
    assert parse_perm("sub|pub") == Perm.PUB | Perm.SUB
    with pytest.raises(ValueError, match="DENY, PUB, SUB"):
        parse_perm("ADMIN")


def test_acl_file_loads(tmp_path: Path) -> None:
    path = tmp_path / "acl.toml"
    path.write_text(
        '[[users]]\naccess_key = "a"\nsecret_key = "12345678"\n'
        'topic_perms = ["t1=PUB", "t2=SUB|PUB"]\ngroup_perms = ["g=SUB"]\n'
        'default_topic_perm = "SUB"\n'
        '[[users]]\naccess_key = "b"\nsecret_key = "abcdefgh"\nadmin = true\n'
    )
    table = load_acl_file(path)
    assert table.revision == 0
    acl = Acl(AclHolder(table))
    a = table.users["a"]

    def may(resource: Resource, action: str) -> bool:
        from ha_controller.acl import Action

        return acl.permits("a", Need((Check(resource, frozenset({Action.parse(action, "")})),)))

    assert may(Resource.topic("t1"), "Pub") and not may(Resource.topic("t1"), "Sub")
    assert may(Resource.topic("t2"), "Pub") and may(Resource.topic("t2"), "Sub")
    # the default SUB does not reach t1, whose own permission leaves SUB out
    assert may(Resource.topic("other"), "Sub") and not may(Resource.topic("other"), "Pub")
    assert may(Resource.group("g"), "Sub") and not may(Resource.group("other"), "Sub")
    assert table.users["b"].is_super and not a.is_super
    assert "12345678" not in repr(a)


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('[[users]]\naccess_key = "a"\nsecret_key = "short"\n', "users[0].secret_key"),
        ('[[users]]\nsecret_key = "12345678"\n', "users[0].access_key"),
        ('[[users]]\naccess_key = "a"\nsecret_key = "12345678"\nadmn = true\n', "'admn'"),
        (
            '[[users]]\naccess_key = "a"\nsecret_key = "12345678"\ntopic_perms = ["t=ALL"]\n',
            "topic_perms",
        ),
        (
            '[[users]]\naccess_key = "a"\nsecret_key = "12345678"\ngroup_perms = ["g=PUB"]\n',
            "SUB or DENY",
        ),
        (
            '[[users]]\naccess_key = "a"\nsecret_key = "12345678"\n'
            '[[users]]\naccess_key = "a"\nsecret_key = "87654321"\n',
            "appears twice",
        ),
        ("users = 3\n", "[[users]]"),
        ("[[users]\n", "not valid TOML"),
    ],
)
def test_bad_acl_file_is_one_clear_error(tmp_path: Path, body: str, expected: str) -> None:
    path = tmp_path / "acl.toml"
    path.write_text(body)
    with pytest.raises(ConfigError) as info:
        load_acl_file(path)
    assert expected in str(info.value)
    for secret in ("12345678", "87654321", "short"):
        assert f"'{secret}'" not in str(info.value)


def test_acl_config_checks_the_file_at_load(tmp_path: Path) -> None:
    from ha_controller.config import AclConfig

    with pytest.raises(ConfigError, match="no users file"):
        AclConfig(enabled=True)
    with pytest.raises(ConfigError, match="no effect without enabled"):
        AclConfig(allow_anonymous=False)
    bad = tmp_path / "acl.toml"
    bad.write_text('[[users]]\naccess_key = "a"\nsecret_key = "x"\n')
    with pytest.raises(ConfigError, match="secret_key"):
        AclConfig(enabled=True, file=str(bad))


def test_closed_acl_needs_a_cluster_secret(tmp_path: Path) -> None:
    from ha_controller.config import AclConfig, NameserverConfig

    path = tmp_path / "acl.toml"
    path.write_text('[[users]]\naccess_key = "a"\nsecret_key = "12345678"\n')
    closed = AclConfig(enabled=True, allow_anonymous=False, file=str(path))
    with pytest.raises(ConfigError, match="needs a cluster_secret"):
        NameserverConfig(acl=closed)
    assert NameserverConfig(acl=closed, cluster_secret="s").acl.enabled


# ---- signatures ---------------------------------------------------------------------


def test_signed_request_authenticates_its_user() -> None:
    acl = acl_of(APP, ROOT, allow_anonymous=False)
    body = send("orders")
    auth = APP_CREDS.sign(RequestCode.SEND_MESSAGE, body)
    assert auth.access_key == "app"
    assert acl.authenticate(RequestCode.SEND_MESSAGE, body, auth) == APP
    # the signature covers the method and the whole body
    with pytest.raises(AccessDenied, match="signature"):
        acl.authenticate(RequestCode.SEND_MESSAGE, send("audit"), auth)
    with pytest.raises(AccessDenied, match="signature"):
        acl.authenticate(RequestCode.PULL_MESSAGE, body, auth)


def test_refusals_are_counted_by_reason() -> None:
    seen: list[tuple[int, str]] = []
    acl = acl_of(APP, allow_anonymous=False, on_denied=lambda m, r: seen.append((m, r)))
    body = send("orders")
    code = RequestCode.SEND_MESSAGE
    with pytest.raises(AccessDenied, match="anonymous"):
        acl.authenticate(code, body, None)
    with pytest.raises(AccessDenied, match="unknown access key"):
        acl.authenticate(code, body, Credentials("ghost", "ghost-secret").sign(code, body))
    with pytest.raises(AccessDenied, match="signature"):
        acl.authenticate(code, body, Credentials("app", "guessed-secret").sign(code, body))
    old = APP_CREDS.sign(code, body, now_ms=int(time.time() * 1000) - 60_000)
    with pytest.raises(AccessDenied, match="clock"):
        acl.authenticate(code, body, old)
    assert [r for _, r in seen] == ["anonymous", "unknown_user", "bad_signature", "stale"]


def test_anonymous_allowed_is_served_as_without_acl() -> None:
    acl = acl_of(APP, allow_anonymous=True)
    assert acl.authenticate(RequestCode.UPDATE_AND_CREATE_TOPIC, b"", None) is None
    acl.authorize(RequestCode.UPDATE_AND_CREATE_TOPIC, None, ADMIN)


def test_access_key_travels_in_the_envelope() -> None:
    auth = APP_CREDS.sign(RequestCode.SEND_MESSAGE, b"body")
    frame = envelope.encode_request(7, RequestCode.SEND_MESSAGE, b"body", auth=auth)
    payload = frame[12 + 4 :]  # token, serial, listSize, one block's length
    decoded = envelope.decode(7, payload)
    assert isinstance(decoded, envelope.Request)
    assert decoded.auth == auth


# ---- what each request needs ---------------------------------------------------------


def test_every_code_has_a_rule_or_needs_super() -> None:
    for code in RequestCode:
        assert code in RULES, code.name
    assert need_of(999_999, b"").admin
    super_only: tuple[int, ...] = (
        RequestCode.GET_ALL_CONSUMER_OFFSET,
        RequestCode.AUTH_CREATE_USER,
        RequestCode.AUTH_LIST_ACL,
    )
    for method in super_only:
        assert need_of(method, b"").admin
    for method in (RequestCode.REGISTER_BROKER, RequestCode.UNREGISTER_BROKER):
        assert need_of(method, b"") == MEMBERS
    assert need_of(RequestCode.GET_BROKER_CLUSTER_INFO, b"") == ANY_USER


def test_permissions_per_resource() -> None:
    acl = acl_of(APP, ROOT)
    code = RequestCode.UPDATE_CONSUMER_OFFSET
    acl.authorize(code, APP, need_of(code, offsets("billing")))
    with pytest.raises(AccessDenied, match="Group:other Sub"):
        acl.authorize(code, APP, need_of(code, offsets("other")))
    with pytest.raises(AccessDenied, match="Topic:secret Sub"):
        acl.authorize(code, APP, need_of(code, offsets("billing", "secret")))
    with pytest.raises(AccessDenied, match="Topic:audit Pub; user 'app' is denied it"):
        acl.authorize(
            RequestCode.SEND_MESSAGE, APP, need_of(RequestCode.SEND_MESSAGE, send("audit"))
        )
    # a group's retry topic belongs to the group
    acl.authorize(code, APP, need_of(code, offsets("billing", "%RETRY%billing")))
    with pytest.raises(AccessDenied, match="Group:other"):
        acl.authorize(code, APP, need_of(code, offsets("billing", "%RETRY%other")))
    create = broker_pb2.CreateTopicRequest()
    create.topic.topic_name = "orders"
    topic_code = RequestCode.UPDATE_AND_CREATE_TOPIC
    with pytest.raises(AccessDenied, match=r"Topic:orders Create\|Update"):
        acl.authorize(topic_code, APP, need_of(topic_code, create.SerializeToString()))
    acl.authorize(topic_code, ROOT, need_of(topic_code, create.SerializeToString()))
    with pytest.raises(AccessDenied, match="needs a Super user"):
        acl.authorize(RequestCode.AUTH_CREATE_USER, APP, ADMIN)
    lock = broker_pb2.LockBatchRequest(
        consumer_group="billing", mqs=[broker_pb2.MessageQueue(topic="orders")]
    )
    assert need_of(RequestCode.LOCK_BATCH_MQ, lock.SerializeToString()) == Need(
        (Check(Resource.group("billing"), SUB), Check(Resource.topic("orders"), SUB))
    )
    lock.only_this_broker = True
    assert need_of(RequestCode.LOCK_BATCH_MQ, lock.SerializeToString()) == MEMBERS
    # a peer's vote is the cluster's: refused to a Super user too
    with pytest.raises(AccessDenied, match="cluster members"):
        acl.authorize(RequestCode.LOCK_BATCH_MQ, ROOT, MEMBERS)


# ---- the guard -------------------------------------------------------------------------


def test_guard_order_cluster_then_groups_then_acl() -> None:
    cluster = ClusterAuth("cluster-secret", sign_all=True)
    check = guard(cluster, acl_of(APP, allow_anonymous=False))
    code = RequestCode.UPDATE_CONSUMER_OFFSET
    body = offsets("billing")
    # a cluster member passes whatever it asks
    member = RequestCode.GET_ALL_CONSUMER_OFFSET
    check(ctx(member, cluster.sign(member, b"")), b"")
    # a user
    check(ctx(code, APP_CREDS.sign(code, body)), body)
    with pytest.raises(AccessDenied):
        check(ctx(code), body)
    # a control request signed by a user is not a member's
    with pytest.raises(SignatureInvalid):
        beat = RequestCode.BROKER_HEARTBEAT
        check(ctx(beat, APP_CREDS.sign(beat, b"")), b"")
    # bad group names are refused before the ACL looks, signed or not
    bad = offsets("../etc")
    for auth in (None, APP_CREDS.sign(code, bad)):
        with pytest.raises(BadRequest, match="group name"):
            check(ctx(code, auth), bad)


def test_guard_without_acl_still_checks_groups() -> None:
    check = guard(ClusterAuth(None), Acl(None))
    check(ctx(RequestCode.UPDATE_CONSUMER_OFFSET), offsets("fine_group-1%|"))
    check(ctx(RequestCode.SEND_MESSAGE), send("anything"))
    beat = broker_pb2.ClientHeartbeat(consumer_groups=["ok", "x" * 256]).SerializeToString()
    with pytest.raises(BadRequest, match="at most 255"):
        check(ctx(RequestCode.HEART_BEAT), beat)
    empty = common_pb2.Empty().SerializeToString()
    check(ctx(RequestCode.GET_BROKER_STATUS), empty)


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("g", None),
        ("%|_-AZaz09", None),
        ("x" * GROUP_NAME_MAX_LEN, None),
        ("", "empty"),
        ("x" * (GROUP_NAME_MAX_LEN + 1), "at most 255"),
        ("a.b", "outside"),
        ("a b", "outside"),
        ("CID_RMQ_SYS_X", "reserved"),
        ("%RETRY%g", "reserved"),
        ("%DELAY_OFFSET%", "reserved"),
    ],
)
def test_group_names(name: str, problem: str | None) -> None:
    got = group_name_problem(name)
    if problem is None:
        assert got is None
    else:
        assert got is not None and problem in got
    assert group_name_problem("CID_RMQ_SYS_X", allow_reserved=True) is None


# ---- the gateway: the SDKs' credentials --------------------------------------------


def sdk_metadata(ak: str, sk: str, when: datetime) -> list[tuple[str, str]]:
    stamp = when.strftime(DATE_FORMAT)
    auth = (
        f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, "
        f"Signature={sdk_signature(sk, stamp)}"
    )
    return [("x-mq-date-time", stamp), ("authorization", auth)]


def test_gateway_checks_sdk_credentials() -> None:
    gw = GatewayAuth(acl_of(APP, allow_anonymous=False))
    now = datetime.now(UTC)
    assert gw.identify(sdk_metadata("app", "app-secret-key", now)) == APP
    # the Python SDK writes its local time with a Z
    assert gw.identify(sdk_metadata("app", "app-secret-key", datetime.now())) == APP
    with pytest.raises(AccessDenied, match="signature"):
        gw.identify(sdk_metadata("app", "wrong-secret", now))
    with pytest.raises(AccessDenied, match="unknown access key"):
        gw.identify(sdk_metadata("nobody", "app-secret-key", now))
    old = datetime.fromtimestamp(time.time() - 86_400 * 2, UTC)
    with pytest.raises(AccessDenied, match="gateway's clock"):
        gw.identify(sdk_metadata("app", "app-secret-key", old))
    with pytest.raises(AccessDenied, match="anonymous"):
        gw.identify([])
    with pytest.raises(AccessDenied, match="anonymous"):
        gw.identify(sdk_metadata("", "", now))
    with pytest.raises(AccessDenied, match="MQv2-HMAC-SHA1"):
        gw.identify([("authorization", "Basic abc")])
    assert parse_authorization(
        "MQv2-HMAC-SHA1 Credential=ak, SignedHeaders=x-mq-date-time, Signature=AB01"
    ) == ("ak", "x-mq-date-time", "ab01")
    assert GatewayAuth(acl_of(APP, allow_anonymous=True)).identify([]) is None


def test_gateway_signs_as_the_caller_else_as_the_cluster() -> None:
    import contextvars

    cluster = ClusterAuth("cluster-secret", sign_all=True)
    gw = GatewayAuth(acl_of(APP), cluster)
    own = gw.signer(RequestCode.HEART_BEAT, b"")
    assert own is not None and not own.access_key and not own.on_behalf_of  # its own work

    def as_caller(user: User | None) -> envelope.RequestAuth | None:
        GatewayAuth.serve_as(user, None)
        return gw.signer(RequestCode.SEND_MESSAGE, b"x")

    signed = contextvars.copy_context().run(as_caller, APP)
    assert signed is not None and signed.on_behalf_of == "app" and not signed.access_key
    assert contextvars.copy_context().run(as_caller, None) is None  # anonymous caller
    # the receiver authorises it as that user, never as a member
    request = ctx(RequestCode.SEND_MESSAGE, signed)
    cluster.check(request, b"x")
    assert request.on_behalf == ("app", "") and not request.authenticated
    with pytest.raises(SignatureInvalid):
        cluster.check(ctx(RequestCode.SEND_MESSAGE, signed), b"changed")
    # without a cluster secret the gateway signs as the user itself
    alone = GatewayAuth(acl_of(APP))
    plain = contextvars.copy_context().run(
        lambda: (GatewayAuth.serve_as(APP), alone.signer(RequestCode.SEND_MESSAGE, b"x"))[1]
    )
    assert plain is not None and plain.access_key == "app"


# ---- the client's size check --------------------------------------------------------------


def test_message_size_checked_before_sending() -> None:
    check_size([Message("t", b"x" * 1024)], 1024)
    with pytest.raises(MessageTooLarge, match="max 1024"):
        check_size([Message("t", b"x" * 1025)], 1024)
    with pytest.raises(MessageTooLarge, match="batch of 2"):
        check_size([Message("t", b"x" * 600)] * 2, 1024)
    # one message: its body alone counts, as RocketMQ's maxMessageSize (properties are
    # bounded on their own); a batch counts bodies and properties
    check_size([Message("t", b"x" * 1000, properties={"k": "v" * 100})], 1024)
    with pytest.raises(MessageTooLarge, match="batch of 2"):
        check_size([Message("t", b"x" * 500, properties={"k": "v" * 100})] * 2, 1024)
    assert not MessageTooLarge.retriable


def test_parse_acl_from_a_table() -> None:
    table = parse_acl({"users": [{"access_key": "a", "secret_key": "12345678"}]})
    assert table.users["a"] == User("a", "12345678")


def test_gateway_answers_a_denied_request_forbidden() -> None:
    from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
    from ha_controller.proxy.convert import code_for

    assert code_for(AccessDenied("needs SUB on group 'g'")) == v2.FORBIDDEN
