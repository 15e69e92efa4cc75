"""ACL 2.0 without sockets: resources and their patterns, the matching order, table
changes and their refusals, the stored form, the replay window, the holder and the
nameserver's spread."""

from __future__ import annotations

import ipaddress
from collections.abc import Coroutine
from typing import Any

import pytest
from fakes import FakeClock

from ha_controller.acl import (
    Acl,
    AclHolder,
    AclInvalid,
    AclTable,
    Action,
    Check,
    Need,
    PolicyEntry,
    Resource,
    User,
    UserStatus,
    UserType,
    parse_acl,
)
from ha_controller.acl.authorizer import decide
from ha_controller.acl.model import Pattern, ResourceType, subject_of
from ha_controller.acl.replay import MAX_SESSIONS_PER_KEY, WINDOW, ReplayWindow
from ha_controller.acl.sync import AclSpread
from ha_controller.acl.wire import table_from_pb, table_to_pb
from ha_controller.auth import NumberedNonces
from ha_controller.protocol.errors import AccessDenied
from ha_controller.rpc import ConnectionPool

ALICE = User("alice", "alice-secret")
ROOT = User("root", "root-secret", UserType.SUPER)


def entry(
    resource: str, *actions: str, decision: str = "Allow", ips: tuple[str, ...] = ()
) -> PolicyEntry:
    return PolicyEntry.from_dict(
        {
            "resource": resource,
            "actions": list(actions),
            "decision": decision,
            "source_ips": list(ips),
        }
    )


def table(*entries: PolicyEntry) -> AclTable:
    t = AclTable(0, {"alice": ALICE, "root": ROOT})
    return t.create_acl("alice", entries) if entries else t


def allowed(t: AclTable, resource: Resource, action: str, ip: str | None = None) -> bool:
    addr = ipaddress.ip_address(ip) if ip else None
    check = Check(resource, frozenset({Action.parse(action, "action")}))
    return decide(t, "alice", check, addr) is None


# ---- resources ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kind", "name", "pattern"),
    [
        ("Topic:orders", ResourceType.TOPIC, "orders", Pattern.LITERAL),
        ("topic:orders-*", ResourceType.TOPIC, "orders-", Pattern.PREFIXED),
        ("Group:*", ResourceType.GROUP, "", Pattern.ANY),
        ("Cluster:DefaultCluster", ResourceType.CLUSTER, "DefaultCluster", Pattern.LITERAL),
        ("*", ResourceType.ANY, "", Pattern.ANY),
        (" Topic:%RETRY%g ", ResourceType.TOPIC, "%RETRY%g", Pattern.LITERAL),
    ],
)
def test_resources_parse_and_print(
    text: str, kind: ResourceType, name: str, pattern: Pattern
) -> None:
    r = Resource.parse(text)
    assert (r.type, r.name, r.pattern) == (kind, name, pattern)
    assert Resource.parse(r.key()) == r


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("orders", "TYPE:NAME"),
        ("Queue:x", "unknown type"),
        ("Topic:", "empty name"),
        ("Topic:a*b", "'*' may only end"),
        ("Topic:**", "'*' may only end"),
        ("Topic:with space", "characters"),
        ("Topic:" + "x" * 256, "characters"),
    ],
)
def test_malformed_resources_are_refused(text: str, words: str) -> None:
    with pytest.raises(AclInvalid, match=words):
        Resource.parse(text)


def test_bad_actions_ips_decisions_and_users_are_refused() -> None:
    with pytest.raises(AclInvalid, match="unknown action 'Fly'"):
        entry("Topic:x", "Fly")
    with pytest.raises(AclInvalid, match="at least one action"):
        entry("Topic:x")
    with pytest.raises(AclInvalid, match="CIDR"):
        entry("Topic:x", "Pub", ips=("10.0.0/33",))
    with pytest.raises(AclInvalid, match="unknown decision"):
        entry("Topic:x", "Pub", decision="Maybe")
    with pytest.raises(AclInvalid, match="username"):
        User("has space", "12345678")
    with pytest.raises(AclInvalid, match=r"8\.\.1024"):
        User("u", "short")
    with pytest.raises(AclInvalid, match="control characters"):
        User("u", "secret\nkey-1")
    with pytest.raises(AclInvalid, match="only User"):
        subject_of("Group:g")
    assert subject_of("User:alice") == subject_of("alice") == "alice"


# ---- the matching order --------------------------------------------------------------------


def test_no_entry_is_a_refusal_and_actions_must_match() -> None:
    t = table(entry("Topic:orders", "Sub"))
    assert allowed(t, Resource.topic("orders"), "Sub")
    assert not allowed(t, Resource.topic("orders"), "Pub")
    assert not allowed(t, Resource.topic("other"), "Sub")
    assert not allowed(t, Resource.group("orders"), "Sub")  # types do not mix


