"""What an SQL92 filter costs per message, next to a tag check, in this process.

    .venv/bin/python bench/sql_filter.py [--messages 200000] [--stored 20000]

Two measurements, each with its baseline in the same run:

1. evaluation alone: a few expressions of RocketMQ's grammar
   (ha_controller.filter.sql92) on messages with 8 user properties, against a set
   lookup of the message's tag;
2. what a pull pays on a broker: ``MessageStore.get_messages`` over a real store
   (a temporary directory) of ``--stored`` messages, with an SQL92 filter (each
   message read, decoded and evaluated) against a tag filter (the consume queue's tag
   hashes, messages read only when they match), both selecting the same half.

Prints microseconds per message and the ratio to the baseline.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker_agent.store import MessageStore, StoreConfig
from ha_controller.filter.sql92 import compile_filter
from ha_controller.protocol.record import tag_hash

EXPRESSIONS = {
    "one comparison": "region = 'eu'",
    "range and set": "amount BETWEEN 10 AND 500 AND region IN ('eu', 'us')",
    "six terms": (
        "(amount > 100 OR vip = TRUE) AND region IN ('eu', 'us', 'ap') "
        "AND sku STARTSWITH 'A' AND coupon IS NULL AND NOT (channel = 'test')"
    ),
}


def messages(n: int) -> list[dict[str, str]]:
    rnd = random.Random(7)
    out = []
    for i in range(n):
        props = {
            "region": rnd.choice(["eu", "us", "ap", "sa"]),
            "amount": str(rnd.randint(1, 1000)),
            "vip": rnd.choice(["true", "false"]),
            "sku": rnd.choice(["A100", "B200", "A300"]),
            "channel": rnd.choice(["web", "app", "test"]),
            "k6": "v",
            "k7": "v",
            "TAGS": rnd.choice(["TagA", "TagB"]),
        }
        if i % 3 == 0:
            props["coupon"] = "x"
        out.append(props)
    return out


Selection = tuple[set[int] | None, Callable[[Mapping[str, str]], bool] | None]


def _scan(store: MessageStore, n: int, selection: Selection) -> tuple[float, int]:
    """Seconds to read queue 0 from 0 to ``n`` as pulls do (32 at a time), and the
    messages selected."""
    tags, props = selection
    offset = selected = 0
    t0 = time.perf_counter()
    while offset < n:
        got = store.get_messages("T", 0, offset, 32, tag_filter=tags, message_filter=props)
        selected += len(got.messages)
        offset = got.next_begin_offset
    return time.perf_counter() - t0, selected


def store_pulls(n: int) -> None:
    """The broker's read path: tag hashes (unread when not wanted) vs SQL92 (read)."""
    msgs = messages(n)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = StoreConfig(segment_size_bytes=64 * 1024 * 1024)
        with MessageStore.open(Path(tmp) / "store", cfg) as store:
            for props in msgs:
                store.put("T", 0, b"x" * 200, props)
            runs: dict[str, Selection] = {
                "tag TagA (baseline)": ({tag_hash("TagA")}, None),
                "SQL92 TAGS = 'TagA'": (None, compile_filter("TAGS = 'TagA'").matches),
                "SQL92 six terms": (None, compile_filter(EXPRESSIONS["six terms"]).matches),
                "no filter (every message read)": (None, None),
            }
            print(f"{n} stored messages (200-byte body, 8 properties), get_messages, 32 a pull:")
            base = 0.0
            for name, selection in runs.items():
                _scan(store, n, selection)  # warm the page cache
                secs, selected = _scan(store, n, selection)
                us = secs / n * 1e6
                base = base or us
                print(
                    f"  {name:<40} {us:6.3f} us/message {us / base:5.1f}x   ({selected} selected)"
                )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--stored", type=int, default=20_000)
    args = p.parse_args()
    msgs = messages(args.messages)
    tags = {"TagA"}
    t0 = time.perf_counter()
    hits = sum(1 for m in msgs if m["TAGS"] in tags)
    base = (time.perf_counter() - t0) / len(msgs) * 1e6
    print(f"{len(msgs)} messages, 8 properties each, this process:")
    print(f"  {'tag check (baseline)':<22} {base:6.3f} us/message  1.0x   ({hits} selected)")
    for name, expr in EXPRESSIONS.items():
        f = compile_filter(expr)
        t0 = time.perf_counter()
        hits = sum(1 for m in msgs if f.matches(m))
        us = (time.perf_counter() - t0) / len(msgs) * 1e6
        print(f"  {name:<22} {us:6.3f} us/message {us / base:5.1f}x   ({hits} selected)")
    t0 = time.perf_counter()
    for expr in EXPRESSIONS.values():
        for _ in range(200):
            compile_filter(expr)
    compile_us = (time.perf_counter() - t0) / 600 * 1e6
    print(f"  compiling one expression (once per subscription): {compile_us:.0f} us")
    store_pulls(args.stored)


if __name__ == "__main__":
    main()
