"""The broker's topic configs with their DataVersion, persisted as JSON."""

from __future__ import annotations

import json
from pathlib import Path

from broker_agent.metadata.offsets import write_json_atomic
from ha_controller.dataversion import DataVersion
from ha_controller.protocol.errors import BadRequest, StoreError
from ha_controller.protocol.topics import topic_name_problem
from ha_controller.routing import Perm, TopicConfig


def check_name(topic: str) -> None:
    """BadRequest unless ``topic`` is a well-formed name (reserved prefixes pass: the
    broker makes its own system, retry and dead-letter topics)."""
    problem = topic_name_problem(topic, allow_reserved=True)
    if problem is not None:
        raise BadRequest(problem)


class TopicConfigManager:
    def __init__(self, path: Path | None, default_queue_nums: int = 4) -> None:
        self.path = path
        self.default_queue_nums = default_queue_nums
        self.topics: dict[str, TopicConfig] = {}
        self.data_version = DataVersion()

    def load(self) -> None:
        """Read the table; StoreError (one line naming the file) when it is corrupt."""
        if self.path is None or not self.path.exists():
            return
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            topics = {t["topicName"]: TopicConfig.from_json(t) for t in data["topics"]}
            version = DataVersion.from_dict(data["dataVersion"])
        except (OSError, UnicodeDecodeError) as exc:
            raise StoreError(f"cannot read the topic table {self.path}: {exc}") from exc
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            what = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
            raise StoreError(
                f"corrupt topic table {self.path} ({type(exc).__name__}: {what}); "
                "repair it or restore it from another broker of the group"
            ) from exc
        self.topics = topics
        self.data_version = version

    def persist(self) -> None:
        if self.path is None:
            return
        write_json_atomic(
            self.path,
            {
                "topics": [self.topics[n].to_json() for n in sorted(self.topics)],
                "dataVersion": self.data_version.to_dict(),
            },
        )

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
        self.data_version.next_version()
        self.persist()
        return True

    def delete(self, topic: str) -> TopicConfig | None:
        """Forget a topic (its messages stay in the store); the removed config, or None
        when there was none (the version moves only when one was removed)."""
        config = self.topics.pop(topic, None)
        if config is not None:
            self.data_version.next_version()
            self.persist()
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
