"""The persisted tables' one JSON file (``broker_agent.metadata.json_table``): atomic
write, checked read, what an unreadable file becomes."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from broker_agent.metadata.json_table import read_json_checked
from broker_agent.metadata.offsets import ConsumerOffsetManager
from broker_agent.metadata.subscriptions import SubscriptionGroupConfig, SubscriptionGroupManager
from broker_agent.special.schedule import DelayOffsetTable, RecallTable, TimerCheckpointFile
from ha_controller.dataversion import DataVersion
from ha_controller.protocol.errors import StoreError


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


# ---- the checked read ------------------------------------------------------------------


def written(tmp_path: Path) -> Path:
    table = ConsumerOffsetManager(tmp_path / "consumer_offsets.json")
    table.commit("G", "T", 0, 7)
    table.persist()
    assert table.path is not None
    return table.path


def test_the_file_carries_a_checksum_and_reads_back(tmp_path: Path) -> None:
    path = written(tmp_path)
    data = json.loads(path.read_text())
    assert set(data) == {"offsets", "dataVersion", "checksum"}
    assert read_json_checked(path) == {k: v for k, v in data.items() if k != "checksum"}
    path.write_text(json.dumps({"a": 1}))  # no checksum: an older version wrote it
    assert read_json_checked(path) == {"a": 1}


def flip(text: str) -> str:
    """The offset 7 becomes 6: still JSON, still the shape, wrong."""
    return text.replace('"offset": 7', '"offset": 6')


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (flip, "checksum mismatch"),
        (lambda t: t[: len(t) // 2], "not JSON"),
        (lambda t: "[1, 2]", "a JSON list, not an object"),
        (lambda t: '{"offsets": [{"group": "G"}], "dataVersion": {}}', "missing key 'topic'"),
    ],
    ids=["bit flip", "truncated", "not an object", "wrong shape"],
)
def test_an_unreadable_table_is_set_aside_and_starts_over(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: Any, why: str
) -> None:
    path = written(tmp_path)
    text = damage(path.read_text())
    path.write_text(text)
    table = ConsumerOffsetManager(path)
    with caplog.at_level(logging.ERROR):
        table.load()
    assert table.lost and table.query("G", "T", 0) == -1
    assert table.data_version.key() == (0, 0, 0)  # every replica's table outranks it
    assert (tmp_path / "consumer_offsets.json.corrupt").read_text() == text
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith(f"consumer offset table {path} cannot be read (")
    assert why in line and "set aside as consumer_offsets.json.corrupt" in line


def test_a_table_only_replicas_have_is_refused_without_them(tmp_path: Path) -> None:
    path = tmp_path / "subscriptions.json"
    path.write_text('{"groups": [')
    with pytest.raises(StoreError, match=r"^corrupt subscription group table .*hactl group"):
        SubscriptionGroupManager(path).load(replicas=False)
    assert path.read_text() == '{"groups": ['  # nothing moved


def test_a_table_only_replicas_have_waits_for_one_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "subscriptions.json"
    path.write_text('{"groups": [')
    table = SubscriptionGroupManager(path)
    table.load(replicas=True)
    assert table.awaiting_replica and table.groups == {}
    again = SubscriptionGroupManager(path)  # restarted before a replica was asked
    again.load(replicas=True)
    assert again.awaiting_replica
    with pytest.raises(StoreError, match="not taken from a replica yet"):
        SubscriptionGroupManager(path).load(replicas=False)
    again.assign([SubscriptionGroupConfig("G", True)], DataVersion(0, 1, 5))
    again.taken_from_replica()
    last = SubscriptionGroupManager(path)
    last.load(replicas=True)
    assert not last.awaiting_replica and last.orderly("G")


def test_a_file_that_cannot_be_opened_is_refused_not_set_aside(tmp_path: Path) -> None:
    """Permissions or an I/O error are not the file's fault: nothing is rebuilt over it."""
    path = tmp_path / "consumer_offsets.json"
    path.mkdir()  # reading it fails as a directory does
    with pytest.raises(StoreError, match=r"^cannot read the consumer offset table .*directory"):
        ConsumerOffsetManager(path).load()
    assert path.is_dir() and not (tmp_path / "consumer_offsets.json.corrupt").exists()
