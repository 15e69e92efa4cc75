"""The POP records: receipt handles, checkpoints (CK) and ACKs.  Plain, no I/O.

A pop hands out each message with a :class:`ReceiptHandle` (RocketMQ's ExtraInfo idea)
in its ``POP_CK`` property and writes a :class:`Checkpoint` record into the revive
topic ``rmq_sys_REVIVE_LOG_{cluster}``; an ack writes an ACK record (:func:`ack_body`).
CK and ACK keys include the broker name (:func:`ck_key`: RIP-32 names the broker in
them), because one revive queue holds the records of several groups.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final

from ha_controller.client.routes import DEFAULT_TOPIC_QUEUE_NUMS
from ha_controller.protocol.errors import BadRequest
from ha_controller.protocol.properties import revive_log_topic

__all__ = [
    "MAX_POP_BATCH",
    "MIN_INVISIBLE_MS",
    "REVIVE_QUEUE_NUMS",
    "TAG_ACK",
    "TAG_CK",
    "Checkpoint",
    "ReceiptHandle",
    "ack_body",
    "ck_key",
    "parse_ack",
    "revive_topic",
]

REVIVE_QUEUE_NUMS: Final = DEFAULT_TOPIC_QUEUE_NUMS
#: the ``TAGS`` of a CK record and of an ACK record in the revive topic
TAG_CK: Final = "ck"
TAG_ACK: Final = "ack"
MAX_POP_BATCH: Final = 32
MIN_INVISIBLE_MS: Final = 1000


def revive_topic(cluster: str) -> str:
    return revive_log_topic(cluster)


@dataclass(frozen=True, slots=True)
class ReceiptHandle:
    """Where a popped message came from and where its CK went.

    Text form: ``ck_offset pop_time_ms invisible_ms revive_qid L|R:group|O broker_name
    queue_id offset`` (RocketMQ ExtraInfoUtil order, with L/R: CK in this group's own
    revive queue, or escaped to the master of ``group``; O: an orderly pop, no CK — the
    batch starting at ``ck_offset`` popped at ``pop_time_ms``).
    """

    ck_offset: int
    pop_time_ms: int
    invisible_ms: int
    revive_qid: int
    ck_local: bool
    broker_name: str
    queue_id: int
    offset: int
    orderly: bool = False
    #: the group whose revive queue holds an escaped CK ("R:<group>"; "" in a handle
    #: from before it was named)
    ck_group: str = ""

    def encode(self) -> str:
        return " ".join(
            [
                str(self.ck_offset),
                str(self.pop_time_ms),
                str(self.invisible_ms),
                str(self.revive_qid),
                "O"
                if self.orderly
                else "L"
                if self.ck_local
                else f"R:{self.ck_group}"
                if self.ck_group
                else "R",
                self.broker_name,
                str(self.queue_id),
                str(self.offset),
            ]
        )

    @classmethod
    def decode(cls, text: str) -> ReceiptHandle:
        parts = text.split(" ")
        kind, _, ck_group = parts[4].partition(":") if len(parts) == 8 else ("", "", "")
        if len(parts) != 8 or kind not in ("L", "R", "O") or (ck_group and kind != "R"):
            raise BadRequest(f"invalid receipt handle {text!r}")
        try:
            return cls(
                ck_offset=int(parts[0]),
                pop_time_ms=int(parts[1]),
                invisible_ms=int(parts[2]),
                revive_qid=int(parts[3]),
                ck_local=kind == "L",
                broker_name=parts[5],
                queue_id=int(parts[6]),
                offset=int(parts[7]),
                orderly=kind == "O",
                ck_group=ck_group,
            )
        except ValueError as exc:
            raise BadRequest(f"invalid receipt handle {text!r}") from exc

    def ck_key(self, group: str, topic: str) -> str:
        return ck_key(
            self.broker_name, group, topic, self.queue_id, self.ck_offset, self.pop_time_ms
        )


def ck_key(broker_name: str, group: str, topic: str, queue_id: int, start: int, pop_ms: int) -> str:
    """The CK/ACK unique key; it names the broker (RIP-32: keys include the broker name)."""
    return f"{broker_name}@{group}@{topic}@{queue_id}@{start}@{pop_ms}"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """One pop: which queue offsets of (topic, queue) a group took, until when."""

    broker_name: str
    group: str
    topic: str
    queue_id: int
    start_offset: int
    offsets: tuple[int, ...]
    pop_time_ms: int
    invisible_ms: int
    due_ms: int
    reput_times: int = 0

    @property
    def key(self) -> str:
        return ck_key(
            self.broker_name,
            self.group,
            self.topic,
            self.queue_id,
            self.start_offset,
            self.pop_time_ms,
        )

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "bn": self.broker_name,
                "g": self.group,
                "t": self.topic,
                "q": self.queue_id,
                "so": self.start_offset,
                "offs": list(self.offsets),
                "pt": self.pop_time_ms,
                "it": self.invisible_ms,
                "due": self.due_ms,
                "rp": self.reput_times,
            }
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> Checkpoint:
        d = json.loads(data)
        return cls(
            broker_name=str(d["bn"]),
            group=str(d["g"]),
            topic=str(d["t"]),
            queue_id=int(d["q"]),
            start_offset=int(d["so"]),
            offsets=tuple(int(o) for o in d["offs"]),
            pop_time_ms=int(d["pt"]),
            invisible_ms=int(d["it"]),
            due_ms=int(d["due"]),
            reput_times=int(d.get("rp", 0)),
        )


def ack_body(key: str, offset: int) -> bytes:
    return json.dumps({"k": key, "o": offset}).encode()


def parse_ack(body: bytes) -> tuple[str, int]:
    """(CK key, queue offset) of an ACK record (ValueError, KeyError, TypeError)."""
    d = json.loads(body)
    return str(d["k"]), int(d["o"])
