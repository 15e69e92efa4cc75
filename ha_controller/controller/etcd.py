"""A small asyncio client of etcd v3 through its gRPC gateway (JSON over HTTP, served
by every etcd server at ``/v3/...``).

Why not a PyPI client: the gateway is etcd's own gRPC API (the same messages, as JSON),
served by every etcd since 3.3; it needs only aiohttp, which the project has, and no
second protobuf runtime or pinned generated stubs beside ours.  We use four things:
ranges, puts, transactions that compare a key's ``mod_revision`` (compare-and-swap),
and leases (grant, keep-alive, revoke) for the controller leadership.

Every call tries each endpoint once, in an order fixed when the call begins: first the
one that answered last, then the others in turn; it moves on at a connection error, a
5xx or when an endpoint has not answered within ``timeout_s`` (per attempt: a member cut
off from the others, or one still forwarding to a leader that is gone, holds a request
until then).  An endpoint that fails is passed over by the calls that begin after it
(and by none that already tried it): calls run concurrently (the poll, the leadership
renewal, the elections), and one call's success must not send another back to the
endpoint it has just given up on.  All endpoints failing raise :class:`EtcdUnavailable`.
Keys and values are ``str`` (UTF-8); base64 is the gateway's and stays here.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from ha_controller.protocol.errors import EtcdUnavailable

log = logging.getLogger(__name__)

__all__ = ["EtcdClient", "EtcdUnavailable", "KeyValue", "TxnResult"]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _unb64(text: str) -> str:
    return base64.b64decode(text).decode()


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: str
    value: str
    mod_revision: int
    lease: int = 0


@dataclass(frozen=True, slots=True)
class TxnResult:
    succeeded: bool
    #: the store's revision after the transaction
    revision: int


class EtcdClient:
    """etcd v3 over its JSON gateway; an async context manager."""

    def __init__(self, endpoints: Sequence[str], *, timeout_s: float = 2.0) -> None:
        if not endpoints:
            raise ValueError("etcd needs at least one endpoint")
        self.endpoints = [e if "://" in e else f"http://{e}" for e in endpoints]
        self.timeout_s = timeout_s
        self._next = 0
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _call(
        self, path: str, body: dict[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        """One request, on each endpoint at most once (the module's docstring);
        ``timeout_s`` bounds each attempt (default: the client's)."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        attempt = aiohttp.ClientTimeout(total=self.timeout_s if timeout_s is None else timeout_s)
        n = len(self.endpoints)
        first = self._next  # this call's order, whatever the calls beside it do
        problems: list[str] = []
        for i in range(n):
            k = (first + i) % n
            url = f"{self.endpoints[k]}/v3/{path}"
            try:
                async with self._session.post(url, data=json.dumps(body), timeout=attempt) as resp:
                    text = await resp.text()
                    if resp.status >= 500:
                        problems.append(f"{self.endpoints[k]}: HTTP {resp.status} {text[:200]}")
                        self._passed_over(k)
                        continue
                    data = json.loads(text) if text else {}
                    if resp.status != 200 or "error" in data:
                        raise EtcdUnavailable(
                            f"etcd {path} refused by {self.endpoints[k]}: "
                            f"{data.get('error') or data.get('message') or text[:200]}"
                        )
                    self._next = k
                    return dict(data)
            except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as exc:
                problems.append(f"{self.endpoints[k]}: {type(exc).__name__}: {exc}")
                self._passed_over(k)
        raise EtcdUnavailable("no etcd endpoint answered: " + "; ".join(problems))

    def _passed_over(self, k: int) -> None:
        """Endpoint ``k`` failed: calls that begin from now on start at the next one
        (unless another call has already found a better one)."""
        if self._next == k:
            self._next = (k + 1) % len(self.endpoints)

    # ---- keys ------------------------------------------------------------------------

    async def get(self, key: str, *, timeout_s: float | None = None) -> KeyValue | None:
        data = await self._call("kv/range", {"key": _b64(key)}, timeout_s=timeout_s)
        kvs = data.get("kvs") or []
        return _kv(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        end = prefix[:-1] + chr(ord(prefix[-1]) + 1)
        data = await self._call("kv/range", {"key": _b64(prefix), "range_end": _b64(end)})
        return [_kv(kv) for kv in data.get("kvs") or []]

    async def put(self, key: str, value: str, *, lease: int = 0) -> int:
        body: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            body["lease"] = str(lease)
        data = await self._call("kv/put", body)
        return int(data["header"]["revision"])

    async def replace(
        self,
        key: str,
        value: str,
        *,
        mod_revision: int,
        lease: int = 0,
        timeout_s: float | None = None,
    ) -> TxnResult:
        """Put ``value`` only while ``key`` is at ``mod_revision`` (0: absent)."""
        put: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = str(lease)
        compare = {
            "key": _b64(key),
            "target": "MOD",
            "result": "EQUAL",
            "mod_revision": str(mod_revision),
        }
        data = await self._call(
            "kv/txn",
            {"compare": [compare], "success": [{"request_put": put}]},
            timeout_s=timeout_s,
        )
        return TxnResult(bool(data.get("succeeded")), int(data["header"]["revision"]))

    async def delete(self, key: str) -> None:
        await self._call("kv/deleterange", {"key": _b64(key)})

    # ---- leases -----------------------------------------------------------------------

    async def grant(self, ttl_s: int, *, timeout_s: float | None = None) -> int:
        data = await self._call("lease/grant", {"TTL": str(ttl_s)}, timeout_s=timeout_s)
        return int(data["ID"])

    async def keep_alive(self, lease: int, *, timeout_s: float | None = None) -> int:
        """Renew ``lease``; its TTL left (0: it had expired)."""
        data = await self._call("lease/keepalive", {"ID": str(lease)}, timeout_s=timeout_s)
        result = data.get("result") or {}
        return int(result.get("TTL") or 0)

    async def revoke(self, lease: int, *, timeout_s: float | None = None) -> None:
        await self._call("lease/revoke", {"ID": str(lease)}, timeout_s=timeout_s)

    async def status(self) -> dict[str, Any]:
        return await self._call("maintenance/status", {})


def _kv(raw: dict[str, Any]) -> KeyValue:
    return KeyValue(
        _unb64(raw["key"]),
        _unb64(raw.get("value", "")),
        int(raw.get("mod_revision", 0)),
        int(raw.get("lease", 0)),
    )


async def wait_for(client: EtcdClient, timeout_s: float = 10.0) -> None:
    """Until etcd answers (a starting server)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        try:
            await client.status()
            return
        except EtcdUnavailable:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.1)
