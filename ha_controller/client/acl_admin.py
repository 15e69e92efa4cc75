"""Admin client for ACL 2.0: users and their policy entries, changed at runtime
(``hactl user ...``, ``hactl acl ...``; Super users only).

A change goes to one broker, the *coordinator*: the id 0 of the cluster's first
broker group by name (its master, or the slave acting for it), which makes it the
next revision of the table and spreads it (see docs/security.md).  Every node then
holds that revision within about a second; :meth:`AclAdmin.wait_everywhere` asks each
of them until they do.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf.message import Message

from ha_controller.acl.model import PolicyEntry, subject_of
from ha_controller.acl.wire import entries_from_pb, entry_to_pb
from ha_controller.client.admin import BROKER_ADMIN_TIMEOUT_MS, NameserverClient
from ha_controller.proto import acl_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import HaError, NotMaster
from ha_controller.rpc.connection import M

__all__ = ["AclAdmin", "Spread", "UserInfo"]


@dataclass(frozen=True)
class UserInfo:
    """A user as admins see it (never its secret key)."""

    username: str
    user_type: str
    status: str


@dataclass(frozen=True)
class Spread:
    """Which nodes hold a revision (or a newer one) after a change."""

    revision: int
    holding: list[str]
    behind: list[str]


class AclAdmin:
    """Users and ACLs through a :class:`NameserverClient` (its pool, TLS and
    credentials: a Super user's)."""

    def __init__(self, ns: NameserverClient, *, cluster: str | None = None) -> None:
        self.ns = ns
        self.cluster = cluster

    async def coordinator(self) -> str:
        """The address changes go to: the lowest id of the first group by name."""
        groups = sorted(
            (
                g
                for g in await self.ns.groups()
                if g.members and (not self.cluster or g.cluster == self.cluster)
            ),
            key=lambda g: (g.cluster, g.broker_name),
        )
        if not groups:
            raise NotMaster("no broker group is online to take the change")
        g = groups[0]
        return g.members[min(g.members)]

    async def _change(self, method: int, request: Message) -> int:
        addr = await self.coordinator()
        answer = await self.ns.pool.call_pb(
            addr, method, request, acl_pb2.AclChange, BROKER_ADMIN_TIMEOUT_MS
        )
        return int(answer.revision)

    # ---- users -----------------------------------------------------------------------

    async def create_user(
        self, username: str, secret_key: str, *, user_type: str = "Normal", status: str = ""
    ) -> int:
        user = acl_pb2.AclUser(
            username=username, password=secret_key, user_type=user_type, user_status=status
        )
        return await self._change(RequestCode.AUTH_CREATE_USER, acl_pb2.UserRequest(user=user))

    async def update_user(
        self,
        username: str,
        *,
        secret_key: str = "",
        user_type: str = "",
        status: str = "",
    ) -> int:
        user = acl_pb2.AclUser(
            username=username, password=secret_key, user_type=user_type, user_status=status
        )
        return await self._change(RequestCode.AUTH_UPDATE_USER, acl_pb2.UserRequest(user=user))

    async def delete_user(self, username: str) -> int:
        return await self._change(
            RequestCode.AUTH_DELETE_USER, acl_pb2.UserQuery(username=username)
        )

    async def users(self, name_filter: str = "", *, addr: str | None = None) -> list[UserInfo]:
        got = await self._read(
            addr,
            RequestCode.AUTH_LIST_USER,
            acl_pb2.UserQuery(filter=name_filter),
            acl_pb2.UserList,
        )
        return [UserInfo(u.username, u.user_type, u.user_status) for u in got.users]

    async def user(self, username: str) -> UserInfo:
        got = await self._read(
            None, RequestCode.AUTH_GET_USER, acl_pb2.UserQuery(username=username), acl_pb2.UserList
        )
        u = got.users[0]
        return UserInfo(u.username, u.user_type, u.user_status)

    # ---- ACLs ------------------------------------------------------------------------

    async def create_acl(self, subject: str, entries: Sequence[PolicyEntry]) -> int:
        return await self._change(RequestCode.AUTH_CREATE_ACL, _acl_request(subject, entries))

    async def update_acl(self, subject: str, entries: Sequence[PolicyEntry]) -> int:
        return await self._change(RequestCode.AUTH_UPDATE_ACL, _acl_request(subject, entries))

    async def delete_acl(self, subject: str, resource: str = "") -> int:
        return await self._change(
            RequestCode.AUTH_DELETE_ACL, acl_pb2.AclQuery(subject=subject, resource=resource)
        )

    async def acl(self, subject: str) -> list[PolicyEntry]:
        got = await self._read(
            None, RequestCode.AUTH_GET_ACL, acl_pb2.AclQuery(subject=subject), acl_pb2.AclList
        )
        return entries_from_pb(got.acls[0].entries) if got.acls else []

    async def acls(
        self, subject_filter: str = "", resource_filter: str = ""
    ) -> dict[str, list[PolicyEntry]]:
        got = await self._read(
            None,
            RequestCode.AUTH_LIST_ACL,
            acl_pb2.AclQuery(subject_filter=subject_filter, resource_filter=resource_filter),
            acl_pb2.AclList,
        )
        return {subject_of(a.subject): entries_from_pb(a.entries) for a in got.acls}

    async def _read(self, addr: str | None, method: int, request: Message, response: type[M]) -> M:
        target = addr or await self.coordinator()
        return await self.ns.pool.call_pb(
            target, method, request, response, BROKER_ADMIN_TIMEOUT_MS
        )

    # ---- where a change is in effect ---------------------------------------------------

    async def revision_at(self, addr: str) -> int:
        got = await self.ns.pool.call_pb(
            addr,
            RequestCode.AUTH_LIST_USER,
            acl_pb2.UserQuery(filter="\0"),  # no user matches: only the revision
            acl_pb2.UserList,
            BROKER_ADMIN_TIMEOUT_MS,
        )
        return int(got.revision)

    async def nodes(self) -> list[str]:
        """Every broker (of the cluster) and every nameserver."""
        brokers = sorted(
            {
                addr
                for g in await self.ns.groups()
                if not self.cluster or g.cluster == self.cluster
                for addr in g.members.values()
            }
        )
        return [*brokers, *self.ns.addrs]

    async def wait_everywhere(self, revision: int, timeout_s: float = 5.0) -> Spread:
        """Ask every node until each holds ``revision`` or newer (or ``timeout_s``)."""
        nodes = await self.nodes()
        holding: set[str] = set()
        deadline = time.monotonic() + timeout_s

        async def ask(addr: str) -> None:
            try:
                if await self.revision_at(addr) >= revision:
                    holding.add(addr)
            except HaError:
                pass

        while True:
            await asyncio.gather(*(ask(a) for a in nodes if a not in holding))
            if len(holding) == len(nodes) or time.monotonic() >= deadline:
                break
            await asyncio.sleep(0.05)
        return Spread(
            revision, [a for a in nodes if a in holding], [a for a in nodes if a not in holding]
        )


def _acl_request(subject: str, entries: Sequence[PolicyEntry]) -> acl_pb2.AclRequest:
    return acl_pb2.AclRequest(subject=subject, entries=[entry_to_pb(e) for e in entries])