def test_the_most_specific_entry_decides() -> None:
    t = table(
        entry("*", "All"),
        entry("Topic:*", "Pub", decision="Deny"),
        entry("Topic:ord-*", "Pub"),
        entry("Topic:ord-secret-*", "Pub", decision="Deny"),
        entry("Topic:ord-secret-ok", "Pub"),
    )
    assert allowed(t, Resource.group("g"), "Sub")  # only * matches
    assert not allowed(t, Resource.topic("misc"), "Pub")  # Topic:* before *
    assert allowed(t, Resource.topic("ord-1"), "Pub")  # a prefix before Topic:*
    assert not allowed(t, Resource.topic("ord-secret-2"), "Pub")  # the longer prefix
    assert allowed(t, Resource.topic("ord-secret-ok"), "Pub")  # a literal name first
    assert allowed(t, Resource.topic("misc"), "Sub")  # Topic:* says nothing of Sub: *


def test_deny_wins_over_allow_of_the_same_resource() -> None:
    t = table(entry("Topic:orders", "Pub", "Sub"), entry("Topic:orders", "Pub", decision="Deny"))
    assert not allowed(t, Resource.topic("orders"), "Pub")
    assert allowed(t, Resource.topic("orders"), "Sub")
    # a request that needs one of several actions: allowed when one is
    route = Check(Resource.topic("orders"), frozenset({Action.PUB, Action.SUB, Action.GET}))
    assert decide(t, "alice", route, None) is None


def test_all_covers_every_action_and_source_ips_restrict() -> None:
    t = table(entry("Topic:t", "All", ips=("10.0.0.0/8", "::1")))
    assert allowed(t, Resource.topic("t"), "Delete", "10.1.2.3")
    assert allowed(t, Resource.topic("t"), "Pub", "::1")
    assert not allowed(t, Resource.topic("t"), "Pub", "192.168.0.1")
    assert not allowed(t, Resource.topic("t"), "Pub", None)  # no source known


def test_the_acl_refuses_disabled_users_and_lets_super_users_through() -> None:
    t = table(entry("Topic:t", "Pub"))
    acl = Acl(AclHolder(t))
    need = Need((Check(Resource.topic("other"), frozenset({Action.PUB})),))
    acl.authorize(0, ROOT, need)
    assert acl.permits("root", need)
    assert not acl.permits("alice", need)
    assert acl.permits(None, need)  # anonymous allowed here
    off = t.update_user("alice", status=UserStatus.DISABLE)
    assert acl.holder is not None and acl.holder.offer(off)
    with pytest.raises(AccessDenied, match="disabled"):
        acl.user_on_behalf(0, "alice")
    assert not acl.permits("alice", Need())


# ---- table changes -------------------------------------------------------------------------


def test_changes_move_the_revision_and_refuse_what_is_wrong() -> None:
    t = AclTable(0, {"root": ROOT})
    t1 = t.create_user(ALICE)
    assert t1.revision == 1 and t1.newer_than(t)
    with pytest.raises(AclInvalid, match="exists already"):
        t1.create_user(User("alice", "another-secret"))
    with pytest.raises(AclInvalid, match="does not exist"):
        t1.create_acl("ghost", [entry("Topic:x", "Pub")])
    t2 = t1.create_acl("alice", [entry("Topic:x", "Pub")])
    with pytest.raises(AclInvalid, match="no ACL entry for Topic:y"):
        t2.update_acl("alice", [entry("Topic:y", "Pub")])
    t3 = t2.update_acl("alice", [entry("Topic:x", "Sub")])
    assert [e.actions for e in t3.entries_of("alice")] == [frozenset({Action.SUB})]
    with pytest.raises(AclInvalid, match="no ACL entry for Topic:z"):
        t3.delete_acl("alice", Resource.parse("Topic:z"))
    t4 = t3.delete_user("alice")
    assert "alice" not in t4.users and "alice" not in t4.acls
    with pytest.raises(AclInvalid, match="changes nothing"):
        t4.update_user("root")
    assert t4.revision == 4


def test_one_allow_and_one_deny_per_resource() -> None:
    t = table(
        entry("Topic:x", "Pub"), entry("Topic:x", "Sub"), entry("Topic:x", "Pub", decision="Deny")
    )
    kept = sorted(
        (e.decision.value, sorted(a.value for a in e.actions)) for e in t.entries_of("alice")
    )
    assert kept == [("Allow", ["Sub"]), ("Deny", ["Pub"])]


def test_stored_form_round_trips_and_a_damaged_copy_is_refused() -> None:
    t = table(entry("Topic:x", "Pub", ips=("10.0.0.0/8",)), entry("Group:g-*", "Sub"))
    again = AclTable.from_dict(t.to_dict())
    assert again == t and again.digest == t.digest
    assert table_from_pb(table_to_pb(t)) == t
    damaged = t.to_dict()
    damaged["users"][0]["password"] = "tampered-secret"
    with pytest.raises(AclInvalid, match="digest"):
        AclTable.from_dict(damaged)
    with pytest.raises(AclInvalid, match="twice"):
        AclTable.from_dict({"users": [ALICE.to_dict(), ALICE.to_dict()]})
    with pytest.raises(AclInvalid, match="does not exist"):
        AclTable.from_dict(
            {"users": [], "acls": {"User:alice": []}, "revision": 1}
            | {"acls": {"alice": [entry("Topic:x", "Pub").to_dict()]}}
        )


