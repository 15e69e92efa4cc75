"""SDK scenarios run in a child process (an official SDK in its own interpreter), each printing
one RESULT line the test reads, and how to say where an outcome differs from RocketMQ.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import (
    Callable,
    Mapping,
    Sequence,
)
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass


def unlike_rocketmq(outcomes: Mapping[str, Any], expected: Mapping[str, Any]) -> list[str]:
    """The cases of an SDK scenario answered otherwise than RocketMQ answers them.
    ``outcomes``: case -> ``{"ok", "code", ...}`` as the scenario saw it; ``expected``:
    case -> None (RocketMQ takes it), a v2 code (its proxy refuses it with that code) or
    ``"sdk"`` (the SDK itself refuses it, no code from the server)."""
    wrong = []
    for name, want in expected.items():
        got = outcomes[name]
        if want is None and not got["ok"]:
            wrong.append(f"{name}: refused, RocketMQ takes it: {got}")
        elif want == "sdk" and (got["ok"] or got["code"] is not None):
            wrong.append(f"{name}: the SDK itself should refuse it: {got}")
        elif isinstance(want, int) and (got["ok"] or got["code"] != want):
            wrong.append(f"{name}: want code {want}, got {got}")
    return wrong


def run_scenario(
    argv: Sequence[str], what: str, timeout: float, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Run an SDK scenario in a child (``argv``) and return what it printed as its one
    ``RESULT {json}`` line; a child that printed none fails the test with its output's
    tails.  (The official SDKs keep threads and timers: each scenario runs apart.)"""
    proc = subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=None if env is None else dict(env),
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return dict(json.loads(line[len("RESULT ") :]))
    raise AssertionError(
        f"{what} exited {proc.returncode} without a result:\n"
        + proc.stdout[-3000:]
        + proc.stderr[-3000:]
    )


def scenario_main(scenarios: Mapping[str, Callable[..., Any]]) -> None:
    """The child's side of :func:`run_scenario` for Python scenarios: ``argv`` is the
    scenario's name and its arguments as JSON; prints ``RESULT {json}`` and exits at
    once (the SDK's non-daemon threads must not keep the child alive)."""
    name, args = sys.argv[1], json.loads(sys.argv[2])
    result = scenarios[name](**args)
    print("RESULT " + json.dumps(result), flush=True)
    os._exit(0)
