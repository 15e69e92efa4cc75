"""The broker's copy of the ACL 2.0 table (``acl.json`` in the store directory).

The table (:mod:`ha_controller.acl`) is the cluster's, not the group's: each broker
keeps a copy, written atomically, with a digest checked when read.  It travels like
the other versioned tables (a slave's forward sync, a returning master's pre-online:
:func:`acl_table_sync`) and is pushed by the nameservers; it only ever moves to a newer
table (``(revision, digest)``), so a sync never brings back a revoked user — not even
a replacement after a cut, which takes every other table as the slave has it.

A copy that cannot be read (damaged, not JSON, a digest that does not match) is set
aside as ``acl.json.corrupt`` with one ERROR line naming it; the broker starts from
its users file and takes the cluster's table from the first member that has it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker_agent.metadata.json_table import JsonTable, write_json_atomic
from broker_agent.metadata.versioned import TableSync
from ha_controller.acl import AclHolder, AclTable
from ha_controller.acl.sync import answered_table
from ha_controller.proto import acl_pb2
from ha_controller.protocol.codes import RequestCode

FILE_NAME = "acl.json"

__all__ = ["FILE_NAME", "AclTableFile", "acl_table_sync", "load_table", "persister"]


class AclTableFile(JsonTable):
    """The stored copy over ``bootstrap`` (the users file): :attr:`table` is the newer."""

    what = "ACL table"
    rebuilt_from = "starting from the users file until a cluster member provides the current table"

    def __init__(self, store_dir: Path, bootstrap: AclTable) -> None:
        super().__init__(store_dir / FILE_NAME)
        self.bootstrap = bootstrap
        self.table = bootstrap

    def restore(self, data: Any) -> None:
        stored = AclTable.from_dict(data)  # AclInvalid (a ValueError) when damaged
        newer = stored.revision >= 1 and stored.newer_than(self.bootstrap)
        self.table = stored if newer else self.bootstrap

    def start_over(self) -> None:
        # the users file is revision 0: any runtime table a member holds outranks it
        self.table = self.bootstrap

    def payload(self) -> dict[str, Any]:
        return self.table.to_dict()


def load_table(store_dir: Path, bootstrap: AclTable) -> AclTable:
    """The newer of the stored copy and ``bootstrap`` (the users file)."""
    file = AclTableFile(store_dir, bootstrap)
    file.load()
    return file.table


def persister(store_dir: Path) -> Callable[[AclTable], None]:
    path = store_dir / FILE_NAME

    def persist(table: AclTable) -> None:
        write_json_atomic(path, table.to_dict())

    return persist


def acl_table_sync(holder: AclHolder) -> TableSync[acl_pb2.AclTableAnswer, AclTable | None]:
    """The table for forward and reverse sync: the query carries the table we hold, the
    answer only a newer one (None otherwise), and every direction only offers it to the
    holder, which takes it when newer (a cut's replacement too)."""

    def take(snapshot: AclTable | None) -> bool:
        return snapshot is not None and holder.offer(snapshot)

    def describe(snapshot: AclTable | None) -> str:
        if snapshot is None:
            return f"not newer than ours (revision {holder.key()[0]})"
        return f"revision {snapshot.revision}, {len(snapshot.users)} users"

    def query() -> acl_pb2.AclTableQuery:
        revision, digest = holder.key()
        return acl_pb2.AclTableQuery(revision=revision, digest=digest)

    return TableSync(
        "ACL table",
        RequestCode.GET_ACL_TABLE,
        acl_pb2.AclTableAnswer,
        decode=answered_table,
        take=take,
        adopt=take,
        describe=describe,
        busy=lambda: False,
        request=query,
    )
