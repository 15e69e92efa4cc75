"""The persisted tables' one JSON file (``broker_agent.metadata.json_table``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from broker_agent.metadata.offsets import ConsumerOffsetManager
from broker_agent.special.schedule import DelayOffsetTable, RecallTable, TimerCheckpointFile


def test_a_write_that_failed_is_tried_again(tmp_path: Path) -> None:
    """A full or missing disk: the table stays changed and the next persist writes it
    (the consumer offsets used to forget that they had changed)."""
    path = tmp_path / "gone" / "consumer_offsets.json"
    table = ConsumerOffsetManager(path)
    table.commit("G", "T", 0, 7)
    with pytest.raises(OSError):
        table.persist()
    path.parent.mkdir()
    table.persist()
    again = ConsumerOffsetManager(path)
    again.load()
    assert again.query("G", "T", 0) == 7


def test_a_table_that_must_keep_its_first_version_is_written_at_once(tmp_path: Path) -> None:
    for table in (DelayOffsetTable(tmp_path / "d.json"), TimerCheckpointFile(tmp_path / "t.json")):
        table.load()
        assert table.path is not None and json.loads(table.path.read_text())
    recalls = RecallTable(tmp_path / "r.json")
    recalls.load()  # grows from nothing: no file until the first recall
    assert not (tmp_path / "r.json").exists()
