"""Synthetic drill histories with injected anomalies at known counts.

    python bench/gen_history.py OUT.jsonl --operations 1000000 --seed 7 \\
        --lost 10 --duplicated 10 --unexpected 5 --recovered 5 --order 5 --late 5 \\
        --unresolved 3 --double-locks 2 --rollbacks 2 --split-brain 3 --faults 3

``operations`` is the number of history lines (events) to aim for; the generator writes
messages until it reaches it, so the file has ``operations`` lines give or take a few.
Every message goes through ``send`` invoke -> ok -> ``receive`` ok (about 3 lines), plus
``end_tx`` for transactional ones; lock, offset and fault streams run alongside.  Message
classes by index ``i``: ``i % 10`` in 0..5 plain, 6..7 FIFO (64 message groups, each read
by one consumer), 8 delayed (timer ``delay_ms``, absolute ``due_ts_ms`` or delay level),
9 transactional (commit, rollback, or commit through a check-back).  Every anomaly is
injected so that each injection adds exactly one to its count in the verdict (see the
comments in :func:`generate`); :class:`Expected` holds the resulting counts.

Every send ok names the epoch and member that acknowledged, as in controller mode: the
history runs through :data:`EPOCHS` epochs in turn (epoch ``1 + i // block``, member
``epoch % 3``), each handing over cleanly to the next; a split-brain injection is an
acknowledgement by a writer of its own (a member or an epoch nobody else uses) in the
middle of an epoch.  The epochs are also seen (``epoch`` events) 10 s apart; a
fast-switch injection is a group of its own switched twice 1 s apart.

Like a drill's history writer, it also writes the Parquet copy ``OUT.parquet`` that the
Spark pipeline reads (``--no-columnar``: JSON lines only).

The lines are written with f-strings (no json.dumps) because the scale benchmark writes
ten million of them; keys and names are plain ASCII.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO, TypeVar

T = TypeVar("T")

T0 = 1_700_000_000_000
RECV_LAG_MS = 50
DELAY_MS = 2_000
TIMER_TOLERANCE_MS = 1_000
LEVEL_TOLERANCE_MS = 4_000
FIFO_GROUPS = 64
CONSUMERS = 4
MQS = 8
LOCK_STEP_MS = 2_000  # below the 30 s lease
TOPICS = 4
EPOCHS = 4


@dataclass(frozen=True)
class Anomalies:
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    recovered: int = 0
    order: int = 0
    late: int = 0
    unresolved: int = 0
    double_locks: int = 0
    rollbacks: int = 0
    split_brain: int = 0
    fast_switches: int = 0
    faults: int = 0


@dataclass
class Expected:
    """Counts the default-option checker must report for the generated history."""

    acknowledged: int = 0
    delivered: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    recovered: int = 0
    order_violations: int = 0
    late_delayed: int = 0
    unresolved_transactions: int = 0
    double_lock_grants: int = 0
    offset_rollbacks: int = 0
    corrupt_deliveries: int = 0
    split_brain: int = 0
    fast_switches: int = 0
    unsynced_lost: int = 0
    lines: int = 0

    def counts(self) -> dict[str, int]:
        out = asdict(self)
        del out["lines"]
        return out


def _line(t: int, process: str, type_: str, f: str, value: str) -> str:
    return f'{{"t_ms":{t},"process":"{process}","type":"{type_}","f":"{f}","value":{{{value}}}}}\n'


def _sample(rng: random.Random, pool: list[T], k: int, what: str) -> list[T]:
    if k > len(pool):
        raise ValueError(f"history too small for {k} {what} anomalies ({len(pool)} candidates)")
    return rng.sample(pool, k)


def generate(
    operations: int, anomalies: Anomalies, seed: int = 0
) -> tuple[Iterator[str], Expected]:
    """Return ``(lines, expected)``; ``expected`` is complete once ``lines`` is exhausted."""
    n_msgs = max(operations // 3, 1)
    rng = random.Random(seed)
    a = anomalies
    plain = [i for i in range(n_msgs) if i % 10 <= 5 and i % 1000 != 1]
    chosen = _sample(rng, plain, a.lost + a.duplicated + a.recovered, "plain-message")
    lost = set(chosen[: a.lost])
    dup = set(chosen[a.lost : a.lost + a.duplicated])
    recovered = set(chosen[a.lost + a.duplicated :])
    # split brain: plain acknowledgements well inside an epoch (10 messages from its
    # edges, so that its owner acknowledged before and after), each by a writer of its
    # own: a single acknowledgement surrounds nothing, so each adds exactly one
    block = max(n_msgs // EPOCHS, 1)
    taken = set(chosen)
    inside = [i for i in plain if 10 <= i % block < block - 10 and i not in taken]
    intruders = {i: u for u, i in enumerate(_sample(rng, inside, a.split_brain, "split-brain"))}
    # FIFO ordinal j (message index 10*(j//2) + 6 + j%2); its group successor is j + 64.
    # Pairs start at j with (j // 64) even, so pairs never share a message.
    n_fifo = sum(1 for i in range(n_msgs) if i % 10 in (6, 7))
    firsts = [j for j in range(n_fifo - FIFO_GROUPS) if (j // FIFO_GROUPS) % 2 == 0]
    swap_first = set(_sample(rng, firsts, a.order, "order"))
    swap_second = {j + FIFO_GROUPS for j in swap_first}
    delayed = [i for i in range(n_msgs) if i % 10 == 8]
    late = set(_sample(rng, delayed, a.late, "late-delayed"))
    committing_tx = [i for i in range(n_msgs) if i % 10 == 9 and (i // 10) % 3 != 1]
    unresolved = set(_sample(rng, committing_tx, a.unresolved, "unresolved-tx"))
    duration = n_msgs + RECV_LAG_MS + DELAY_MS + 10_000
    n_lock_steps = max(duration // LOCK_STEP_MS, 1)
    lock_slots = [(m, s) for m in range(MQS) for s in range(n_lock_steps)]
    intrusions = set(_sample(rng, lock_slots, a.double_locks, "double-lock"))
    rollbacks = set(_sample(rng, lock_slots, a.rollbacks, "offset-rollback"))
    expected = Expected(
        lost=a.lost,
        duplicated=a.duplicated,
        unexpected=a.unexpected,
        recovered=a.recovered,
        order_violations=a.order,
        late_delayed=a.late,
        unresolved_transactions=a.unresolved,
        double_lock_grants=a.double_locks,
        offset_rollbacks=a.rollbacks,
        split_brain=a.split_brain,
        fast_switches=a.fast_switches,
    )

    def lines() -> Iterator[str]:
        ex = expected
        fifo_ok: dict[int, int] = {}

        def recv(t: int, key: str, consumer: str, qo: int, topic: str) -> str:
            ex.delivered += 1
            return _line(
                t,
                consumer,
                "ok",
                "receive",
                f'"key":"{key}","msg_id":"ID{key}","broker":"broker-a","queue_id":{qo % 8},'
                f'"queue_offset":{qo},"consumer":"{consumer}","consumer_group":"G",'
                f'"topic":"{topic}"',
            )

        for c in range(CONSUMERS):
            for tp in range(TOPICS):
                yield _line(
                    T0,
                    f"c{c}",
                    "info",
                    "subscribe",
                    f'"consumer":"c{c}","consumer_group":"G","topic":"T{tp}"',
                )
        fifo_j = 0
        for i in range(n_msgs):
            t = T0 + i
            ok_t = t + 1 + i % 3
            kind = i % 10
            key = f"m{i}"
            topic = f"T{i % TOPICS}"
            consumer = f"c{i % CONSUMERS}"
            extra = ""
            if kind in (6, 7):
                g = fifo_j % FIFO_GROUPS
                extra = f',"group":"g{g}"'
                consumer = f"c{g % CONSUMERS}"
            elif kind == 8:
                extra = (',"delay_ms":2000', f',"due_ts_ms":{t + DELAY_MS}', ',"delay_level":2')[
                    (i // 10) % 3
                ]
            elif kind == 9:
                extra = ',"tx":true'
            yield _line(t, "producer", "invoke", "send", f'"key":"{key}","topic":"{topic}"{extra}')
            if i in recovered:  # unknown outcome, yet delivered: recovered +1
                yield _line(ok_t, "producer", "info", "send", f'"key":"{key}","error":"timeout"')
                yield recv(ok_t + RECV_LAG_MS, key, consumer, i, topic)
                continue
            if kind <= 5 and i % 1000 == 1:  # definite failure, never delivered: no anomaly
                yield _line(ok_t, "producer", "fail", "send", f'"key":"{key}","error":"busy"')
                continue
            epoch, member = 1 + i // block, (1 + i // block) % 3
            if i in intruders:  # a second master: another member, or an epoch of its own
                u = intruders[i]
                epoch, member = (epoch, 100 + u) if u % 2 == 0 else (1000 + u, member)
            yield _line(
                ok_t,
                "producer",
                "ok",
                "send",
                f'"key":"{key}","msg_id":"ID{key}","broker":"broker-a","queue_id":{i % 8},'
                f'"queue_offset":{i},"epoch":{epoch},"member_id":{member}',
            )
            if kind <= 5:
                ex.acknowledged += 1
                if i in lost:  # acknowledged, never delivered: lost +1
                    continue
                yield recv(ok_t + RECV_LAG_MS, key, consumer, i, topic)
                if i in dup:  # delivered twice to group G: duplicated +1
                    yield recv(ok_t + RECV_LAG_MS + 7, key, consumer, i, topic)
            elif kind in (6, 7):
                ex.acknowledged += 1
                j = fifo_j
                fifo_j += 1
                fifo_ok[j] = ok_t
                if j in swap_first:  # received after its group successor: order +1
                    continue
                if j in swap_second:
                    prev = j - FIFO_GROUPS
                    prev_key = f"m{10 * (prev // 2) + 6 + prev % 2}"
                    prev_i = 10 * (prev // 2) + 6 + prev % 2
                    yield recv(fifo_ok[prev] + RECV_LAG_MS, key, consumer, i, topic)
                    yield recv(
                        ok_t + RECV_LAG_MS, prev_key, consumer, prev_i, f"T{prev_i % TOPICS}"
                    )
                    continue
                yield recv(ok_t + RECV_LAG_MS, key, consumer, i, topic)
            elif kind == 8:
                ex.acknowledged += 1
                variant = (i // 10) % 3
                if variant == 2:  # level 2 = 5 s, tolerance 4 s
                    due, tol = t + 5_000, LEVEL_TOLERANCE_MS
                else:
                    due, tol = t + DELAY_MS, TIMER_TOLERANCE_MS
                at = due + tol + 1 + i % 500 if i in late else due + i % (tol // 2)
                yield recv(at, key, consumer, i, topic)  # late: late_delayed +1
            else:
                variant = (i // 10) % 3
                if i in unresolved:  # half message never ended nor delivered: unresolved +1
                    continue
                if variant == 1:
                    yield _line(
                        ok_t + 5, "producer", "ok", "end_tx", f'"key":"{key}","commit":false'
                    )
                    continue
                via = ',"via":"check"' if variant == 2 else ""
                yield _line(
                    ok_t + 5, "producer", "ok", "end_tx", f'"key":"{key}","commit":true{via}'
                )
                ex.acknowledged += 1
                yield recv(ok_t + 5 + RECV_LAG_MS, key, consumer, i, topic)
        for u in range(a.unexpected):  # never sent: unexpected +1 each
            yield recv(T0 + u, f"ghost{u}", "c0", u, "T0")
        yield from _locks_and_offsets(n_lock_steps, intrusions, rollbacks)
        for k in range(EPOCHS):  # the epochs as an observer saw them, 10 s apart
            yield _line(
                T0 + k * block,
                "observer",
                "info",
                "epoch",
                f'"group":"broker-a","epoch":{k + 1},"broker_id":{(k + 1) % 3},'
                f'"since_ms":{T0 + k * 10_000}',
            )
        for u in range(a.fast_switches):  # switched, then again 1 s later: +1 each
            for k in range(3):  # (the first switch, after epoch 1, may come at any time)
                yield _line(
                    T0 + k * 1_000,
                    "observer",
                    "info",
                    "epoch",
                    f'"group":"broker-f{u}","epoch":{k + 1},"broker_id":{k},'
                    f'"since_ms":{T0 + k * 1_000}',
                )
        for fno in range(a.faults):
            start = T0 + (fno + 1) * n_msgs // (a.faults + 1)
            kind = ("kill", "pause", "partition", "netem")[fno % 4]
            target = f"broker-{'ab'[fno % 2]}/0"
            yield _line(start, "nemesis", "info", "fault", f'"kind":"{kind}","target":"{target}"')
            yield _line(
                start + 1_000, "nemesis", "ok", "fault", f'"kind":"{kind}","target":"{target}"'
            )
            yield _line(
                start,
                "nemesis",
                "info",
                "role",
                f'"group":"{target[:-2]}","broker_id":1,"role":"acting"',
            )

    return lines(), expected


def _locks_and_offsets(
    n_steps: int, intrusions: set[tuple[int, int]], rollbacks: set[tuple[int, int]]
) -> Iterator[str]:
    for m in range(MQS):
        mq = f"T0/broker-a/{m}"
        owner = m % CONSUMERS
        offset = 0
        for s in range(n_steps):
            t = T0 + s * LOCK_STEP_MS
            if s and s % 5 == 0:  # hand over: old owner unlocks, the next one locks
                yield _line(
                    t,
                    f"c{owner}",
                    "ok",
                    "unlock",
                    f'"consumer":"c{owner}","consumer_group":"G","mq":"{mq}","reason":"rebalance"',
                )
                owner = (owner + 1) % CONSUMERS
                t += 1
            yield _line(
                t,
                f"c{owner}",
                "ok",
                "lock",
                f'"consumer":"c{owner}","consumer_group":"G","mq":"{mq}","granted":true',
            )
            if (m, s) in intrusions:  # granted while the owner holds it: double grant +1
                other = f"c{(owner + 1) % CONSUMERS}"
                yield _line(
                    t + 1,
                    other,
                    "ok",
                    "lock",
                    f'"consumer":"{other}","consumer_group":"G","mq":"{mq}","granted":true',
                )
                yield _line(
                    t + 2,
                    other,
                    "ok",
                    "unlock",
                    f'"consumer":"{other}","consumer_group":"G","mq":"{mq}"',
                )
            offset += 10
            yield _line(
                t + 3,
                f"c{owner}",
                "ok",
                "commit_offset",
                f'"consumer_group":"G","mq":"{mq}","offset":{offset}',
            )
            read = offset - 5 if (m, s) in rollbacks else offset  # lower read: rollback +1
            yield _line(
                t + 4,
                "probe",
                "ok",
                "offset_probe",
                f'"consumer_group":"G","mq":"{mq}","offset":{read}',
            )


def write_history(
    path: Path, operations: int, anomalies: Anomalies, seed: int = 0, *, columnar: bool = True
) -> Expected:
    """Write a generated history to ``path``; returns the expected counts.

    ``columnar``: also write the Parquet copy next to it, as a drill's history writer
    does when it closes (:func:`ha_controller.drills.history.write_columnar`)."""
    lines, expected = generate(operations, anomalies, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", buffering=1 << 20) as fh:
        expected.lines = _write(fh, lines)
    if columnar:
        from ha_controller.drills.history import write_columnar

        write_columnar(path)
    return expected


def _write(fh: TextIO, lines: Iterator[str]) -> int:
    n = 0
    batch: list[str] = []
    for line in lines:
        batch.append(line)
        if len(batch) >= 10_000:
            fh.write("".join(batch))
            n += len(batch)
            batch.clear()
    fh.write("".join(batch))
    return n + len(batch)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("out", type=Path)
    p.add_argument("--operations", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--no-columnar", action="store_true", help="write only the JSON lines (no .parquet copy)"
    )
    for name in Anomalies.__dataclass_fields__:
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=0)
    args = p.parse_args(argv)
    anomalies = Anomalies(**{name: getattr(args, name) for name in Anomalies.__dataclass_fields__})
    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)  # ha_controller, for the columnar copy
    expected = write_history(
        args.out, args.operations, anomalies, args.seed, columnar=not args.no_columnar
    )
    print(expected)
    return 0


if __name__ == "__main__":
    sys.exit(main())
