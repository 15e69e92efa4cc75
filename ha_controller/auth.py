"""HMAC signatures on broker registration, so that no process can register
itself as some group's id 0 without the cluster secret.

The signature is HMAC-SHA256, keyed with the cluster secret, over a canonical
``|``-joined string of the fields that decide a broker's place in the route
(operation, cluster, address, group, id, timestamp).  A timestamp older or
newer than ``max_skew_ms`` is refused to bound replay.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from ha_controller.protocol.errors import SignatureInvalid

DEFAULT_MAX_SKEW_MS = 5 * 60 * 1000


def canonical(
    op: str, cluster: str, addr: str, broker_name: str, broker_id: int, ts_ms: int
) -> bytes:
    return "|".join((op, cluster, addr, broker_name, str(broker_id), str(ts_ms))).encode()


def sign(secret: str, payload: bytes) -> bytes:
    return hmac.new(secret.encode(), payload, hashlib.sha256).digest()


def verify(
    secret: str,
    payload: bytes,
    signature: bytes,
    ts_ms: int,
    *,
    now_ms: int | None = None,
    max_skew_ms: int = DEFAULT_MAX_SKEW_MS,
) -> None:
    """Raise ``SignatureInvalid`` unless ``signature`` is valid and fresh."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if not signature:
        raise SignatureInvalid("registration is not signed but the cluster requires a secret")
    if abs(now_ms - ts_ms) > max_skew_ms:
        raise SignatureInvalid(f"registration timestamp is {abs(now_ms - ts_ms)} ms off")
    if not hmac.compare_digest(sign(secret, payload), signature):
        raise SignatureInvalid("registration signature does not match the cluster secret")
