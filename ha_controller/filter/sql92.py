"""RocketMQ's SQL92 message filter: parse once, evaluate per message.

The grammar is RocketMQ's (its JMS-selector-derived ``SelectorParser``):

- literals: strings in single quotes (``''`` is a quote), integers (``10``, ``10L``),
  decimals (``1.5``, ``.5``, ``5E3``), ``TRUE``, ``FALSE``, ``NULL``;
- properties: names of ``[a-zA-Z_$][a-zA-Z0-9_$]*`` — a message's user properties,
  and ``TAGS``;
- ``=``, ``<>``, ``>``, ``>=``, ``<``, ``<=``; ``[NOT] BETWEEN a AND b``;
  ``[NOT] IN ('a', 'b')``; ``IS [NOT] NULL``; ``[NOT] CONTAINS 's'``,
  ``[NOT] STARTSWITH 's'``, ``[NOT] ENDSWITH 's'``; ``AND``, ``OR``, ``NOT``,
  unary ``+``/``-``, parentheses; keywords in any case; ``--`` and ``/* */`` comments.

Evaluation follows RocketMQ's: a property is a string; compared with a number it is
read as one, with a boolean as ``true``/``false``; a missing property is NULL, and a
comparison with NULL is NULL (unknown), so only a TRUE result selects a message.  A
comparison that cannot be made (``'abc' > 5``) selects nothing rather than failing the
pull.  A malformed expression is refused when it is parsed (:class:`FilterSyntaxError`,
an ``IllegalFilterExpression`` naming where), that is when a consumer subscribes.

Sans-IO: :func:`compile_filter` returns a :class:`Filter` whose ``matches(properties)``
takes the message's properties (``TAGS`` included); :func:`cached_filter` is the same,
parsed once per distinct expression (a broker's pulls and pops repeat theirs).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from ha_controller.protocol.errors import FilterSyntaxError

__all__ = [
    "MAX_CACHED_FILTERS",
    "MAX_EXPRESSION_LEN",
    "Filter",
    "FilterSyntaxError",
    "cached_filter",
    "compile_filter",
]

#: an expression longer than this is refused (RocketMQ's gRPC validator has no such
#: bound; a broker compiles each distinct one, so it is bounded here)
MAX_EXPRESSION_LEN: Final = 4096
#: compiled expressions :func:`cached_filter` keeps (least recently used dropped)
MAX_CACHED_FILTERS: Final = 1024


_KEYWORDS: Final = frozenset(
    {"NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS"}
    | {"CONTAINS", "STARTSWITH", "ENDSWITH"}
)
_TOKEN_RE: Final = re.compile(
    r"""
    (?P<ws>\s+|--[^\n\r]*(?:\r\n|\n|\r|$)|/\*.*?\*/)
  | (?P<float>(?:\d+\.\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?|\d+[eE][+-]?\d+))
  | (?P<int>(?:0|[1-9]\d*)[lL]?)
  | (?P<str>'(?:''|[^'])*')
  | (?P<id>[A-Za-z_$][A-Za-z0-9_$]*)
  | (?P<op><>|>=|<=|=|>|<|\(|\)|,|\+|-)
    """,
    re.VERBOSE | re.DOTALL,
)


@dataclass(frozen=True, slots=True)
class _Tok:
    kind: str  # "num", "str", "id", "kw", "op", "end"
    value: Any
    pos: int


def _tokens(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        if m is None:
            raise FilterSyntaxError(
                f"SQL92 filter: unexpected {text[pos : pos + 10]!r} at character {pos + 1}"
            )
        kind = m.lastgroup
        raw = m.group()
        if kind == "float":
            out.append(_Tok("num", float(raw), pos))
        elif kind == "int":
            out.append(_Tok("num", int(raw.rstrip("lL")), pos))
        elif kind == "str":
            out.append(_Tok("str", raw[1:-1].replace("''", "'"), pos))
        elif kind == "id":
            upper = raw.upper()
            out.append(_Tok("kw", upper, pos) if upper in _KEYWORDS else _Tok("id", raw, pos))
        elif kind == "op":
            out.append(_Tok("op", raw, pos))
        pos = m.end()
    out.append(_Tok("end", None, len(text)))
    return out


# ---- the expression tree: each node a callable of the properties -----------------------

Props = Mapping[str, str]
Node = Callable[[Props], Any]
#: a node's static kind, for RocketMQ's parse-time checks: "const-num", "const-str",
#: "const-bool", "null", "bool" (a condition), "value" (a property or arithmetic)
Kind = str


class _Unknown(Exception):
    """A comparison that cannot be made (RocketMQ throws and the message is skipped)."""


def _number(v: Any) -> float | int:
    if isinstance(v, bool):
        raise _Unknown
    if isinstance(v, int | float):
        return v
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            pass
        try:
            return float(v)
        except ValueError:
            raise _Unknown from None
    raise _Unknown


def _equal(lv: Any, rv: Any) -> bool | None:
    if lv is None or rv is None:
        return None if lv is None else False
    if type(lv) is type(rv):
        return bool(lv == rv)
    if isinstance(lv, bool) or isinstance(rv, bool):
        b, other = (lv, rv) if isinstance(lv, bool) else (rv, lv)
        return isinstance(other, str) and other.strip().lower() == ("true" if b else "false")
    if isinstance(lv, str) or isinstance(rv, str):
        try:
            return _number(lv) == _number(rv)
        except _Unknown:
            return False
    return bool(lv == rv)


def _order(lv: Any, rv: Any) -> int | None:
    if lv is None or rv is None:
        return None
    a, b = _number(lv), _number(rv)
    return (a > b) - (a < b)


def _truth(v: Any) -> bool | None:
    if v is None or isinstance(v, bool):
        return v
    raise _Unknown  # a value where a condition is wanted


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.i = 0

    # ---- token helpers ----------------------------------------------------------------

    def peek(self, k: int = 0) -> _Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def take(self) -> _Tok:
        t = self.toks[self.i]
        self.i += 1
        return t

    def at(self, kind: str, value: Any = None, k: int = 0) -> bool:
        t = self.peek(k)
        return t.kind == kind and (value is None or t.value == value)

    def expect(self, kind: str, value: Any = None) -> _Tok:
        if not self.at(kind, value):
            self.fail(f"expected {value or kind}")
        return self.take()

    def fail(self, what: str) -> None:
        t = self.peek()
        near = "the end" if t.kind == "end" else repr(self.text[t.pos : t.pos + 12])
        raise FilterSyntaxError(f"SQL92 filter: {what} at character {t.pos + 1} (near {near})")

    # ---- the grammar ----------------------------------------------------------------

    def parse(self) -> Node:
        node, kind = self.or_expr()
        if not self.at("end"):
            self.fail("unexpected text")
        if kind not in ("bool", "const-bool", "value"):
            raise FilterSyntaxError("SQL92 filter: the expression is not a condition")
        return node

    def or_expr(self) -> tuple[Node, Kind]:
        left, kind = self.and_expr()
        while self.at("kw", "OR"):
            self.take()
            right, _ = self.and_expr()

            def node(p: Props, a: Node = left, b: Node = right) -> bool | None:
                x = _safe_truth(a, p)
                if x is True:
                    return True
                y = _safe_truth(b, p)
                if y is True:
                    return True
                return None if x is None or y is None else False

            left, kind = node, "bool"
        return left, kind

    def and_expr(self) -> tuple[Node, Kind]:
        left, kind = self.equality()
        while self.at("kw", "AND"):
            self.take()
            right, _ = self.equality()

            def node(p: Props, a: Node = left, b: Node = right) -> bool | None:
                x = _safe_truth(a, p)
                if x is False:
                    return False
                y = _safe_truth(b, p)
                if y is False:
                    return False
                return None if x is None or y is None else True

            left, kind = node, "bool"
        return left, kind

    def equality(self) -> tuple[Node, Kind]:
        left, lkind = self.comparison()
        while True:
            if self.at("op", "=") or self.at("op", "<>"):
                negate = self.take().value == "<>"
                right, rkind = self.comparison()
                if "null" in (lkind, rkind):
                    self.fail("NULL cannot be compared (use IS NULL)")

                def eq(p: Props, a: Node = left, b: Node = right, n: bool = negate) -> Any:
                    r = _equal(a(p), b(p))
                    return r if r is None or not n else not r

                left, lkind = eq, "bool"
            elif self.at("kw", "IS"):
                self.take()
                negate = self.at("kw", "NOT")
                if negate:
                    self.take()
                self.expect("kw", "NULL")

                def isnull(p: Props, a: Node = left, n: bool = negate) -> bool:
                    return (a(p) is None) != n

                left, lkind = isnull, "bool"
            else:
                return left, lkind

    def comparison(self) -> tuple[Node, Kind]:
        left, lkind = self.unary()
        while True:
            negate = False
            if (
                self.at("kw", "NOT")
                and self.peek(1).kind == "kw"
                and self.peek(1).value
                in (
                    "BETWEEN",
                    "IN",
                    "CONTAINS",
                    "STARTSWITH",
                    "ENDSWITH",
                )
            ):
                self.take()
                negate = True
            t = self.peek()
            if t.kind == "op" and t.value in (">", ">=", "<", "<=") and not negate:
                op = self.take().value
                right, rkind = self.unary()
                for kind in (lkind, rkind):
                    if kind in ("const-str", "const-bool", "null", "bool"):
                        self.fail(f"a {kind.split('-')[-1]} cannot be compared with {op}")
                test = {
                    ">": lambda c: c > 0,
                    ">=": lambda c: c >= 0,
                    "<": lambda c: c < 0,
                    "<=": lambda c: c <= 0,
                }[op]

                def cmp(p: Props, a: Node = left, b: Node = right, f: Any = test) -> Any:
                    c = _order(a(p), b(p))
                    return None if c is None else f(c)

                left, lkind = cmp, "bool"
            elif t.kind == "kw" and t.value == "BETWEEN":
                self.take()
                low, _ = self.unary()
                self.expect("kw", "AND")
                high, _ = self.unary()

                def between(
                    p: Props, a: Node = left, lo: Node = low, hi: Node = high, n: bool = negate
                ) -> Any:
                    v = a(p)
                    c1, c2 = _order(v, lo(p)), _order(v, hi(p))
                    if c1 is None or c2 is None:
                        return None
                    r = c1 >= 0 and c2 <= 0
                    return r != n

                left, lkind = between, "bool"
            elif t.kind == "kw" and t.value == "IN":
                self.take()
                self.expect("op", "(")
                values = [self.expect("str").value]
                while self.at("op", ","):
                    self.take()
                    values.append(self.expect("str").value)
                self.expect("op", ")")
                allowed = frozenset(values)

                def isin(
                    p: Props, a: Node = left, s: frozenset[str] = allowed, n: bool = negate
                ) -> Any:
                    v = a(p)
                    if v is None:
                        return None
                    return (str(v) in s) != n

                left, lkind = isin, "bool"
            elif t.kind == "kw" and t.value in ("CONTAINS", "STARTSWITH", "ENDSWITH"):
                how = self.take().value
                needle = self.expect("str").value
                test2: Callable[[str, str], bool] = {
                    "CONTAINS": lambda v, s: s in v,
                    "STARTSWITH": lambda v, s: v.startswith(s),
                    "ENDSWITH": lambda v, s: v.endswith(s),
                }[how]

                def text(
                    p: Props, a: Node = left, s: str = needle, f: Any = test2, n: bool = negate
                ) -> Any:
                    v = a(p)
                    if v is None:
                        return None
                    if not isinstance(v, str):
                        raise _Unknown
                    return f(v, s) != n

                left, lkind = text, "bool"
            elif negate:
                self.fail("NOT must be followed by BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH")
            else:
                return left, lkind

    def unary(self) -> tuple[Node, Kind]:
        if self.at("op", "+"):
            self.take()
            return self.unary()
        if self.at("op", "-"):
            self.take()
            inner, kind = self.unary()
            if kind == "const-num":
                v = -inner({})
                return (lambda p, v=v: v), "const-num"

            def neg(p: Props, a: Node = inner) -> Any:
                v = a(p)
                return None if v is None else -_number(v)

            return neg, "value"
        if self.at("kw", "NOT"):
            self.take()
            inner, _ = self.unary()

            def not_(p: Props, a: Node = inner) -> Any:
                v = _safe_truth(a, p)
                return None if v is None else not v

            return not_, "bool"
        return self.primary()

    def primary(self) -> tuple[Node, Kind]:
        t = self.peek()
        if t.kind == "op" and t.value == "(":
            self.take()
            node, kind = self.or_expr()
            self.expect("op", ")")
            return node, kind
        if t.kind == "num":
            self.take()
            return (lambda p, v=t.value: v), "const-num"
        if t.kind == "str":
            self.take()
            return (lambda p, v=t.value: v), "const-str"
        if t.kind == "kw" and t.value in ("TRUE", "FALSE"):
            self.take()
            return (lambda p, v=(t.value == "TRUE"): v), "const-bool"
        if t.kind == "kw" and t.value == "NULL":
            self.take()
            return (lambda p: None), "null"
        if t.kind == "id":
            self.take()
            return (lambda p, k=t.value: p.get(k)), "value"
        self.fail("expected a value, a property or '('")
        raise AssertionError  # (fail raises)


def _safe_truth(node: Node, props: Props) -> bool | None:
    try:
        return _truth(node(props))
    except _Unknown:
        return None


@dataclass(frozen=True)
class Filter:
    """A compiled SQL92 expression."""

    expression: str
    _node: Node

    def matches(self, properties: Props) -> bool:
        """True only when the expression is TRUE for these properties."""
        try:
            return _truth(self._node(properties)) is True
        except (_Unknown, ArithmeticError, ValueError, TypeError):
            return False


def compile_filter(expression: str) -> Filter:
    """Parse ``expression`` (``FilterSyntaxError`` naming the place when it does not)."""
    text = expression.strip()
    if not text:
        raise FilterSyntaxError("SQL92 filter: the expression is empty")
    if len(text) > MAX_EXPRESSION_LEN:
        raise FilterSyntaxError(
            f"SQL92 filter: at most {MAX_EXPRESSION_LEN} characters, this one {len(text)}"
        )
    return Filter(text, _Parser(text).parse())


@lru_cache(maxsize=MAX_CACHED_FILTERS)
def cached_filter(expression: str) -> Filter:
    """:func:`compile_filter`, parsed once per distinct expression (a refusal is not
    kept: a bad expression is parsed again, and refused again, each time)."""
    return compile_filter(expression)
