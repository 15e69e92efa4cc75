"""What the key index costs per appended message, against the same append without it.

    .venv/bin/python bench/key_index.py [--messages 20000] [--batch 1] [--rounds 3]

In this process, over real stores in a temporary directory (async flush, as brokers
run): ``MessageStore.put_batch`` of ``--messages`` messages of 128 bytes, each with two
keys (``KEYS``) and a unique key (``UNIQ_KEY``), like an SDK's send, into a store with
the key index on (``key_index_max_entries`` 1,000,000) and one with it off (0).  The
two alternate ``--rounds`` times (the best round of each is kept, so another process's
burst does not count; the time is CPU time, ``time.process_time``, for the same reason);
then a slave's path: ``append_replicated`` of the same bytes and
``reput``, index on and off.  Also: the memory the index holds per entry (tracemalloc)
and a lookup's time.  Prints microseconds per message and the ratio.

    .venv/bin/python bench/key_index.py --produce [--messages 20000] [--rounds 2]

    .venv/bin/python bench/key_index.py --cpu [--messages 200000] [--batch 16]

``--cpu``: the index alone, in CPU time (``time.process_time``, so another process's
load does not count): ``KeyIndex.add_many`` of ``--messages`` records with two keys and
a unique key each, ``--batch`` at a time (a put batch, a reput), ``commit_some`` after
each batch, as the store calls them; best of 5; prints microseconds per record.

``--produce`` measures what a client sees instead: one real group (nameserver, master,
SYNC slave) with the index at its default and one with it off
(``HAC_KEY_INDEX_MAX_ENTRIES=0``), 1 KiB sends with two keys each and 64 in flight,
alternating (``bench/produce_ab.py``); it prints msg/s of both and on/off, and the CPU
time the master and the slave spent per message in each (their least over the rounds).  ``make
bench`` prints the same row (:func:`produce_row`).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from broker_agent.store import MessageStore, StoreConfig
from broker_agent.store.keyindex import KeyIndex, key_hash
from broker_agent.store.types import PutRequest

HOST = "127.0.0.1:10911"


def requests(n: int) -> list[PutRequest]:
    return [
        PutRequest(
            "BenchTopic",
            i % 8,
            b"x" * 128,
            {"KEYS": f"order-{i} customer-{i % 997}", "UNIQ_KEY": f"7F00000100002A9F0000{i:012X}"},
            0,
            None,
            "",
            HOST,
        )
        for i in range(n)
    ]


def config(index: bool) -> StoreConfig:
    return StoreConfig(key_index_max_entries=1_000_000 if index else 0)


def put_run(reqs: list[PutRequest], batch: int, index: bool) -> tuple[float, bytes]:
    with tempfile.TemporaryDirectory() as d, MessageStore.open(Path(d), config(index)) as store:
        t0 = time.process_time()
        for i in range(0, len(reqs), batch):
            store.put_batch(reqs[i : i + batch])
        elapsed = time.process_time() - t0
        return elapsed, store.read_commitlog(0, 1 << 30)


def reput_run(data: bytes, index: bool) -> float:
    with tempfile.TemporaryDirectory() as d, MessageStore.open(Path(d), config(index)) as store:
        chunk = 256 * 1024
        t0 = time.process_time()
        pos = 0
        while pos < len(data):
            # whole records only: cut where the master's HA transfer would
            part = store_slice(data, pos, chunk)
            store.append_replicated(pos, part)
            pos += len(part)
            store.reput()
        return time.process_time() - t0


def store_slice(data: bytes, pos: int, max_bytes: int) -> bytes:
    end = pos
    while end < len(data):
        size = int.from_bytes(data[end : end + 4], "big")
        if end + size - pos > max_bytes and end > pos:
            break
        end += size
    return data[pos:end]


def memory_per_entry(n: int) -> float:
    with tempfile.TemporaryDirectory() as d:
        ki = KeyIndex(Path(d) / "i", 64 << 20, n * 3)
        ki.load(0, 0)
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(n):
            ki.add("T", f"order-{i} customer-{i % 997}", f"U{i:020d}", i * 300, 300)
            if i % 64 == 0:
                ki.commit()
        ki.commit()
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        t0 = time.perf_counter()
        for i in range(10_000):
            ki.lookup(key_hash("T", f"order-{i}"))
        lookup_us = (time.perf_counter() - t0) / 10_000 * 1e6
        ki.close()
        print(f"index lookup (hash + scan of {ki.entries:,} entries): {lookup_us:.1f} us")
        return (after - before) / ki.entries


def cpu_per_record(n: int, batch: int) -> float:
    """CPU microseconds :meth:`KeyIndex.add_many` + ``commit_some`` take per record."""
    records = [
        (
            "BenchTopic",
            f"order-{i} customer-{i % 997}",
            f"7F00000100002A9F0000{i:012X}",
            i * 1300,
            1300,
        )
        for i in range(n)
    ]
    batches = [records[i : i + batch] for i in range(0, n, batch)]
    best = float("inf")
    for _ in range(5):
        with tempfile.TemporaryDirectory() as d:
            ki = KeyIndex(Path(d) / "i", 1 << 30, 3 * n)
            ki.load(0, 0)
            t0 = time.process_time()
            for b in batches:
                ki.add_many(b)
                ki.commit_some()
            ki.commit()
            best = min(best, time.process_time() - t0)
            ki.close()
    return best / n * 1e6


def message_keys(i: int) -> tuple[str, str]:
    return (f"order-{i}", f"customer-{i % 997}")


async def produce_row(count: int = 20_000, rounds: int = 2) -> dict[str, float]:
    """msg/s of produce into a group with the key index off and on, and on/off."""
    import produce_ab

    modes = {
        "off": produce_ab.Mode(env={"HAC_KEY_INDEX_MAX_ENTRIES": "0"}),
        "on": produce_ab.Mode(),  # the default bound
    }
    cpu: dict[str, float] = {}
    best = await produce_ab.compare(
        modes, "BenchKeyIndex", count, rounds, keys=message_keys, cpu=cpu
    )
    return {
        "index_off_msgs_s": best["off"],
        "index_on_msgs_s": best["on"],
        "ratio": best["on"] / best["off"],
        "index_off_broker_cpu_us": cpu["off"],
        "index_on_broker_cpu_us": cpu["on"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--messages", type=int, default=20000)
    ap.add_argument("--batch", type=int, default=1, help="messages per put_batch")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--produce", action="store_true", help="produce into real groups, index on and off"
    )
    ap.add_argument("--cpu", action="store_true", help="the index's CPU time per record")
    args = ap.parse_args()
    if args.cpu:
        n = args.messages if args.messages != 20000 else 200_000
        us = cpu_per_record(n, args.batch)
        print(f"key index, {n:,} records of 3 keys, batch {args.batch}: {us:.2f} us CPU/record")
        return
    if args.produce:
        row = asyncio.run(produce_row(args.messages, args.rounds))
        print(
            f"produce 1 KiB with 2 keys, SYNC, 64 in flight: index off "
            f"{row['index_off_msgs_s']:,.0f} msg/s, index on {row['index_on_msgs_s']:,.0f} "
            f"msg/s: on/off {row['ratio']:.2f}x; the brokers' CPU per message: off "
            f"{row['index_off_broker_cpu_us']:.1f} us, on {row['index_on_broker_cpu_us']:.1f} us"
        )
        return
    reqs = requests(args.messages)
    best = {True: float("inf"), False: float("inf")}
    data = b""
    for _ in range(args.rounds):
        for index in (False, True):
            elapsed, data = put_run(reqs, args.batch, index)
            best[index] = min(best[index], elapsed)
    n = args.messages
    off, on = best[False] / n * 1e6, best[True] / n * 1e6
    print(f"put (batch {args.batch}), index off: {off:.2f} us/msg")
    print(f"put (batch {args.batch}), index on:  {on:.2f} us/msg  ratio {on / off:.3f}")
    rbest = {True: float("inf"), False: float("inf")}
    for _ in range(args.rounds):
        for index in (False, True):
            rbest[index] = min(rbest[index], reput_run(data, index))
    roff, ron = rbest[False] / n * 1e6, rbest[True] / n * 1e6
    print(f"slave append+reput, index off: {roff:.2f} us/msg")
    print(f"slave append+reput, index on:  {ron:.2f} us/msg  ratio {ron / roff:.3f}")
    print(f"memory per entry (3 per message here): {memory_per_entry(min(n, 50_000)):.0f} bytes")


if __name__ == "__main__":
    main()