def test_a_users_file_means_what_it_said() -> None:
    t = parse_acl(
        {
            "users": [
                {
                    "access_key": "alice",
                    "secret_key": "alice-secret",
                    "default_topic_perm": "PUB|SUB",
                    "topic_perms": ["audit=SUB", "secret=DENY"],
                    "default_group_perm": "SUB",
                    "group_perms": ["private=DENY"],
                }
            ]
        }
    )
    assert t.revision == 0
    assert allowed(t, Resource.topic("any"), "Pub") and allowed(t, Resource.topic("any"), "Sub")
    # a topic's own permission is not widened by the default
    assert allowed(t, Resource.topic("audit"), "Sub") and not allowed(
        t, Resource.topic("audit"), "Pub"
    )
    assert not allowed(t, Resource.topic("secret"), "Sub")
    assert allowed(t, Resource.group("g"), "Sub") and not allowed(
        t, Resource.group("private"), "Sub"
    )


# ---- the replay window ------------------------------------------------------------------------


def test_the_replay_window_refuses_copies_and_forgets_only_stale_sessions() -> None:
    w = ReplayWindow(max_skew_ms=30_000)
    nonces = NumberedNonces()
    sent = [nonces.next() for _ in range(10)]
    now = 1_000_000
    for n in sent[::-1]:  # out of order is fine
        assert w.check("alice", n, now, now) is None
    assert w.check("alice", sent[3], now, now) == "replayed"
    assert w.check("bob", sent[3], now, now) is None  # another key: another session
    for _ in range(WINDOW + 5):
        last = nonces.next()
    assert w.check("alice", last, now, now) is None
    assert w.check("alice", sent[9], now, now) in ("replayed", "replay_window_passed")
    late = NumberedNonces()
    first = late.next()
    assert w.check("carol", first, now, now) is None
    # the session lives until its requests are stale, then it goes
    assert w.check("carol", first, now, now + 20_000) == "replayed"
    w.check("dave", NumberedNonces().next(), now + 40_000, now + 40_000)  # sweeps
    assert len(w) <= 3
    # a legacy nonce (16 random bytes) is remembered as such
    legacy = b"\x07" * 16
    assert w.check("alice", legacy, now, now) is None
    assert w.check("alice", legacy, now, now) == "replayed"


def test_a_tenant_exhausts_only_its_own_sessions() -> None:
    w = ReplayWindow(max_skew_ms=30_000, max_sessions=MAX_SESSIONS_PER_KEY * 3)
    now = 5_000_000
    for _ in range(MAX_SESSIONS_PER_KEY):
        assert w.check("mallory", NumberedNonces().next(), now, now) is None
    assert w.check("mallory", NumberedNonces().next(), now, now) == "replay_cache_full"
    assert w.check("alice", NumberedNonces().next(), now, now) is None


# ---- the holder and the spread -----------------------------------------------------------------


def test_the_holder_takes_only_newer_runtime_tables() -> None:
    base = table()
    seen: list[int] = []
    persisted: list[int] = []
    h = AclHolder(base, persist=lambda t: persisted.append(t.revision))
    h.subscribe(lambda t: seen.append(t.revision))
    other_file = AclTable(0, {"root": ROOT})  # another node's users file
    assert not h.offer(other_file)
    one = base.create_user(User("bob", "bob-secret-1"))
    assert h.offer(one) and not h.offer(one)
    assert not h.offer(base)  # never back
    # two tables of one revision: the same one wins everywhere
    rival = base.create_user(User("carl", "carl-secret-1"))
    assert h.offer(rival) == (rival.key() > one.key())
    assert seen == persisted and seen[0] == 1


def test_the_spread_pulls_newer_and_pushes_to_brokers_behind() -> None:
    started: list[str] = []

    def spawn(coro: Coroutine[Any, Any, None], name: str) -> None:
        started.append(name)
        coro.close()

    clock = FakeClock(0.0)
    h = AclHolder(table())
    # the pool is never called: spawn closes every fetch and push unrun
    spread = AclSpread(h, ConnectionPool(), spawn, lambda: ["b1", "b2"], clock=clock)
    spread.observed("b1", None, "")  # an old broker: nothing
    spread.observed("b1", 0, "x")  # both on their files
    assert started == []
    newer = h.table.create_user(User("bob", "bob-secret-1"))
    spread.observed("b1", newer.revision, newer.digest)
    spread.observed("b1", newer.revision, newer.digest)  # one fetch at a time
    assert started == ["acl-fetch-b1"]
    h.offer(newer)  # fetched: pushed to every broker
    assert started[1:] == ["acl-push-b1", "acl-push-b2"]
    spread.observed("b2", 0, "")  # behind, pushed already just now
    assert len(started) == 3
    clock.now += 5
    spread.observed("b2", 0, "")
    assert started[-1] == "acl-push-b2"
