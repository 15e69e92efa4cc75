"""`hactl demo` is what a new user runs first: it must pass, quickly, through the CLI,
and show the acting slave taking over each kind of special work."""

from __future__ import annotations

import re
import subprocess
import time

from ha_controller.testing import hactl_argv


def verdict_line(out: str, name: str) -> str:
    """The verdict line of one invariant (without its timestamp)."""
    assert "] verdict:\n" in out, out
    verdict = out.split("] verdict:\n", 1)[1]
    found = re.findall(rf"^\[[\d:]+\]     {re.escape(name)}: +(.*)$", verdict, re.MULTILINE)
    assert len(found) == 1, f"no single verdict line for {name!r} in:\n{out}"
    line: str = found[0]
    assert line.endswith("  ok"), f"{name}: {line}"
    return line


def test_hactl_demo_exits_0_within_a_minute() -> None:
    t0 = time.monotonic()
    proc = subprocess.run(hactl_argv("demo"), capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - t0
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-3000:]
    assert "nameserver shows slave 1 as id 0, read-only" in out

    # normal messages: none lost, none twice
    assert verdict_line(out, "normal") == "lost 0  duplicated 0  ok"

    # delayed: broker-a's went through the escape bridge to broker-b, on time, once
    delayed = verdict_line(out, "delayed")
    m = re.match(r"(\d+)/(\d+) delivered, 0 twice, broker-a's escaped to broker-b: yes", delayed)
    assert m and m[1] == m[2] and int(m[1]) >= 4, delayed
    assert re.search(
        r"delayed: 4/4 of broker-a delivered by the acting slave through broker-b", out
    )

    # transactions: the open halves escaped and were resolved by the checker after the kill
    tx = verdict_line(out, "transactions")
    assert re.match(r"committed 1 delivered 1x \(expected 1\), rolled back \d+ delivered 0, ", tx)
    assert "escaped to broker-b: yes, resolved by the checker: yes" in tx
    assert re.search(r"the checker was asked by broker-b: tx-\d+ commit, tx-\d+ rollback", out)

    # POP: all received once; the un-acked one came back once from the retry topic
    pop = verdict_line(out, "POP")
    m = re.match(r"received (\d+)/(\d+) \(0 more than once\)", pop)
    assert m and m[1] == m[2] == "16", pop
    assert "un-acked one redelivered 1x (expected 1), acked ones redelivered 0" in pop
    assert "CK/ACK escaped to broker-b: yes" in pop
    assert "came back from %RETRY%demo-pop" in out

    # locks (strict mode): A keeps them through the acting slave, B is refused
    assert verdict_line(out, "locks") == (
        "A granted, B refused at the master: yes; at the acting slave: yes  ok"
    )
    assert "client A renews at the acting slave (2 of 3 members vote): granted 4/4; " in out

    # pre-online: the master came back with nothing rolled back
    pre = verdict_line(out, "pre-online")
    m = re.match(r"consumer offsets >= acting slave's on (\d+)/(\d+) queues; delay offset", pre)
    assert m and m[1] == m[2] and int(m[1]) > 0, pre
    assert re.search(r"delay offset (\d+) >= (\d+): yes", pre)
    assert re.search(r"pre-online steps \(/api/v1/status\): .*online$", out, re.MULTILINE)

    assert "OK: every invariant held (6 checked)" in out
    assert "FAILED" not in out
    assert elapsed < 60, f"demo took {elapsed:.1f} s"
