"""Framing, RPC and connection bounds (TubeMQ's listSize/block limits; docs/protocol.md).

Here, not in :mod:`ha_controller.config`, so that the RPC layer and the client SDK do not
load the TOML/env configuration machinery.  :mod:`ha_controller.config` loads these as
the ``[limits]`` table of the nameserver and broker configs and re-exports the class:
a field ``x`` is the config key ``limits.x`` and the variable ``HAC_LIMITS_X``.

Each field's metadata holds its bounds (``ge``/``le``) and its description (``doc``, and
``details`` for the longer ones), under the names :func:`ha_controller.config.setting`
gives them: this class's own check reads the bounds, the config loader reads them too
(naming the key and where its value came from), and docs/configuration.md shows the
descriptions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from ha_controller.protocol.errors import ConfigError

__all__ = ["RpcLimits"]

_KIB: Final = 1024
_MIB: Final = 1024 * _KIB
_GIB: Final = 1024 * _MIB


def _bounded(
    default: int, *, ge: int, le: int | None = None, doc: str, details: str | None = None
) -> int:
    metadata: dict[str, object] = {"ge": ge, "doc": doc}
    if le is not None:
        metadata["le"] = le
    if details is not None:
        metadata["details"] = details
    return field(default=default, metadata=metadata)


# The descriptions that two keys share.
_ASSEMBLY_DOC = (
    "Bytes of incomplete frames that each connection may hold on its own, and that a "
    "listener shares among its connections for larger frames."
)
_ASSEMBLY_DETAILS = (
    "Each connection may buffer up to `conn_frame_buffer_bytes` of an incomplete frame on "
    "its own (heartbeats, pulls, sends of ordinary messages); beyond that it draws on the "
    "listener's `assembly_budget_bytes` (64 KiB, then up to 256 KiB a step, given back "
    "when the frame is complete). Bytes are read only once they are covered, so an "
    "announced block length is never trusted: a peer that announces 16 MiB and sends 1 "
    "byte costs 1 byte. When the budget is spent the connection stops being read "
    '(`hac_rpc_reads_paused_total{reason="assembly_budget"}`) until bytes are released '
    "(first come, first served); the frame deadline still runs. Should every connection "
    "holding budget be waiting for more, the oldest waiter may overdraw by up to one "
    "frame so that the listener cannot deadlock. The bytes of incomplete frames on a "
    "listener are therefore at most (plus one 256 KiB step): `max_connections * "
    "conn_frame_buffer_bytes + assembly_budget_bytes + max_frame_bytes = 4096 * 16 KiB + "
    "64 MiB + 32 MiB = 160 MiB (defaults)` while one frame may still be as large as "
    "`max_frame_bytes`. Peers that hold budget and stall keep it until their frame "
    "deadline: large frames of others wait that long (memory stays bounded; lower "
    "`frame_timeout_ms` to shorten it)."
)
_LIVENESS_DOC = (
    "An outgoing connection with calls pending that has heard nothing from its peer for "
    "`liveness_probe_ms` sends a one-frame probe (`RPC_PING`, answered by the peer's "
    "connection layer at once, even while a held pull waits); when nothing at all arrives "
    "within `liveness_timeout_ms` of the probe, the connection is aborted and its pending "
    "calls fail with the retriable `ConnectionClosed`, so the next call dials afresh (one "
    "log line names the peer)."
)
_LIVENESS_DETAILS = (
    "A connection that lived through a partition otherwise waits out TCP's retransmission "
    "back-off after the heal (seconds, growing with the partition), and a frozen peer "
    "holds a long-poll pull for its whole timeout. RocketMQ's client closes a channel "
    "whose call timed out (`clientCloseSocketIfTimeout`); this finds the dead channel "
    "sooner and never drops one that is merely slow to answer, since any byte from the "
    "peer counts. A broker's connections to its nameservers never probe: a nameserver "
    "expires a broker whose registration connection closes, and one frozen for a while "
    "must find its brokers still there when it resumes. `0` turns the probe off."
)
_ACCEPT_BACKOFF_DOC = (
    "When `accept()` fails for lack of descriptors or memory (EMFILE, ENFILE, ENOBUFS, "
    "ENOMEM) the listener waits this long, doubling up to the maximum, and logs once per "
    "10 s instead of once per attempt (`hac_rpc_accept_errors_total`)."
)
_ACCEPT_BACKOFF_DETAILS = "Connections wait in the kernel's backlog meanwhile."


def _unit(name: str) -> str:
    for suffix, unit in (("_ms", " ms"), ("_bytes", " bytes")):
        if name.endswith(suffix):
            return unit
    return ""


@dataclass(frozen=True, kw_only=True)
class RpcLimits:
    """Framing, RPC and connection bounds; invalid values raise :class:`ConfigError` naming the key.

    The connection bounds apply to every listener (``RpcServer``) on its own; outgoing
    connections (``connect()``) only keep the frame bounds.  Each bound has an overflow
    policy and a counter (:class:`~ha_controller.rpc.bounds.RpcStats`, exported as
    ``hac_rpc_*``); each field's ``doc`` and ``details`` say which.
    """

    max_frame_bytes: int = _bounded(
        32 * _MIB,
        ge=1 * _KIB,
        le=1 * _GIB,
        doc=(
            "Largest frame (its payload: the whole envelope) accepted; a bigger one closes the "
            "connection (`FrameTooLarge`). A message must fit in one frame."
        ),
    )
    max_list_size: int = _bounded(
        3584,
        ge=1,
        doc="Most blocks one frame may announce (TubeMQ `listSize`); more closes the connection.",
    )
    max_block_bytes: int = _bounded(
        8192,
        ge=16,
        doc=(
            "Size of the blocks a sender cuts a frame's payload into (a receiver accepts larger "
            "blocks up to `max_frame_bytes`)."
        ),
    )
    max_inflight_requests: int = _bounded(
        1024,
        ge=1,
        doc=(
            "Requests one connection may have running at once; one more is answered `Overloaded` "
            "(retriable)."
        ),
    )
    default_timeout_ms: int = _bounded(
        3000,
        ge=1,
        doc=(
            "Timeout of an outgoing call that names none; it travels in the request, and a reply "
            "later than it is dropped."
        ),
    )
    max_connections: int = _bounded(
        4096,
        ge=1,
        doc=(
            "Open connections per listener, counted from `accept()` until the descriptor is "
            "closed (a TLS handshake counts)."
        ),
        details=(
            "One more is accepted and closed at once (RST), counted as "
            '`hac_rpc_connections_refused_total{reason="max_connections"}` and logged once per 10 '
            "s. 4096 is far more clients than one broker or nameserver serves in practice, and "
            "stays well below the descriptor limit container runtimes give by default (containerd "
            "and Docker: 1,048,576; a listener warns at start when `RLIMIT_NOFILE` is lower). The "
            "descriptor limit itself is guarded by the accept back-off below. An idle connection "
            "costs about 5 KiB (measured), so 4096 cost about 20 MiB."
        ),
    )
    idle_timeout_ms: int = _bounded(
        120_000,
        ge=100,
        doc=(
            "A connection that delivers no complete frame for this long, while none of its "
            "requests is being handled and none of our calls on it is pending, is closed with one "
            "log line (`hac_rpc_idle_timeouts_total`)."
        ),
        details=(
            "RocketMQ's `serverChannelMaxIdleTimeSeconds` is also 120 s; its clients heartbeat "
            "every broker every 30 s and poll routes every 30 s, and held pulls or route watches "
            "count as activity, so only dead or abandoned connections reach it."
        ),
    )
    frame_timeout_ms: int = _bounded(
        30_000,
        ge=100,
        doc=(
            "Deadline of one frame, from its first byte to its last (slowloris); also the TLS "
            "handshake deadline and how long a closed connection may take to read its last "
            "replies before it is aborted."
        ),
        details=(
            "On expiry the connection is aborted with one log line "
            "(`hac_rpc_frames_timed_out_total`). 30 s moves a maximal 32 MiB frame at 10 Mbit/s; "
            "a legitimate frame on a cluster network takes milliseconds."
        ),
    )
    conn_frame_buffer_bytes: int = _bounded(
        16 * _KIB, ge=1 * _KIB, le=1 * _GIB, doc=_ASSEMBLY_DOC, details=_ASSEMBLY_DETAILS
    )
    assembly_budget_bytes: int = _bounded(
        64 * _MIB, ge=64 * _KIB, le=64 * _GIB, doc=_ASSEMBLY_DOC, details=_ASSEMBLY_DETAILS
    )
    write_high_water_bytes: int = _bounded(
        256 * _KIB,
        ge=4 * _KIB,
        le=1 * _GIB,
        doc="Replies queued for a peer beyond which it stops being read (write back-pressure).",
        details=(
            "When replies queued for a peer exceed this, the connection stops being read, and "
            "requests already read wait before running, until the queue falls below a quarter of "
            'it (`hac_rpc_reads_paused_total{reason="write_backlog"}`). A peer that sends '
            "requests but does not read the replies thus costs at most this plus the replies of "
            "requests admitted before the pause (at most one read, `conn_frame_buffer_bytes` of "
            "requests, and `max_inflight_requests`), instead of everything it asks for; such a "
            "connection then goes idle and is closed. This bound is per connection; the listener "
            "has no shared budget for replies."
        ),
    )
    liveness_probe_ms: int = _bounded(1000, ge=0, doc=_LIVENESS_DOC, details=_LIVENESS_DETAILS)
    liveness_timeout_ms: int = _bounded(2000, ge=1, doc=_LIVENESS_DOC, details=_LIVENESS_DETAILS)
    accept_backoff_ms: int = _bounded(
        100, ge=1, doc=_ACCEPT_BACKOFF_DOC, details=_ACCEPT_BACKOFF_DETAILS
    )
    accept_backoff_max_ms: int = _bounded(
        1000, ge=1, doc=_ACCEPT_BACKOFF_DOC, details=_ACCEPT_BACKOFF_DETAILS
    )

    @property
    def write_low_water_bytes(self) -> int:
        """Where reading resumes after write back-pressure: a quarter of the high-water mark."""
        return self.write_high_water_bytes // 4

    @property
    def assembly_bound_bytes(self) -> int:
        """The most bytes of incomplete frames one listener holds (see the class docstring)."""
        return (
            self.max_connections * self.conn_frame_buffer_bytes
            + self.assembly_budget_bytes
            + self.max_frame_bytes
        )

    def __post_init__(self) -> None:
        problem = next(self._field_problems(), None) or next(self._rules(), None)
        if problem is not None:
            keys, text = problem
            raise ConfigError(f"{', '.join(keys)}: {text}")

    def _field_problems(self) -> Iterator[tuple[tuple[str, ...], str]]:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            unit = _unit(f.name)
            if not isinstance(value, int) or isinstance(value, bool):
                yield (f.name,), f"expected an integer, got {type(value).__name__} {value!r}"
                continue
            ge, le = f.metadata.get("ge"), f.metadata.get("le")
            if ge is not None and value < ge:
                yield (f.name,), f"must be >= {ge}{unit}, got {value}{unit}"
            elif le is not None and value > le:
                yield (f.name,), f"must be <= {le}{unit}, got {value}{unit}"

    def _rules(self) -> Iterator[tuple[tuple[str, ...], str]]:
        """Cross-field rules: ``(keys, problem)``; the config loader reports them too."""
        if self.max_block_bytes > self.max_frame_bytes:
            yield (
                ("max_block_bytes", "max_frame_bytes"),
                f"a block ({self.max_block_bytes}) cannot exceed the frame limit "
                f"({self.max_frame_bytes})",
            )
        if self.accept_backoff_ms > self.accept_backoff_max_ms:
            yield (
                ("accept_backoff_ms", "accept_backoff_max_ms"),
                f"the initial accept back-off ({self.accept_backoff_ms} ms) exceeds the "
                f"maximum ({self.accept_backoff_max_ms} ms)",
            )
