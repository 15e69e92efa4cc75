"""The ACL's request handlers, on brokers and nameservers.

- ``AUTH_*_USER`` / ``AUTH_*_ACL`` (RocketMQ 5.3's codes, Super users only, the guard
  checks that): ``hactl user ...`` and ``hactl acl ...``.  A change is made on one
  broker (the *coordinator*: the id 0 of the cluster's first group by name, which
  ``hactl`` picks), becomes the next revision of its table, and is pushed from there
  to the nameservers, which push it to every broker they know (and gateways fetch it
  from them).  Reads are answered from the node's own table, without secret keys.
- ``GET_ACL_TABLE`` / ``PUT_ACL_TABLE``: the whole table between cluster members only
  (it holds the secret keys), so runtime changes need a ``cluster_secret``.

A change that is not well formed (an unknown action, a malformed resource pattern, a
user that exists already ...) is refused with one ``AclInvalid`` line and changes
nothing; so is one that would leave no enabled Super user (nobody could change the
table again).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ha_controller.acl.authorizer import Acl, AclHolder
from ha_controller.acl.model import (
    AclInvalid,
    AclTable,
    Resource,
    User,
    UserStatus,
    UserType,
    subject_of,
)
from ha_controller.acl.wire import (
    entries_from_pb,
    subject_to_pb,
    table_from_pb,
    table_to_pb,
    user_to_pb,
)
from ha_controller.proto import acl_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import Unauthorized
from ha_controller.rpc import Dispatcher, RequestContext

log = logging.getLogger(__name__)

__all__ = ["AclService", "caller_of"]


def caller_of(ctx: RequestContext) -> str:
    """Who sent a request, for the log."""
    if ctx.on_behalf is not None:
        return f"{ctx.on_behalf[0]} (via a gateway)"
    if ctx.auth is not None and ctx.auth.access_key:
        return ctx.auth.access_key[:64]
    return "a cluster member" if ctx.authenticated else f"anonymous {ctx.peer}"


def _keeps_a_super_user(table: AclTable) -> AclTable:
    if not any(u.is_super and u.enabled for u in table.users.values()):
        raise AclInvalid(
            "this change leaves no enabled Super user: nobody could change users or ACLs "
            "again (create or enable another Super user first)"
        )
    return table


class AclService:
    """Registers the ACL's handlers on ``dispatcher``.

    ``changes``: this node makes changes (a broker); ``on_change`` is told each table
    it made (the broker pushes it to the nameservers); ``cluster_enabled``: a cluster
    secret is set (without one, whole tables are never served)."""

    def __init__(
        self,
        acl: Acl,
        dispatcher: Dispatcher,
        *,
        cluster_enabled: bool,
        changes: bool,
        on_change: Callable[[AclTable], None] | None = None,
    ) -> None:
        self.acl = acl
        self.cluster_enabled = cluster_enabled
        self._on_change = on_change or (lambda table: None)
        add = dispatcher.add
        add(RequestCode.GET_ACL_TABLE, acl_pb2.AclTableQuery, self.get_table)
        add(RequestCode.PUT_ACL_TABLE, acl_pb2.AclTable, self.put_table)
        add(RequestCode.AUTH_GET_USER, acl_pb2.UserQuery, self.get_user)
        add(RequestCode.AUTH_LIST_USER, acl_pb2.UserQuery, self.list_users)
        add(RequestCode.AUTH_GET_ACL, acl_pb2.AclQuery, self.get_acl)
        add(RequestCode.AUTH_LIST_ACL, acl_pb2.AclQuery, self.list_acls)
        if changes:
            add(RequestCode.AUTH_CREATE_USER, acl_pb2.UserRequest, self.create_user)
            add(RequestCode.AUTH_UPDATE_USER, acl_pb2.UserRequest, self.update_user)
            add(RequestCode.AUTH_DELETE_USER, acl_pb2.UserQuery, self.delete_user)
            add(RequestCode.AUTH_CREATE_ACL, acl_pb2.AclRequest, self.create_acl)
            add(RequestCode.AUTH_UPDATE_ACL, acl_pb2.AclRequest, self.update_acl)
            add(RequestCode.AUTH_DELETE_ACL, acl_pb2.AclQuery, self.delete_acl)

    # ---- whole tables between members -----------------------------------------------

    def _members_only(self, ctx: RequestContext, what: str) -> None:
        if not ctx.authenticated:
            raise Unauthorized(
                f"{what} is for cluster members only (signed with the cluster_secret)"
            )

    async def get_table(
        self, ctx: RequestContext, req: acl_pb2.AclTableQuery
    ) -> acl_pb2.AclTableAnswer:
        self._members_only(ctx, "GET_ACL_TABLE")
        if not self.acl.enabled:
            return acl_pb2.AclTableAnswer(newer=False)
        table = self.acl.table
        revision, digest = table.key()
        answer = acl_pb2.AclTableAnswer(revision=revision, digest=digest)
        if table.revision >= 1 and table.newer_than((req.revision, req.digest)):
            answer.newer = True
            answer.table.CopyFrom(table_to_pb(table))
        return answer

    async def put_table(self, ctx: RequestContext, req: acl_pb2.AclTable) -> acl_pb2.AclChange:
        self._members_only(ctx, "PUT_ACL_TABLE")
        holder = self._holder()
        table = table_from_pb(req)
        holder.offer(table)
        revision, digest = holder.key()
        return acl_pb2.AclChange(revision=revision, digest=digest)

    # ---- changes ------------------------------------------------------------------------

    def _holder(self) -> AclHolder:
        holder = self.acl.holder
        if holder is None:
            raise AclInvalid("the ACL is not enabled on this node ([acl] enabled = true)")
        return holder

    def _change(
        self, ctx: RequestContext, what: str, make: Callable[[AclTable], AclTable]
    ) -> acl_pb2.AclChange:
        if not self.cluster_enabled:
            raise AclInvalid(
                "users and ACLs are changed at runtime only in a cluster with a "
                "cluster_secret (the whole table travels between members, signed)"
            )
        holder = self._holder()
        table = holder.change(lambda t: _keeps_a_super_user(make(t)))
        log.warning(
            "ACL change by %s: %s -> revision %d (%s)",
            caller_of(ctx),
            what,
            table.revision,
            table.digest[:12],
        )
        self._on_change(table)
        return acl_pb2.AclChange(revision=table.revision, digest=table.digest)

    async def create_user(self, ctx: RequestContext, req: acl_pb2.UserRequest) -> acl_pb2.AclChange:
        u = req.user
        user = User(
            subject_of(u.username),
            u.password,
            UserType.parse(u.user_type or "Normal", "user type"),
            UserStatus.parse(u.user_status or "enable", "user status"),
        )
        return self._change(ctx, f"create user {user.username}", lambda t: t.create_user(user))

    async def update_user(self, ctx: RequestContext, req: acl_pb2.UserRequest) -> acl_pb2.AclChange:
        u = req.user
        name = subject_of(u.username)
        if u.password:
            User(name, u.password)  # the password's own rules, before anything changes
        kind = UserType.parse(u.user_type, "user type") if u.user_type else None
        status = UserStatus.parse(u.user_status, "user status") if u.user_status else None
        return self._change(
            ctx,
            f"update user {name}",
            lambda t: t.update_user(
                name, password=u.password or None, user_type=kind, status=status
            ),
        )

    async def delete_user(self, ctx: RequestContext, req: acl_pb2.UserQuery) -> acl_pb2.AclChange:
        name = subject_of(req.username)
        return self._change(ctx, f"delete user {name}", lambda t: t.delete_user(name))

    async def create_acl(self, ctx: RequestContext, req: acl_pb2.AclRequest) -> acl_pb2.AclChange:
        name = subject_of(req.subject)
        entries = entries_from_pb(req.entries)
        if not entries:
            raise AclInvalid("create an ACL with at least one entry (--resource, --actions)")
        what = f"create ACL of {name}: " + ", ".join(e.resource.key() for e in entries)
        return self._change(ctx, what, lambda t: t.create_acl(name, entries))

    async def update_acl(self, ctx: RequestContext, req: acl_pb2.AclRequest) -> acl_pb2.AclChange:
        name = subject_of(req.subject)
        entries = entries_from_pb(req.entries)
        if not entries:
            raise AclInvalid("update an ACL with at least one entry (--resource, --actions)")
        what = f"update ACL of {name}: " + ", ".join(e.resource.key() for e in entries)
        return self._change(ctx, what, lambda t: t.update_acl(name, entries))

    async def delete_acl(self, ctx: RequestContext, req: acl_pb2.AclQuery) -> acl_pb2.AclChange:
        name = subject_of(req.subject)
        resource = Resource.parse(req.resource) if req.resource else None
        what = f"delete ACL of {name}" + (f": {resource.key()}" if resource else " (all)")
        return self._change(ctx, what, lambda t: t.delete_acl(name, resource))

    # ---- reads (no secret keys) ---------------------------------------------------------

    async def get_user(self, ctx: RequestContext, req: acl_pb2.UserQuery) -> acl_pb2.UserList:
        table = self._holder().table
        name = subject_of(req.username)
        user = table.users.get(name)
        if user is None:
            raise AclInvalid(f"user {name!r} does not exist")
        return acl_pb2.UserList(users=[user_to_pb(user, secrets=False)], revision=table.revision)

    async def list_users(self, ctx: RequestContext, req: acl_pb2.UserQuery) -> acl_pb2.UserList:
        table = self._holder().table
        users = [
            user_to_pb(table.users[n], secrets=False)
            for n in sorted(table.users)
            if req.filter in n
        ]
        return acl_pb2.UserList(users=users, revision=table.revision)

    async def get_acl(self, ctx: RequestContext, req: acl_pb2.AclQuery) -> acl_pb2.AclList:
        table = self._holder().table
        name = subject_of(req.subject)
        if name not in table.users:
            raise AclInvalid(f"user {name!r} does not exist")
        return acl_pb2.AclList(
            acls=[subject_to_pb(name, table.entries_of(name))], revision=table.revision
        )

    async def list_acls(self, ctx: RequestContext, req: acl_pb2.AclQuery) -> acl_pb2.AclList:
        table = self._holder().table
        out = []
        for name in sorted(table.acls):
            if req.subject_filter and req.subject_filter not in name:
                continue
            entries = [e for e in table.acls[name] if req.resource_filter in e.resource.key()]
            if entries:
                out.append(subject_to_pb(name, entries))
        return acl_pb2.AclList(acls=out, revision=table.revision)
