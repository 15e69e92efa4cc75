"""The broker's copy of the ACL 2.0 table (``acl.json`` in the store directory).

The table (:mod:`ha_controller.acl`) is the cluster's, not the group's: each broker
keeps a copy, written atomically, with a digest checked when read.  It travels like
the other versioned tables (a slave's forward sync, a returning master's pre-online:
:class:`AclTableSync`) and is pushed by the nameservers; it only ever moves to a newer
table (``(revision, digest)``), so a sync never brings back a revoked user.

A copy that cannot be read (damaged, not JSON, a digest that does not match) is set
aside as ``acl.json.corrupt`` with one ERROR line naming it; the broker starts from
its users file and takes the cluster's table from the first member that has it.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path

from broker_agent.metadata.offsets import write_json_atomic
from ha_controller.acl import AclHolder, AclInvalid, AclTable
from ha_controller.acl.sync import fetch_table
from ha_controller.rpc import ConnectionPool

log = logging.getLogger(__name__)

FILE_NAME = "acl.json"

__all__ = ["FILE_NAME", "AclTableSync", "load_table", "persister"]


def load_table(store_dir: Path, bootstrap: AclTable) -> AclTable:
    """The newer of the stored copy and ``bootstrap`` (the users file)."""
    path = store_dir / FILE_NAME
    if not path.exists():
        return bootstrap
    try:
        stored = AclTable.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, AclInvalid) as exc:
        aside = path.with_name(path.name + ".corrupt")
        os.replace(path, aside)
        log.error(
            "ACL table %s cannot be read (%s): set aside as %s; starting from the users "
            "file until a cluster member provides the current table",
            path,
            exc,
            aside.name,
        )
        return bootstrap
    return stored if stored.revision >= 1 and stored.newer_than(bootstrap) else bootstrap


def persister(store_dir: Path) -> Callable[[AclTable], None]:
    path = store_dir / FILE_NAME

    def persist(table: AclTable) -> None:
        write_json_atomic(path, table.to_dict())

    return persist


class AclTableSync:
    """The table as the sync loops see it (``VersionedTable``)."""

    name = "ACL table"

    def __init__(self, holder: AclHolder) -> None:
        self.holder = holder

    async def fetch(self, pool: ConnectionPool, addr: str) -> AclTable | None:
        return await fetch_table(pool, addr, self.holder.key())

    def assign(self, snapshot: AclTable | None) -> None:
        if snapshot is not None:
            self.holder.offer(snapshot)

    def adopt_if_newer(self, snapshot: AclTable | None) -> bool:
        return snapshot is not None and self.holder.offer(snapshot)

    def replace(self, snapshot: AclTable | None) -> None:
        # a table never moves back, not even for a master that lost its log
        self.assign(snapshot)

    def describe(self, snapshot: AclTable | None) -> str:
        if snapshot is None:
            return f"not newer than ours (revision {self.holder.key()[0]})"
        return f"revision {snapshot.revision}, {len(snapshot.users)} users"

    def busy(self) -> bool:
        return False
