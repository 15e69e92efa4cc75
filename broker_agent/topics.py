"""The broker's topic configs with their DataVersion, persisted as JSON."""

from __future__ import annotations

import json
from pathlib import Path

from broker_agent.metadata.offsets import write_json_atomic
from ha_controller.dataversion import DataVersion
from ha_controller.routing import Perm, TopicConfig


class TopicConfigManager:
    def __init__(self, path: Path | None, default_queue_nums: int = 4) -> None:
        self.path = path
        self.default_queue_nums = default_queue_nums
        self.topics: dict[str, TopicConfig] = {}
        self.data_version = DataVersion()

    def load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        data = json.loads(self.path.read_text())
        self.topics = {t["topicName"]: TopicConfig.from_json(t) for t in data["topics"]}
        self.data_version = DataVersion.from_dict(data["dataVersion"])

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
        """Create or update a topic; True when it changed (the version moves)."""
        if self.topics.get(config.topic_name) == config:
            return False
        self.topics[config.topic_name] = config
        self.data_version.next_version()
        self.persist()
        return True

    def auto_create(self, topic: str) -> TopicConfig:
        config = TopicConfig(
            topic, self.default_queue_nums, self.default_queue_nums, Perm.READ | Perm.WRITE
        )
        self.upsert(config)
        return config
