"""What a pull or a pop selects: RocketMQ's two subscription expression types.

``ExpressionType.TAG`` travels as the request's ``tags`` (empty = all) and is checked
against the consume queue's tag hashes without reading a message; ``SQL92`` travels as
the request's ``sql92`` text and is evaluated on each message's properties (``TAGS``
included) once it is read.  A subscription has one type: both at once is refused, as a
RocketMQ subscription cannot carry both.

Shared by the brokers (which evaluate), the gateway and the SDK (which refuse a bad
expression when a consumer subscribes).  Sans-IO.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ha_controller.filter.sql92 import cached_filter
from ha_controller.protocol.errors import IllegalFilterExpression
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
    def of_request(cls, tags: Sequence[str], sql92: str) -> Selector:
        """From a PULL_MESSAGE or POP_MESSAGE request's ``tags`` and ``sql92``; the
        expression is parsed once per distinct text on this process
        (``IllegalFilterExpression`` when it does not parse)."""
        wanted = _wanted_tags(tags)
        if not sql92:
            return cls({tag_hash(t) for t in wanted} or None, None)
        check_subscription(wanted, sql92)
        return cls(None, cached_filter(sql92).matches)
