"""The broker's topic configs with their DataVersion, persisted as JSON.

Topics are created on the masters (``hactl topic create``, auto-creation on a first
send, the special services' own topics); a slave takes its master's in the forward
sync (``.forward``, only adding: a topic the master deleted stays on its slaves) and a
returning master takes a slave's in pre-online when its own table was lost or is older
(:meth:`TopicConfigManager.adopt`).  Only a replica has a lost table
(``Recovery.REPLICA``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from broker_agent.metadata.json_table import JsonTable, Recovery, oldest
from ha_controller.dataversion import DataVersion
from ha_controller.protocol.errors import BadRequest
from ha_controller.protocol.topics import reserved_prefix, topic_name_problem
from ha_controller.routing import Perm, TopicConfig

__all__ = ["TopicConfigManager", "check_name"]

log = logging.getLogger(__name__)


def check_name(topic: str) -> None:
    """BadRequest unless ``topic`` is a well-formed name (reserved prefixes pass: the
    broker makes its own system, retry and dead-letter topics)."""
    problem = topic_name_problem(topic, allow_reserved=True)
    if problem is not None:
        raise BadRequest(problem)


class TopicConfigManager(JsonTable):
    what = "topic table"
    recovery = Recovery.REPLICA
    repair = (
        "repair it, or move it away to start with an empty table and create the topics "
        "again (hactl topic create); a broker with replicas takes them from one"
    )

    def __init__(self, path: Path | None, default_queue_nums: int = 4) -> None:
        super().__init__(path)
        self.default_queue_nums = default_queue_nums
        self.topics: dict[str, TopicConfig] = {}
        self.data_version = DataVersion()

    def restore(self, data: Any) -> None:
        topics = {t["topicName"]: TopicConfig.from_json(t) for t in data["topics"]}
        self.data_version = DataVersion.from_dict(data["dataVersion"])
        self.topics = topics

    def start_over(self) -> None:
        self.topics = {}
        self.data_version = oldest()

    def payload(self) -> dict[str, Any]:
        return {
            "topics": [self.topics[n].to_json() for n in sorted(self.topics)],
            "dataVersion": self.data_version.to_dict(),
        }

    def _changed(self) -> None:
        self.data_version.next_version()
        self._dirty = True
        self.persist()

    def get(self, topic: str) -> TopicConfig | None:
        return self.topics.get(topic)

    def upsert(self, config: TopicConfig) -> bool:
        """Create or update a topic; True when it changed (the version moves).

        Names are not checked here: the entry points from clients are (the admin
        request's handler, :meth:`auto_create`); what a slave copies from its master
        or a special service creates is taken as it is."""
        if self.topics.get(config.topic_name) == config:
            return False
        self.topics[config.topic_name] = config
        self._changed()
        return True

    def delete(self, topic: str) -> TopicConfig | None:
        """Forget a topic (its messages stay in the store); the removed config, or None
        when there was none (the version moves only when one was removed)."""
        config = self.topics.pop(topic, None)
        if config is not None:
            self._changed()
        return config

    def auto_create(self, topic: str) -> TopicConfig:
        """The default config for a topic first seen in a send; BadRequest, before
        anything is persisted, for a malformed name."""
        check_name(topic)
        config = TopicConfig(
            topic, self.default_queue_nums, self.default_queue_nums, Perm.READ | Perm.WRITE
        )
        self.upsert(config)
        return config

    def cover_queues(self, stored: dict[str, list[int]]) -> list[str]:
        """Give every topic the log holds messages of a config when it has none (a
        slave promoted master before its periodic sync brought the master's newest
        topics): the default queue count, or more to cover every queue that holds
        messages.  The brokers' own topics are left out.  Returns the names added."""
        added: list[str] = []
        for topic, queue_ids in sorted(stored.items()):
            if topic in self.topics or reserved_prefix(topic, group_topics=False) is not None:
                continue
            n = max(self.default_queue_nums, max(queue_ids, default=0) + 1)
            self.topics[topic] = TopicConfig(topic, n, n, Perm.READ | Perm.WRITE)
            added.append(topic)
        if added:
            self._changed()
        return added

    # ---- sync ------------------------------------------------------------------------

    def take_from_master(self, theirs: Iterable[TopicConfig], version: DataVersion) -> bool:
        """Forward sync on a slave: add or update the master's topics (never delete) and
        take its version; True when anything changed."""
        changed = False
        for config in theirs:
            changed |= self.upsert(config)
        if changed:
            self.data_version.assign(version)
            self._dirty = True
            self.persist()
        return changed

    def adopt(
        self, theirs: Sequence[TopicConfig], version: DataVersion, *, add_missing: bool
    ) -> list[str]:
        """Take a slave's topics where they are the better knowledge (pre-online);
        returns the names added or changed.

        A table with a newer version wins for every topic it holds.  An older one only
        adds the topics we lack, and only with ``add_missing`` (our own table was lost):
        slaves keep topics the master deleted (their sync only adds), so a master with its
        own table must not take them back.  A name the table refuses is skipped (logged)."""
        newer = version.compare(self.data_version) > 0
        changed: list[str] = []
        for t in theirs:
            if not (newer or (add_missing and self.get(t.topic_name) is None)):
                continue
            try:
                if self.upsert(t):
                    changed.append(t.topic_name)
            except BadRequest as exc:
                log.warning("pre-online: slave topic %r skipped: %s", t.topic_name, exc)
        return changed
