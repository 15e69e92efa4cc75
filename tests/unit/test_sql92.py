"""RocketMQ's SQL92 filter without a broker: its grammar, RocketMQ's evaluation
(properties are strings; NULL is unknown; only TRUE selects) and the refusals of bad
expressions."""

from __future__ import annotations

import pytest

from ha_controller.filter.selector import Selector, check_subscription
from ha_controller.filter.sql92 import FilterSyntaxError, cached_filter, compile_filter
from ha_controller.protocol.errors import IllegalFilterExpression
from ha_controller.protocol.record import tag_hash

MSG = {"a": "3", "b": "abc", "price": "12.5", "flag": "true", "TAGS": "TagA", "neg": "-4"}


@pytest.mark.parametrize(
    ("expr", "selected"),
    [
        ("a = 3", True),
        ("a = '3'", True),
        ("a <> 3", False),
        ("a > 2 AND a < 4", True),
        ("a >= 3 AND a <= 3", True),
        ("price > 12", True),
        ("price BETWEEN 12 AND 13", True),
        ("price NOT BETWEEN 12 AND 13", False),
        ("a BETWEEN 4 AND 5", False),
        ("b IN ('x', 'abc')", True),
        ("b NOT IN ('x', 'abc')", False),
        ("TAGS IN ('TagA', 'TagB')", True),
        ("missing IS NULL", True),
        ("b IS NOT NULL", True),
        ("missing = 'x'", False),  # NULL: unknown, not selected
        ("NOT (missing = 'x')", False),  # still unknown
        ("missing = 'x' OR a = 3", True),
        ("missing = 'x' AND a = 3", False),
        ("flag = TRUE", True),
        ("flag = FALSE", False),
        ("b CONTAINS 'bc'", True),
        ("b NOT CONTAINS 'bc'", False),
        ("b STARTSWITH 'ab'", True),
        ("b ENDSWITH 'bc'", True),
        ("b NOT ENDSWITH 'zz'", True),
        ("neg < -3", True),
        ("-a = -3", True),
        ("a = 3 -- the rest is a comment", True),
        ("/* note */ a = 3", True),
        ("b = 'it''s'", False),
        ("(a = 1 OR a = 3) AND NOT (b = 'x')", True),
        ("b > 1", False),
        ("a = 3.0", True),
        ("a IN ('3')", True),
        ("aNd_1 IS NULL", True),  # names are not keywords
    ],
)
def test_evaluation(expr: str, selected: bool) -> None:
    assert compile_filter(expr).matches(MSG) is selected, expr


def test_keywords_in_any_case_and_literals() -> None:
    assert compile_filter("a between 1 and 5 and b in ('abc')").matches(MSG)
    assert compile_filter("a = 3L").matches(MSG)
    assert compile_filter("price > .5E1").matches(MSG)
    assert compile_filter("b = 'it''s'").matches({"b": "it's"})


@pytest.mark.parametrize(
    ("expr", "words"),
    [
        ("", "empty"),
        ("a =", "expected a value"),
        ("a = 'x", "unexpected"),
        ("a == 1", "expected a value"),
        ("(a = 1", r"expected \)"),
        ("a = 1)", "unexpected text"),
        ("a IN (1, 2)", "expected str"),
        ("a > 'x'", "cannot be compared"),
        ("a = NULL", "IS NULL"),
        ("a NOT = 1", "unexpected"),
        ("a > 'z'", "cannot be compared"),
        ("a BETWEEN 1", "expected AND"),
        ("'x'", "not a condition"),
        ("a # 1", "unexpected"),
        ("a = 1" + " OR a = 1" * 500, "at most"),
    ],
)
def test_bad_expressions_are_refused_at_subscribe(expr: str, words: str) -> None:
    with pytest.raises(FilterSyntaxError, match=words):
        compile_filter(expr)


@pytest.mark.parametrize(
    "expr",
    [
        "missing > 1",
        "missing < 1",
        "missing <> 'x'",
        "missing BETWEEN 1 AND 2",
        "missing NOT BETWEEN 1 AND 2",
        "missing IN ('x')",
        "missing NOT IN ('x')",
        "missing CONTAINS 'x'",
        "missing NOT STARTSWITH 'x'",
        "missing IS NOT NULL",
        "NOT (missing > 1)",
        "TAGS = 'TagB'",
    ],
)
def test_a_missing_property_is_null_and_never_selects(expr: str) -> None:
    """RocketMQ's semantics: a comparison with NULL is unknown, NOT unknown is unknown,
    and only TRUE selects a message."""
    assert compile_filter(expr).matches(MSG) is False, expr


def test_null_logic_with_and_or() -> None:
    assert compile_filter("missing IS NULL AND a = 3").matches(MSG)
    assert compile_filter("missing > 1 OR TAGS = 'TagA'").matches(MSG)
    assert not compile_filter("missing > 1 OR TAGS = 'TagB'").matches(MSG)
    # an untagged message has no TAGS: NULL too
    assert compile_filter("TAGS IS NULL").matches({"a": "1"})
    assert not compile_filter("TAGS <> 'x'").matches({"a": "1"})


def test_selector_of_a_request() -> None:
    tags = Selector.of_request(["A", "*", ""], "")
    assert tags.tag_hashes == {tag_hash("A")} and tags.properties is None
    assert Selector.of_request(["*"], "") == Selector(None, None)
    sql = Selector.of_request([], "TAGS = 'A' AND n > 1")
    assert sql.tag_hashes is None and sql.properties is not None
    assert sql.properties({"TAGS": "A", "n": "2"}) and not sql.properties({"TAGS": "A"})
    with pytest.raises(FilterSyntaxError, match="character 7"):
        Selector.of_request([], "TAGS =")
    with pytest.raises(IllegalFilterExpression, match="not both"):
        Selector.of_request(["A"], "n > 1")


def test_check_subscription_and_the_cache() -> None:
    check_subscription(["A"], None)
    check_subscription(["*"], "n > 1")  # "*" is no tag filter
    with pytest.raises(FilterSyntaxError):
        check_subscription(None, "n >")
    with pytest.raises(FilterSyntaxError):
        check_subscription(None, "   ")
    assert cached_filter("n > 1") is cached_filter("n > 1")
    assert isinstance(FilterSyntaxError("x"), ValueError)  # a caller's ValueError too
