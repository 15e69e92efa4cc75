"""Replay protection for signed client requests, bounded in memory.

A signer (:class:`ha_controller.acl.Credentials`, a gateway acting for its clients)
numbers its requests: the nonce is ``0x01 | session (15 random bytes) | counter (8
bytes, big-endian, from 1)`` (:class:`ha_controller.auth.NumberedNonces`).  A receiver
keeps, per (access key, session), the highest counter seen and which of the
:data:`WINDOW` counters below it it has seen
(IPsec's anti-replay window): a counter seen before is a copy (``replayed``); one
more than :data:`WINDOW` below the highest is refused too (``replay_window_passed``,
retriable: a client that re-signs sends a new counter), which only a request held
back by more than :data:`WINDOW` later ones of the same signer can meet.

A session is remembered until every request it was seen with has left the signature
window (its timestamp is more than ``max_skew_ms`` old, when a copy would be refused
as stale anyway), never earlier.  At most :data:`MAX_SESSIONS_PER_KEY` sessions of
one access key and :data:`MAX_SESSIONS` in all are kept; a new session beyond that is
refused (``replay_cache_full``, retriable) rather than forgetting a live one, so a
tenant who opens sessions without end exhausts only its own share.

A nonce of any other shape (a client of an earlier version: 16 random bytes) is kept
in a nonce cache (:class:`ha_controller.auth.ReplayCache`) for the same window.

Sans-IO: the caller passes the clock.
"""

from __future__ import annotations

from typing import Final

from ha_controller.auth import ReplayCache, split_nonce
from ha_controller.protocol.errors import Overloaded

__all__ = ["MAX_SESSIONS", "WINDOW", "ReplayWindow"]

#: counters below a session's highest that are still told apart
WINDOW: Final = 4096
MAX_SESSIONS: Final = 50_000
MAX_SESSIONS_PER_KEY: Final = 1024
_MASK: Final = (1 << WINDOW) - 1
#: how often forgotten sessions are swept out (a pass over all of them)
SWEEP_INTERVAL_MS: Final = 1000

#: refusal reasons (``hac_acl_denied_total{reason}``)
REPLAYED: Final = "replayed"
WINDOW_PASSED: Final = "replay_window_passed"
CACHE_FULL: Final = "replay_cache_full"


class _Session:
    __slots__ = ("bits", "expires_ms", "highest", "key")

    def __init__(self, key: str, counter: int, expires_ms: int) -> None:
        self.key = key
        self.highest = counter
        self.bits = 1
        self.expires_ms = expires_ms


class ReplayWindow:
    """The receiver's side: :meth:`check` each signed request once."""

    def __init__(
        self,
        *,
        max_skew_ms: int,
        max_sessions: int = MAX_SESSIONS,
        max_sessions_per_key: int = MAX_SESSIONS_PER_KEY,
        legacy_capacity: int = 100_000,
    ) -> None:
        self.max_skew_ms = max_skew_ms
        self.max_sessions = max_sessions
        self.max_sessions_per_key = max_sessions_per_key
        self._sessions: dict[tuple[str, bytes], _Session] = {}
        self._per_key: dict[str, int] = {}
        self._next_sweep_ms = 0
        self._legacy = ReplayCache(legacy_capacity)

    def __len__(self) -> int:
        return len(self._sessions)

    def _sweep(self, now_ms: int) -> None:
        if now_ms < self._next_sweep_ms:
            return
        self._next_sweep_ms = now_ms + SWEEP_INTERVAL_MS
        gone = [k for k, s in self._sessions.items() if s.expires_ms < now_ms]
        for k in gone:
            del self._sessions[k]
            key = k[0]
            left = self._per_key[key] - 1
            if left:
                self._per_key[key] = left
            else:
                del self._per_key[key]

    def check(self, key: str, nonce: bytes, timestamp_ms: int, now_ms: int) -> str | None:
        """None when the request is new (it is remembered now), else the reason it is
        refused: :data:`REPLAYED`, :data:`WINDOW_PASSED` or :data:`CACHE_FULL`."""
        expires = max(timestamp_ms, now_ms) + self.max_skew_ms
        parts = split_nonce(nonce)
        if parts is None:
            try:
                fresh = self._legacy.add(key.encode() + b"\0" + nonce, expires, now_ms)
            except Overloaded:
                return CACHE_FULL
            return None if fresh else REPLAYED
        session, counter = parts
        self._sweep(now_ms)
        state = self._sessions.get((key, session))
        if state is None:
            if len(self._sessions) >= self.max_sessions:
                return CACHE_FULL
            if self._per_key.get(key, 0) >= self.max_sessions_per_key:
                return CACHE_FULL
            state = _Session(key, counter, expires)
            self._sessions[(key, session)] = state
            self._per_key[key] = self._per_key.get(key, 0) + 1
            return None
        if counter > state.highest:
            shift = counter - state.highest
            state.bits = ((state.bits << shift) | 1) & _MASK if shift < WINDOW else 1
            state.highest = counter
        else:
            back = state.highest - counter
            if back >= WINDOW:
                return WINDOW_PASSED
            bit = 1 << back
            if state.bits & bit:
                return REPLAYED
            state.bits |= bit
        if expires > state.expires_ms:
            state.expires_ms = expires
        return None
