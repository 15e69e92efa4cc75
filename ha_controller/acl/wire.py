"""The ACL table and its admin requests on the wire (``acl.proto``), converted once."""

from __future__ import annotations

from collections.abc import Iterable

from ha_controller.acl.model import AclTable, PolicyEntry, User
from ha_controller.proto import acl_pb2

__all__ = [
    "entries_from_pb",
    "entry_to_pb",
    "subject_to_pb",
    "table_from_pb",
    "table_to_pb",
    "user_to_pb",
]


def user_to_pb(user: User, *, secrets: bool) -> acl_pb2.AclUser:
    return acl_pb2.AclUser(
        username=user.username,
        password=user.password if secrets else "",
        user_type=user.user_type.value,
        user_status=user.status.value,
    )


def entry_to_pb(entry: PolicyEntry) -> acl_pb2.AclPolicyEntry:
    d = entry.to_dict()
    return acl_pb2.AclPolicyEntry(
        resource=d["resource"],
        actions=d["actions"],
        source_ips=d["source_ips"],
        decision=d["decision"],
    )


def entries_from_pb(entries: Iterable[acl_pb2.AclPolicyEntry]) -> list[PolicyEntry]:
    """Entries as an admin sent them (``AclInvalid`` naming a bad one)."""
    return [
        PolicyEntry.from_dict(
            {
                "resource": e.resource,
                "actions": list(e.actions),
                "source_ips": list(e.source_ips),
                "decision": e.decision or "Allow",
            }
        )
        for e in entries
    ]


def subject_to_pb(username: str, entries: Iterable[PolicyEntry]) -> acl_pb2.AclSubject:
    return acl_pb2.AclSubject(subject=f"User:{username}", entries=[entry_to_pb(e) for e in entries])


def table_to_pb(table: AclTable) -> acl_pb2.AclTable:
    """The whole table, secret keys included (cluster members only)."""
    return acl_pb2.AclTable(
        revision=table.revision,
        digest=table.digest,
        users=[user_to_pb(table.users[u], secrets=True) for u in sorted(table.users)],
        acls=[subject_to_pb(s, table.acls[s]) for s in sorted(table.acls)],
        updated_ms=table.updated_ms,
    )


def table_from_pb(pb: acl_pb2.AclTable) -> AclTable:
    """A table a member sent; ``AclInvalid`` when it is not well formed or its digest
    does not match its content."""
    return AclTable.from_dict(
        {
            "revision": pb.revision,
            "updated_ms": pb.updated_ms,
            "digest": pb.digest,
            "users": [
                {
                    "username": u.username,
                    "password": u.password,
                    "user_type": u.user_type,
                    "user_status": u.user_status,
                }
                for u in pb.users
            ],
            "acls": {
                s.subject: [
                    {
                        "resource": e.resource,
                        "actions": list(e.actions),
                        "source_ips": list(e.source_ips),
                        "decision": e.decision,
                    }
                    for e in s.entries
                ]
                for s in pb.acls
            },
        }
    )
