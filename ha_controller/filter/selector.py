"""What a pull or a pop selects: RocketMQ's two subscription expression types.

``ExpressionType.TAG`` travels as the request's ``tags`` (empty = all) and is checked
against the consume queue's tag hashes without reading a message; ``SQL92`` travels as
the request's ``sql92`` text and is evaluated on each message's properties (``TAGS``
included) once it is read.  A subscription has one type: both at once is refused, as a
RocketMQ subscription cannot carry both.  A lite consumer group's pop also names the lite
topics its consumers subscribe (RocketMQ 5.5's lite topics): a message is selected only
when its ``__LITE_TOPIC`` is one of them, on top of the tag or SQL92 selection.

Shared by the brokers (which evaluate), the gateway and the SDK (which refuse a bad
expression when a consumer subscribes).  Sans-IO.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from ha_controller.filter.sql92 import cached_filter
from ha_controller.protocol.errors import IllegalFilterExpression
from ha_controller.protocol.properties import PROPERTY_LITE_TOPIC
from ha_controller.protocol.record import tag_hash

__all__ = ["ExpressionType", "Selector", "check_subscription"]

PropertyFilter = Callable[[Mapping[str, str]], bool]


class ExpressionType(enum.StrEnum):
    """RocketMQ's ``ExpressionType``."""

    TAG = "TAG"
    SQL92 = "SQL92"


def _wanted_tags(tags: Sequence[str]) -> list[str]:
    return [t for t in tags if t and t != "*"]


def check_subscription(tags: Sequence[str] | None, sql92: str | None) -> None:
    """Refuse a subscription at subscribe time: an SQL92 expression that does not parse
    (``FilterSyntaxError``, an ``IllegalFilterExpression`` naming where) or one given
    together with tags."""
    if sql92 is None:
        return
    if tags is not None and _wanted_tags(tags):
        raise IllegalFilterExpression(
            "a subscription is either by tags or by SQL92, not both (put TAGS in the SQL92)"
        )
    cached_filter(sql92)


@dataclass(frozen=True, slots=True)
class Selector:
    """A request's selection, ready for ``MessageStore.get_messages``."""

    #: tag hashes, None = every tag
    tag_hashes: set[int] | None
    #: the SQL92 filter's ``matches``, None = no property filter
    properties: PropertyFilter | None

    @classmethod
    def of_request(
        cls, tags: Sequence[str], sql92: str, lite_topics: Collection[str] | None = None
    ) -> Selector:
        """From a PULL_MESSAGE or POP_MESSAGE request's ``tags`` and ``sql92``; the
        expression is parsed once per distinct text on this process
        (``IllegalFilterExpression`` when it does not parse).  ``lite_topics`` (a lite
        pop's): only messages of these lite topics; empty selects nothing."""
        wanted = _wanted_tags(tags)
        if not sql92:
            selector = cls({tag_hash(t) for t in wanted} or None, None)
        else:
            check_subscription(wanted, sql92)
            selector = cls(None, cached_filter(sql92).matches)
        if lite_topics is None:
            return selector
        return cls(selector.tag_hashes, _lite_filter(frozenset(lite_topics), selector.properties))


def _lite_filter(names: frozenset[str], then: PropertyFilter | None) -> PropertyFilter:
    """Messages whose lite topic is one of ``names`` (and that ``then`` selects)."""
    if then is None:
        return lambda props: props.get(PROPERTY_LITE_TOPIC) in names
    return lambda props: props.get(PROPERTY_LITE_TOPIC) in names and then(props)
