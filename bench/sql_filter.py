"""What an SQL92 filter costs per message, next to a tag check, in this process.

    .venv/bin/python bench/sql_filter.py [--messages 200000]

Compiles a few expressions of RocketMQ's grammar (ha_controller.filter.sql92) and
evaluates each on messages with 8 user properties, then prints microseconds per
message and the ratio to the baseline measured in the same run: the tag check the
brokers make (a set lookup of the message's tag).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ha_controller.filter.sql92 import compile_filter

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


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--messages", type=int, default=200_000)
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


if __name__ == "__main__":
    main()
