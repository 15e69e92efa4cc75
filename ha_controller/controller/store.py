"""The controller's two uses of etcd: the groups' states, each changed only by a
compare-and-swap on the revision it was read at (:class:`GroupStore`), and which
nameserver leads the controller role, by a key held with a lease
(:class:`Leadership`).

Keys (``prefix`` is ``etcd_prefix``, ``/hac`` by default)::

    {prefix}/groups/{cluster}/{group}   a GroupState as JSON
    {prefix}/controller/leader          the leading nameserver's id, with its lease
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ha_controller.controller.etcd import EtcdClient
from ha_controller.controller.state import GroupState, group_key
from ha_controller.protocol.errors import EtcdUnavailable

__all__ = ["GroupStore", "Leadership", "Stored"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Stored:
    """A group's state and the etcd revision it was read (or written) at."""

    state: GroupState
    revision: int


class GroupStore:
    """The groups' states in etcd."""

    def __init__(self, etcd: EtcdClient, prefix: str = "/hac") -> None:
        self.etcd = etcd
        self.prefix = prefix.rstrip("/")

    async def load_all(self) -> dict[tuple[str, str], Stored]:
        """Every group's state (one linearizable range read).  A value that is not a
        group state is skipped with a line (someone else's key under our prefix)."""
        out: dict[tuple[str, str], Stored] = {}
        for kv in await self.etcd.get_prefix(f"{self.prefix}/groups/"):
            try:
                state = GroupState.from_json(kv.value)
            except ValueError as exc:
                log.error("etcd key %s: %s; ignored", kv.key, exc)
                continue
            out[(state.cluster, state.group)] = Stored(state, kv.mod_revision)
        return out

    async def load(self, cluster: str, group: str) -> Stored | None:
        kv = await self.etcd.get(group_key(self.prefix, cluster, group))
        if kv is None:
            return None
        try:
            return Stored(GroupState.from_json(kv.value), kv.mod_revision)
        except ValueError as exc:
            raise EtcdUnavailable(f"etcd key {kv.key}: {exc}") from exc

    async def write(self, state: GroupState, *, revision: int) -> Stored | None:
        """Write ``state`` if the group's value is still at ``revision`` (0: absent);
        None when another write came first (read again and decide again)."""
        key = group_key(self.prefix, state.cluster, state.group)
        result = await self.etcd.replace(key, state.to_json(), mod_revision=revision)
        if not result.succeeded:
            return None
        return Stored(state, result.revision)


class Leadership:
    """One nameserver leads the controller: the one whose lease holds the leader key.

    :meth:`step` campaigns (a transaction that creates the key only while it is
    absent) or renews the lease; ``leading`` is true only while the lease is surely
    alive: it is counted from *before* the last renewal that succeeded, and a little
    short of its TTL.  Leadership only keeps the timed decisions (elections) in one
    place; their safety is the compare-and-swap's.

    Each of its requests waits at most ``attempt_s`` (a third of the TTL) for one etcd
    member before it tries the next: a member cut off from the others (or still
    forwarding to a leader that is gone) holds a request for as long as the client
    waits, and with the client's own 2 s per member a renewal that met such a member
    first came back after the lease (or our trust in it) had run out, so the leader
    lost its role for as long as the member stayed cut off and elected no one."""

    def __init__(
        self, etcd: EtcdClient, node_id: str, *, prefix: str = "/hac", ttl_s: int = 3
    ) -> None:
        self.etcd = etcd
        self.node_id = node_id
        self.key = f"{prefix.rstrip('/')}/controller/leader"
        self.ttl_s = ttl_s
        #: how long one request waits for one etcd member
        self.attempt_s = ttl_s / 3
        self.lease = 0
        self._valid_until = 0.0
        self.leader: str | None = None

    @property
    def leading(self) -> bool:
        return self.lease != 0 and time.monotonic() < self._valid_until

    async def step(self) -> None:
        """Campaign or renew once (call every ``ttl_s / 3``); EtcdUnavailable passes."""
        started = time.monotonic()
        if self.lease:
            ttl = await self.etcd.keep_alive(self.lease, timeout_s=self.attempt_s)
            if ttl > 0:
                self._valid_until = started + ttl * 0.8
                return
            log.warning("controller leadership lost: the lease expired")
            self.lease = 0
        kv = await self.etcd.get(self.key, timeout_s=self.attempt_s)
        if kv is not None:
            self.leader = kv.value
            return
        lease = await self.etcd.grant(self.ttl_s, timeout_s=self.attempt_s)
        result = await self.etcd.replace(
            self.key, self.node_id, mod_revision=0, lease=lease, timeout_s=self.attempt_s
        )
        if result.succeeded:
            self.lease = lease
            self._valid_until = started + self.ttl_s * 0.8
            self.leader = self.node_id
            log.info("controller leadership taken by %s", self.node_id)
            return
        await self.etcd.revoke(lease, timeout_s=self.attempt_s)
        kv = await self.etcd.get(self.key, timeout_s=self.attempt_s)
        self.leader = None if kv is None else kv.value

    async def resign(self) -> None:
        if self.lease:
            lease, self.lease = self.lease, 0
            try:
                await self.etcd.revoke(lease)
            except EtcdUnavailable as exc:
                log.info("controller leadership not handed back (%s): it expires", exc)
