"""A client's credentials: an ACL user's access key and secret key, and how a client
signs its requests with them.

Every request carries ``RequestBody.authInfo``: the access key, a timestamp, a
numbered nonce (:class:`ha_controller.auth.NumberedNonces`: one random session per
:class:`Credentials` object, a counter per request) and an HMAC-SHA256 over the
method, timestamp, nonce and the whole request body, keyed with a key derived from
the secret key (:func:`ha_controller.auth.request_mac`, the same code that signs the
cluster's control plane).  A receiver refuses a copy of a request it served
(:mod:`ha_controller.acl.replay`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ha_controller.auth import NumberedNonces, derive_key, request_mac, wall_ms
from ha_controller.protocol.envelope import RequestAuth

__all__ = ["Credentials", "user_key"]


def user_key(secret_key: str) -> bytes:
    """The signing key of an ACL user (derived from its secret key)."""
    return derive_key(secret_key, b"acl/v1")


@dataclass(frozen=True)
class Credentials:
    """An ACL user's access key and secret key, as a client holds them.

    ``sign`` is the :data:`~ha_controller.rpc.Signer` of a client's connection pool:
    every request is signed.  The secret key never appears in ``repr``."""

    access_key: str
    secret_key: str = field(repr=False)
    _key: bytes = field(init=False, repr=False, compare=False)
    _nonces: NumberedNonces = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ValueError("credentials need a non-empty access key and secret key")
        object.__setattr__(self, "_key", user_key(self.secret_key))
        object.__setattr__(self, "_nonces", NumberedNonces())

    def sign(self, method: int, body: bytes, *, now_ms: int | None = None) -> RequestAuth:
        ts = wall_ms() if now_ms is None else now_ms
        nonce = self._nonces.next()
        mac = request_mac(self._key, method, ts, nonce, body)
        return RequestAuth(ts, nonce, mac, self.access_key)

    @classmethod
    def maybe(cls, access_key: str | None, secret_key: str | None) -> Credentials | None:
        """Credentials from optional settings: None when neither is set; a
        ``ValueError`` naming the missing one when only one is."""
        if not access_key and not secret_key:
            return None
        if not access_key:
            raise ValueError("a secret key was given without an access key")
        if not secret_key:
            raise ValueError(f"access key {access_key!r} was given without its secret key")
        return cls(access_key, secret_key)
