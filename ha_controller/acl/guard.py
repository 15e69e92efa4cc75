"""The dispatcher guard of a nameserver or broker: cluster authentication (the control
plane, :mod:`ha_controller.auth`), group-name checks, then the client ACL, all before
the handler runs, so a refused request changes nothing.

Who a request is authorised as:

- signed with the cluster secret by a member (``ctx.authenticated``): the cluster,
  which passes;
- signed with the cluster secret by a gateway for one of its clients
  (``ctx.on_behalf``): that user, from the client's address the gateway saw;
- signed by an ACL user: that user, from the connection's address;
- unsigned: anonymous (refused when anonymous access is off).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ha_controller.acl.authorizer import Acl, peer_ip
from ha_controller.acl.model import User
from ha_controller.acl.rules import GROUP_CODES, MAYBE_MEMBERS_ONLY, HalfTopic, Need, need_of
from ha_controller.auth import ClusterAuth
from ha_controller.protocol.errors import AccessDenied, BadRequest
from ha_controller.protocol.topics import group_name_problem

if TYPE_CHECKING:
    from ha_controller.rpc.connection import Guard, RequestContext

__all__ = ["check_groups", "guard"]

#: the replay-window key of a gateway's requests for its clients (one per gateway
#: session, shared by all gateways: their sessions are told apart by the nonce)
ON_BEHALF_KEY = "\0on-behalf"


def check_groups(need: Need, *, allow_reserved: bool = False) -> None:
    """Refuse (``BadRequest``) a request that names a group RocketMQ would refuse
    (``allow_reserved``: the brokers' own groups pass, for a cluster member)."""
    for check in need.checks:
        if check.resource.type.value == "Group":
            problem = group_name_problem(check.resource.name, allow_reserved=allow_reserved)
            if problem is not None:
                raise BadRequest(problem)


def guard(cluster: ClusterAuth, acl: Acl, *, half_topic: HalfTopic | None = None) -> Guard:
    """The guard of a service.  ``half_topic`` (a broker's transaction service) tells
    END_TRANSACTION's real topic."""

    def check(ctx: RequestContext, body: bytes) -> None:
        cluster.check(ctx, body)
        method = ctx.method
        need: Need | None = None
        if method in GROUP_CODES:
            need = need_of(method, body)
            check_groups(need, allow_reserved=ctx.authenticated)
        if not acl.enabled or ctx.authenticated:
            return
        try:
            user: User | None
            if ctx.on_behalf is not None:
                name, source = ctx.on_behalf
                user = acl.user_on_behalf(method, name)
                assert ctx.auth is not None
                acl.check_replay(method, ON_BEHALF_KEY, ctx.auth)
                ip = peer_ip(source)
            else:
                user = acl.authenticate(method, body, ctx.auth)
                ip = peer_ip(ctx.peer)
            if user is not None:
                ctx.acl_user, ctx.acl_ip = user.username, ip
            if user is None or (user.is_super and method not in MAYBE_MEMBERS_ONLY):
                return  # anonymous (allowed) or Super: nothing to match
            if need is None:
                need = need_of(method, body, half_topic=half_topic)
            acl.authorize(method, user, need, ip)
        except AccessDenied as exc:
            acl.log_denied(ctx.peer, exc)
            raise

    return check
