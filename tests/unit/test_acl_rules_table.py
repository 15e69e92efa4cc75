"""docs/security.md's tables of what each request code and each gRPC method needs
agree with the guard's rules (ha_controller/acl/rules.py), both ways: every code and
method is in both, each row says what the rule says, and what the rule computes for a
sample request is what the row says."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.message import Message

from ha_controller.acl.rules import (
    ANY_USER,
    GRPC_RULES,
    RULES,
    Need,
    grpc_settings_need,
    need_of,
)
from ha_controller.protocol.codes import RequestCode

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
_CODE_ROW = re.compile(r"^\| (\d+) \| `([A-Z_]+)` \| (.*?) \| (.*?) \| (.*?) \|$")
_GRPC_ROW = re.compile(r"^\| `([A-Za-z]+)` \| (.*?) \| (.*?) \| (.*?) \|$")


def doc_rows() -> tuple[dict[int, tuple[str, ...]], dict[str, tuple[str, ...]]]:
    codes: dict[int, tuple[str, ...]] = {}
    methods: dict[str, tuple[str, ...]] = {}
    for line in DOC.read_text().splitlines():
        if m := _CODE_ROW.match(line):
            assert int(m[1]) not in codes, f"code {m[1]} twice in docs/security.md"
            codes[int(m[1])] = (m[2], m[3], m[4], m[5])
        elif m := _GRPC_ROW.match(line):
            methods[m[1]] = (m[2], m[3], m[4])
    return codes, methods


def test_every_code_is_in_the_docs_and_the_rules() -> None:
    codes, _ = doc_rows()
    assert set(codes) == {int(c) for c in RequestCode}, "docs/security.md vs RequestCode"
    assert set(RULES) == {int(c) for c in RequestCode}, "rules vs RequestCode"
    for code, (name, resources, actions, note) in codes.items():
        rule = RULES[code]
        assert name == RequestCode(code).name
        assert (resources, actions, note) == (rule.resources, rule.actions, rule.note), name


def test_every_grpc_method_is_in_the_docs_and_the_rules() -> None:
    from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s

    served = set(v2s.DESCRIPTOR.services_by_name["MessagingService"].methods_by_name)
    _, methods = doc_rows()
    assert set(methods) == served == set(GRPC_RULES)
    for method, row in methods.items():
        rule = GRPC_RULES[method]
        assert row == (rule.resources, rule.actions, rule.note), method


# ---- what the rules compute for sample requests -------------------------------------------


def _fill(msg: Message) -> Message:
    """Topic fields "T", group fields "G" (nested too); one element of repeated
    messages and strings."""
    for field in msg.DESCRIPTOR.fields:
        name = field.name
        repeated = field.is_repeated
        if field.type == field.TYPE_MESSAGE:
            assert field.message_type is not None
            if field.message_type.GetOptions().map_entry:
                continue
            sub = getattr(msg, name).add() if repeated else getattr(msg, name)
            _fill(sub)
            continue
        if field.type != field.TYPE_STRING:
            continue
        value = (
            "T" if "topic" in name else "G" if "group" in name else "n" if name == "name" else ""
        )
        if repeated:
            if value:
                getattr(msg, name).append(value)
        elif value:
            setattr(msg, name, value)
    return msg


def _expected(resources: str, actions: str) -> tuple[set[str], set[str]]:
    kinds = set(re.findall(r"(Topic|Group|Cluster):", resources))
    words = {w for w in re.split(r",\s*|\s+or\s+", actions) if w}
    return kinds, words


def _check(need: Need, resources: str, actions: str, what: str) -> None:
    if actions in ("any user", "served by producers", "any connection", "not offered"):
        assert need == ANY_USER, what
        return
    if actions == "Super":
        assert need.admin and not need.checks, what
        return
    if actions == "cluster":
        assert need.members, what
        return
    kinds, words = _expected(resources, actions.split(";")[0])
    assert {c.resource.type.value for c in need.checks} == kinds, what
    for c in need.checks:
        assert {a.value for a in c.actions} == words, (what, c)


@pytest.mark.parametrize("code", sorted(RULES), ids=lambda c: RequestCode(c).name)
def test_each_rule_computes_what_its_row_says(code: int) -> None:
    rule = RULES[code]
    body = _fill(rule.request()).SerializeToString() if rule.request is not None else b""
    need = need_of(code, body, half_topic=lambda req: "H")
    _check(need, rule.resources, rule.actions, RequestCode(code).name)
    if code == RequestCode.END_TRANSACTION:
        # the half message's topic, not the one the request names ("T")
        assert [c.resource.name for c in need.checks] == ["H"]


def _grpc_request(method: str) -> Any:
    from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s

    desc = v2s.DESCRIPTOR.services_by_name["MessagingService"].methods_by_name[method]
    msg = getattr(v2s, desc.input_type.name)()
    _fill(msg)
    if method == "QueryRoute" or "topic" in [f.name for f in msg.DESCRIPTOR.fields]:
        if hasattr(msg, "topic"):
            msg.topic.name = "T"
    if hasattr(msg, "group"):
        msg.group.name = "G"
    if method == "Heartbeat":
        from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2

        msg.client_type = v2.SIMPLE_CONSUMER
    return msg


@pytest.mark.parametrize("method", sorted(GRPC_RULES))
def test_each_grpc_rule_computes_what_its_row_says(method: str) -> None:
    rule = GRPC_RULES[method]
    if method == "Telemetry":
        from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2

        producer = v2.Settings(publishing=v2.Publishing(topics=[v2.Resource(name="T")]))
        _check(grpc_settings_need(producer), "Topic:", "Pub", method)
        consumer = v2.Settings(
            subscription=v2.Subscription(
                group=v2.Resource(name="G"),
                subscriptions=[v2.SubscriptionEntry(topic=v2.Resource(name="T"))],
            )
        )
        _check(grpc_settings_need(consumer), "Topic:, Group:", "Sub", method)
        return
    need = ANY_USER if rule.need is None else rule.need(_grpc_request(method))
    _check(need, rule.resources, rule.actions, method)
