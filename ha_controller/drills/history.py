"""Drill histories: typed events, a JSON-lines writer and a strict reader.

A history (``history.jsonl``, docs/drills.md) holds one JSON object a line::

    {"t_ms": 1700000000123, "process": "producer-1", "type": "ok", "f": "send",
     "value": {"key": "k-17", "msg_id": "7F00000100002A9F0000000000001F40",
               "broker": "broker-a", "queue_id": 3, "queue_offset": 41}}

``t_ms`` is wall-clock milliseconds (all drill processes share one clock); ``process``
names the client or nemesis that recorded the event; ``type`` is ``invoke`` (an
operation starts), ``ok`` (it definitely happened), ``fail`` (it definitely did not) or
``info`` (outcome unknown, or a point event such as a fault start or a role change).
Extra keys inside ``value`` are allowed and ignored by the checkers; missing optional
keys may be absent or ``null``.

Value schemas, per ``f`` (``?`` marks an optional key):

``send``
    invoke ``{"key", "topic", "group"?, "delay_level"?, "delay_ms"?, "due_ts_ms"?, "tx"?}``
        ``key`` is the message's unique key (first business key, else UNIQ_KEY) and
        identifies the message everywhere; ``group`` is the FIFO message group;
        a delayed message carries exactly one of ``delay_level`` (RocketMQ level
        1..18, see :data:`DELAY_LEVELS_MS`), ``delay_ms`` (relative to the invoke's
        ``t_ms``) or ``due_ts_ms`` (absolute delivery time); ``tx: true`` marks a
        transactional (half) message.
    ok ``{"key", "msg_id", "broker", "queue_id", "queue_offset", "epoch"?, "member_id"?}``;
        in controller mode ``epoch`` and ``member_id`` name the epoch under which the
        group's master acknowledged and which member of the group it is (its own broker
        id, whatever id it serves as).
    fail ``{"key", "error"?}`` (definitely not stored) / info ``{"key", "error"?}`` (unknown).
    A send invoke without any completion counts as ``info``.
``receive``
    ok ``{"key", "msg_id", "broker", "queue_id", "queue_offset", "consumer",
    "consumer_group", "group"?, "due_ts_ms"?, "topic"?, "stored_ms"?, "corrupt"?}``; one
    event per delivered message (a batch pull records one event per message, all with
    the same ``t_ms``).  ``stored_ms`` is the store time of the copy read, by the
    broker's clock (for a delayed message: when it was put into its topic); the
    checkers do not use it, it tells a message stored late from one read late.
    ``corrupt: true`` marks a delivery whose body is not the one its key's sender wrote
    (every drill body is derived from its key, :func:`ha_controller.client.tools.body_for`).
    invoke/fail/info of ``receive`` (polls) are ignored by the checkers.
``ack``
    ok ``{"key", "consumer", "consumer_group"}``: the consumer acknowledged (POP ack,
    or push-listener success) this delivery.
``subscribe``
    info ``{"consumer", "consumer_group", "topic"}``: declares that ``consumer_group``
    must receive every acknowledged message of ``topic`` (receiving one also implies it).
``lock``
    invoke ``{"consumer", "consumer_group", "mq"}``; ok ``{"consumer", "consumer_group",
    "mq", "granted"}`` where ``mq`` is ``"topic/broker/queue_id"``.  A granted lock
    (renewals included) lives from the ok's ``t_ms`` until the earliest of: the lease
    end ``t_ms + lock_lease_ms`` (the client's 30 s drop rule by default), or the first
    ``unlock`` event (any type: the consumer stops consuming when it decides to unlock)
    of the same consumer, consumer group and mq at or after the grant.
``unlock``
    invoke/ok/info ``{"consumer", "consumer_group", "mq", "reason"?}``; ``reason`` is
    free text (``"unlock"``, ``"expired"``, ``"dropped"``, ``"shutdown"``).
``end_tx``
    invoke/ok/fail/info ``{"key", "commit"}``.  Only ``ok`` resolves the transaction;
    a producer's answer to a broker check-back is recorded as ``end_tx`` ok too
    (optionally with ``"via": "check"``).
``commit_offset``
    invoke/ok/fail ``{"consumer_group", "mq", "offset"}``: the consumer committed its
    next-to-consume offset for ``mq``.
``offset_probe``
    ok ``{"consumer_group", "mq", "offset", "broker"?}``: the offset a broker reported
    for the group (read after a master returns, to detect rollbacks).
``fault``
    info ``{"kind", "target", "detail"?, "family"?}`` when the fault takes effect
    (start), ok ``{"kind", "target", "family"?}`` when it is healed; ``kind`` is
    ``kill`` | ``pause`` | ``partition`` | ``netem`` | ``disk`` | ``power`` |
    ``corrupt`` | ``clock``; ``target`` names a broker (``"broker-a/0"``: group/id), a
    nameserver (``"nameserver"``, ``"nameserver-1"``), a whole group (``"broker-a"``, a
    power loss of every broker of it), the whole cluster (``"cluster"``) or a link;
    ``family`` is the fault family of a generated schedule (``kill``, ``pause``,
    ``pause-past-expiry``, ``partition``, ``loss``, ``disk-full``, ``slave``,
    ``nameserver``, ``power-loss``, ``corruption``, ``clock``; campaigns count faults by
    it).  invoke/fail of ``fault`` are ignored.
``store``
    info ``{"flush_mode", "flush_interval_ms"}`` once at the start: how the brokers'
    stores sync (``sync``: before every acknowledgement; ``async``: every
    ``flush_interval_ms``); the checkers judge losses at a power loss by it.
``role``
    info ``{"group", "broker_id", "role"}`` with ``role`` in ``master`` | ``acting`` |
    ``slave`` | ``isolated``: a broker's role as observed by the drill.
``epoch``
    info ``{"group", "epoch", "broker_id", "since_ms"?, "reason"?}`` (controller mode):
    the group's epoch moved, as a nameserver showed it; ``broker_id`` is the member id of
    its master, ``since_ms`` when the controller began the epoch.

Any other ``f`` is kept by the reader and ignored by the checkers.

Columnar copy: when pyarrow is installed, :class:`HistoryWriter` also writes
``history.parquet`` next to ``history.jsonl`` when it closes (:func:`write_columnar`):
the same events with the schema :data:`VALUE_FIELDS` gives ``value``, which Spark reads
natively (no JSON parsing, only the columns a query needs).  The JSON lines stay the
reference: the Parquet file records the size and modification time of the file it was
made from, and :func:`columnar_copy` offers it only while they still match.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, ClassVar, Final, Literal, Self, TypeAlias, cast

from ha_controller.protocol.errors import HaError
from ha_controller.protocol.properties import DELAY_LEVELS_MS, now_ms

__all__ = [
    "DELAY_LEVELS_MS",
    "EVENT_TYPES",
    "Ack",
    "EndTx",
    "EpochChange",
    "Event",
    "EventType",
    "Fault",
    "HistoryError",
    "HistoryWriter",
    "Lock",
    "OffsetCommit",
    "OffsetProbe",
    "Receive",
    "Role",
    "SendInvoke",
    "StoreMode",
    "SendOk",
    "SendOutcome",
    "Subscribe",
    "Unlock",
    "VALUE_FIELDS",
    "columnar_copy",
    "iter_history",
    "read_history",
    "write_columnar",
]

logger = logging.getLogger(__name__)

EventType: TypeAlias = Literal["invoke", "ok", "fail", "info"]
EVENT_TYPES: Final[frozenset[str]] = frozenset({"invoke", "ok", "fail", "info"})

# DELAY_LEVELS_MS (re-exported): RocketMQ's default ``messageDelayLevel`` in ms; level n
# (1-based) delays by entry n-1.


class HistoryError(HaError, ValueError):
    """A history file (or event) that does not follow the format; names file and line."""


#: The ``value`` keys the checkers read and their types (``string``, ``long``,
#: ``boolean``): the schema of the columnar copy and of the Spark pipeline's reader.
VALUE_FIELDS: Final[tuple[tuple[str, str], ...]] = (
    ("key", "string"),
    ("topic", "string"),
    ("group", "string"),
    ("delay_level", "long"),
    ("delay_ms", "long"),
    ("due_ts_ms", "long"),
    ("tx", "boolean"),
    ("msg_id", "string"),
    ("broker", "string"),
    ("queue_id", "long"),
    ("queue_offset", "long"),
    ("consumer", "string"),
    ("consumer_group", "string"),
    ("mq", "string"),
    ("granted", "boolean"),
    ("commit", "boolean"),
    ("offset", "long"),
    ("kind", "string"),
    ("target", "string"),
    ("broker_id", "long"),
    ("role", "string"),
    ("reason", "string"),
    ("error", "string"),
    ("family", "string"),
    ("corrupt", "boolean"),
    ("flush_mode", "string"),
    ("flush_interval_ms", "long"),
    ("epoch", "long"),
    ("member_id", "long"),
    ("since_ms", "long"),
)

_SOURCE_SIZE = b"hac.history.source_size"
_SOURCE_MTIME = b"hac.history.source_mtime_ns"
#: the value fields a copy was written with: a copy from before a field was added is
#: stale (the JSON lines are read instead)
_FIELDS = b"hac.history.value_fields"
_FIELDS_TAG = ",".join(name for name, _ in VALUE_FIELDS)
_ROW_GROUP_ROWS = 1 << 19


def _columnar_path(path: Path) -> Path:
    return path.with_suffix(".parquet")


def write_columnar(path: str | os.PathLike[str]) -> Path | None:
    """Write the Parquet copy of the JSON-lines history ``path`` (``history.jsonl`` ->
    ``history.parquet``, replaced atomically) and return its path.

    Returns None, writing nothing, without pyarrow, or when a line does not fit the
    schema (then the JSON lines alone are the history, as before; a stale copy is
    removed).  The copy's metadata names the size and modification time of ``path``.
    """
    try:
        import pyarrow as pa  # type: ignore[import-untyped]
        import pyarrow.json as pa_json  # type: ignore[import-untyped]
        import pyarrow.parquet as pq  # type: ignore[import-untyped]
    except ImportError:
        return None
    src = Path(path)
    out = _columnar_path(src)
    kinds = {"string": pa.string(), "long": pa.int64(), "boolean": pa.bool_()}
    value = pa.struct([(name, kinds[kind]) for name, kind in VALUE_FIELDS])
    schema = pa.schema(
        [
            ("t_ms", pa.int64()),
            ("process", pa.string()),
            ("type", pa.string()),
            ("f", pa.string()),
            ("value", value),
        ]
    )
    try:
        stat = src.stat()
        table = pa_json.read_json(
            src,
            parse_options=pa_json.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"
            ),
        ).select(schema.names)
        table = table.replace_schema_metadata(
            {
                _SOURCE_SIZE: str(stat.st_size),
                _SOURCE_MTIME: str(stat.st_mtime_ns),
                _FIELDS: _FIELDS_TAG,
            }
        )
        tmp = out.with_name(f".{out.name}.tmp")
        pq.write_table(table, tmp, row_group_size=_ROW_GROUP_ROWS)
        os.replace(tmp, out)
    except (OSError, pa.ArrowException) as exc:
        logger.warning("no columnar copy of %s: %s", src, exc)
        out.unlink(missing_ok=True)
        return None
    return out


def columnar_copy(path: str | os.PathLike[str]) -> Path | None:
    """The Parquet copy of ``path`` if it was written from the file as it is now."""
    src = Path(path)
    out = _columnar_path(src)
    if src.suffix != ".jsonl" or not out.exists():
        return None
    try:
        import pyarrow.parquet as pq

        meta = pq.read_schema(out).metadata or {}
        stat = src.stat()
    except (ImportError, OSError, ValueError):
        return None
    if (
        meta.get(_SOURCE_SIZE) != str(stat.st_size).encode()
        or meta.get(_SOURCE_MTIME) != str(stat.st_mtime_ns).encode()
        or meta.get(_FIELDS) != _FIELDS_TAG.encode()
    ):
        return None
    return out


# --- typed values ------------------------------------------------------------------


def _drop_none(obj: object) -> dict[str, Any]:
    out = dataclasses.asdict(cast(Any, obj))
    return {k: v for k, v in out.items() if v is not None}


@dataclass(frozen=True, slots=True)
class _Value:
    f: ClassVar[str]

    def to_value(self) -> dict[str, Any]:
        return _drop_none(self)


@dataclass(frozen=True, slots=True)
class SendInvoke(_Value):
    f: ClassVar[str] = "send"
    key: str
    topic: str
    group: str | None = None
    delay_level: int | None = None
    delay_ms: int | None = None
    due_ts_ms: int | None = None
    tx: bool | None = None


@dataclass(frozen=True, slots=True)
class SendOk(_Value):
    f: ClassVar[str] = "send"
    key: str
    msg_id: str
    broker: str
    queue_id: int
    queue_offset: int
    #: controller mode: the epoch and the group member that acknowledged
    epoch: int | None = None
    member_id: int | None = None


@dataclass(frozen=True, slots=True)
class SendOutcome(_Value):
    """Value of a send ``fail`` or ``info``."""

    f: ClassVar[str] = "send"
    key: str
    error: str | None = None
    #: the group the last attempt went to, when the client knows it
    broker: str | None = None


@dataclass(frozen=True, slots=True)
class Receive(_Value):
    f: ClassVar[str] = "receive"
    key: str
    msg_id: str
    broker: str
    queue_id: int
    queue_offset: int
    consumer: str
    consumer_group: str
    group: str | None = None
    due_ts_ms: int | None = None
    topic: str | None = None
    stored_ms: int | None = None
    #: True when the body is not the one derived from the key (absent when it is)
    corrupt: bool | None = None


@dataclass(frozen=True, slots=True)
class Ack(_Value):
    f: ClassVar[str] = "ack"
    key: str
    consumer: str
    consumer_group: str


@dataclass(frozen=True, slots=True)
class Subscribe(_Value):
    f: ClassVar[str] = "subscribe"
    consumer: str
    consumer_group: str
    topic: str


@dataclass(frozen=True, slots=True)
class Lock(_Value):
    f: ClassVar[str] = "lock"
    consumer: str
    consumer_group: str
    mq: str
    granted: bool | None = None


@dataclass(frozen=True, slots=True)
class Unlock(_Value):
    f: ClassVar[str] = "unlock"
    consumer: str
    consumer_group: str
    mq: str
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class EndTx(_Value):
    f: ClassVar[str] = "end_tx"
    key: str
    commit: bool
    via: str | None = None


@dataclass(frozen=True, slots=True)
class OffsetCommit(_Value):
    f: ClassVar[str] = "commit_offset"
    consumer_group: str
    mq: str
    offset: int


@dataclass(frozen=True, slots=True)
class OffsetProbe(_Value):
    f: ClassVar[str] = "offset_probe"
    consumer_group: str
    mq: str
    offset: int
    broker: str | None = None


@dataclass(frozen=True, slots=True)
class Fault(_Value):
    f: ClassVar[str] = "fault"
    kind: str
    target: str
    detail: str | None = None
    family: str | None = None


@dataclass(frozen=True, slots=True)
class StoreMode(_Value):
    f: ClassVar[str] = "store"
    flush_mode: str
    flush_interval_ms: int


@dataclass(frozen=True, slots=True)
class Role(_Value):
    f: ClassVar[str] = "role"
    group: str
    broker_id: int
    role: str


@dataclass(frozen=True, slots=True)
class EpochChange(_Value):
    """Controller mode: the group's epoch as a nameserver showed it, recorded when it
    moves; ``broker_id`` is the master's member id, ``since_ms`` when the epoch began
    (the controller's clock)."""

    f: ClassVar[str] = "epoch"
    group: str
    epoch: int
    broker_id: int
    since_ms: int | None = None
    reason: str | None = None


# --- events ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Event:
    """One history line."""

    t_ms: int
    process: str
    type: EventType
    f: str
    value: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, t_ms: int, process: str, type: EventType, value: _Value) -> Event:
        """Build an event from a typed value (``f`` comes from the value's class)."""
        return cls(t_ms, process, type, value.f, value.to_value())

    def to_dict(self) -> dict[str, Any]:
        return {
            "t_ms": self.t_ms,
            "process": self.process,
            "type": self.type,
            "f": self.f,
            "value": dict(self.value),
        }

    def to_line(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_dict(cls, obj: object, where: str = "event") -> Event:
        """Validate a decoded JSON object; raises :class:`HistoryError` naming ``where``."""
        if not isinstance(obj, dict):
            raise HistoryError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        t_ms = obj.get("t_ms")
        if not isinstance(t_ms, int) or isinstance(t_ms, bool):
            raise HistoryError(f"{where}: 't_ms' must be an integer, got {t_ms!r}")
        process = obj.get("process")
        if not isinstance(process, str):
            raise HistoryError(f"{where}: 'process' must be a string, got {process!r}")
        etype = obj.get("type")
        if etype not in EVENT_TYPES:
            raise HistoryError(f"{where}: 'type' must be one of invoke/ok/fail/info, got {etype!r}")
        f = obj.get("f")
        if not isinstance(f, str) or not f:
            raise HistoryError(f"{where}: 'f' must be a non-empty string, got {f!r}")
        value = obj.get("value", {})
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise HistoryError(f"{where}: 'value' must be a JSON object, got {value!r}")
        return cls(t_ms, process, cast(EventType, etype), f, value)


def iter_history(path: str | os.PathLike[str]) -> Iterator[Event]:
    """Yield the events of a history file lazily; blank lines are skipped.

    Raises :class:`HistoryError` naming ``path:line`` for a line that is not valid JSON
    or not a valid event.
    """
    p = Path(path)
    with p.open("r", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            text = line.strip()
            if not text:
                continue
            where = f"{p}:{lineno}"
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as exc:
                raise HistoryError(
                    f"{where}: invalid JSON: {exc.msg} (column {exc.colno})"
                ) from exc
            yield Event.from_dict(obj, where)


def read_history(path: str | os.PathLike[str]) -> list[Event]:
    """Read a whole history file (see :func:`iter_history`)."""
    return list(iter_history(path))


class HistoryWriter:
    """Appends events to a JSON-lines history file.

    Thread-safe (one lock around each line write) and safe to call from asyncio code:
    each call writes one complete line and flushes it to the OS, so a crash of the drill
    runner loses no recorded event and readers never see half a line.  ``fsync=True``
    also fdatasyncs every line (slow; for drills that kill the runner's host).
    ``columnar=True`` (the default) writes the Parquet copy when the writer closes
    (:func:`write_columnar`; nothing without pyarrow).
    Use as a context manager or call :meth:`close` (idempotent).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: bool = False,
        clock_ms: Callable[[], int] | None = None,
        columnar: bool = True,
    ) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] | None = self._path.open("a", encoding="utf-8")
        self._lock = threading.Lock()
        self._fsync = fsync
        self._clock_ms: Callable[[], int] = clock_ms if clock_ms is not None else now_ms
        self._columnar = columnar
        self.count = 0

    @property
    def path(self) -> Path:
        return self._path

    def write(self, event: Event) -> None:
        line = event.to_line() + "\n"
        with self._lock:
            if self._fh is None:
                raise HistoryError(f"history writer for {self._path} is closed")
            self._fh.write(line)
            self._fh.flush()
            if self._fsync:
                os.fdatasync(self._fh.fileno())
            self.count += 1

    def write_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.write(event)

    def record(
        self,
        process: str,
        type: EventType,
        value: _Value,
        *,
        t_ms: int | None = None,
    ) -> Event:
        """Write ``value`` as an event now (or at ``t_ms``) and return the event."""
        event = Event.of(self._clock_ms() if t_ms is None else t_ms, process, type, value)
        self.write(event)
        return event

    def close(self) -> None:
        with self._lock:
            if self._fh is None:
                return
            self._fh.close()
            self._fh = None
        if self._columnar:
            write_columnar(self._path)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
