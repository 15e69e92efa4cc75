"""The cross-field rules of a config class, read from the source of its ``_rules``.

Each ``yield (keys, message)`` becomes one :class:`Rule`: the keys it names (for a key
named by a loop variable, every value of the loop), when it fails (the enclosing
``if`` conditions, ``self.`` left out) and its message (an f-string's fields shown as
``{expr}``).  A rule yielded from a helper's result (``clash = listener_clash(...)``)
takes its keys from the helper's first argument and its message from the first line
of the helper's docstring.  An unreadable ``yield`` stops the reader with an error.
"""

from __future__ import annotations

import ast
import inspect
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Rule", "rules_of"]


@dataclass(frozen=True)
class Rule:
    keys: tuple[str, ...]
    when: str
    message: str


def _strip_self(text: str) -> str:
    return re.sub(r"\bself\.", "", text)


def _message(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        out = []
        for part in node.values:
            if isinstance(part, ast.Constant):
                out.append(str(part.value))
            elif isinstance(part, ast.FormattedValue):
                out.append("{" + _strip_self(ast.unparse(part.value)) + "}")
        return "".join(out)
    return _strip_self(ast.unparse(node))


def _self_attrs(nodes: Sequence[ast.AST]) -> list[str]:
    found: list[str] = []
    for node in nodes:
        for sub in ast.walk(node):
            if (
                isinstance(sub, ast.Attribute)
                and isinstance(sub.value, ast.Name)
                and sub.value.id == "self"
                and sub.attr not in found
            ):
                found.append(sub.attr)
    return found


def _constants(node: ast.AST) -> list[str]:
    return [
        n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)
    ]


def rules_of(cls: type) -> list[Rule]:
    """The cross-field rules ``cls._rules`` yields, read from its source."""
    func = cls.__dict__.get("_rules")
    if func is None:
        return []
    module = sys.modules[func.__module__]
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    rules: list[Rule] = []
    # each enclosing condition: (as the reference shows it, its test node or None)
    Conds = list[tuple[str, ast.AST | None]]
    # for-loop variable -> the string constants it runs over
    for_targets: dict[str, list[str]] = {}

    def record(value: ast.expr, conds: Conds, env: dict[str, ast.expr]) -> None:
        tests = [node for _, node in conds if node is not None]
        if isinstance(value, ast.Tuple) and len(value.elts) == 2:
            keys_node, message_node = value.elts
            keys: list[str] = []
            for elt in keys_node.elts if isinstance(keys_node, ast.Tuple) else [keys_node]:
                if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                    keys.append(elt.value)
                elif isinstance(elt, ast.Name) and elt.id in for_targets:
                    keys.extend(for_targets[elt.id])
                else:
                    keys.extend(k for k in _self_attrs(tests) if k not in keys)
            rules.append(Rule(tuple(dict.fromkeys(keys)), _when(conds), _message(message_node)))
            return
        if isinstance(value, ast.Name) and isinstance(env.get(value.id), ast.Call):
            call = env[value.id]
            assert isinstance(call, ast.Call)
            helper: Callable[..., Any] | None = None
            if isinstance(call.func, ast.Name):
                helper = getattr(module, call.func.id, None)
            doc = (inspect.getdoc(helper) or "") if helper is not None else ""
            keys = _constants(call.args[0]) if call.args else []
            if call.args and isinstance(call.args[0], ast.Dict):
                keys = [
                    k.value
                    for k in call.args[0].keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)
                ]
            kept = [(t, n) for t, n in conds if value.id not in {x.id for x in _names(n)}]
            rules.append(Rule(tuple(keys), _when(kept), doc.splitlines()[0] if doc else ""))
            return
        raise ValueError(f"{cls.__name__}._rules: cannot read the rule {ast.unparse(value)}")

    def walk(stmts: list[ast.stmt], conds: Conds, env: dict[str, ast.expr]) -> None:
        for stmt in stmts:
            if isinstance(stmt, ast.If):
                text = _strip_self(ast.unparse(stmt.test))
                if isinstance(stmt.test, ast.BoolOp) and isinstance(stmt.test.op, ast.Or):
                    text = f"({text})"
                walk(stmt.body, [*conds, (text, stmt.test)], env)
                if stmt.orelse:
                    walk(stmt.orelse, [*conds, (f"not {text}", stmt.test)], env)
            elif isinstance(stmt, ast.For) and isinstance(stmt.target, ast.Name):
                for_targets[stmt.target.id] = _constants(stmt.iter)
                items = ", ".join(f"`{c}`" for c in for_targets[stmt.target.id])
                walk(stmt.body, [*conds, (f"for each of {items}:", None)], env)
            elif isinstance(stmt, ast.Assign):
                if len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                    env[stmt.targets[0].id] = stmt.value
            elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Yield):
                if stmt.value.value is not None:
                    record(stmt.value.value, conds, env)

    walk(fn.body, [], {})
    return rules


def _names(node: ast.AST | None) -> list[ast.Name]:
    if node is None:
        return []
    return [n for n in ast.walk(node) if isinstance(n, ast.Name)]


def _when(conds: Sequence[tuple[str, ast.AST | None]]) -> str:
    """``for each of `a`, `b`: `x and y``` from the enclosing loops and conditions."""
    loops = [text for text, node in conds if node is None]
    tests = [text for text, node in conds if node is not None]
    code = f"`{' and '.join(tests)}`" if tests else "always checked"
    return " ".join([*loops, code])
