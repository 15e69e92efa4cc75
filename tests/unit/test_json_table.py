"""The persisted tables' one JSON file (``broker_agent.metadata.json_table``): atomic
write, checked read, what an unreadable file becomes."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from broker_agent.metadata import json_table
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


async def test_durable_commits_share_writes_and_each_waits_for_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flush_mode = "sync": every caller of persist_durably returns with its change on disk;
    callers that arrive while a write is on its way share the next one (group commit)."""
    path = tmp_path / "consumer_offsets.json"
    table = ConsumerOffsetManager(path)
    writes: list[int] = []
    real = json_table.write_json_atomic

    def counted(p: Path, data: dict[str, Any]) -> None:
        writes.append(max(e["offset"] for e in data["offsets"]))
        real(p, data)

    monkeypatch.setattr(json_table, "write_json_atomic", counted)

    async def commit(offset: int) -> int:
        table.commit("G", "T", 0, offset)
        await table.persist_durably()
        on_disk = ConsumerOffsetManager(path)
        on_disk.load()
        return on_disk.query("G", "T", 0)

    seen = await asyncio.gather(*(commit(i) for i in range(1, 51)))
    assert all(got >= i for i, got in enumerate(seen, 1))  # each one's own commit is in
    assert writes[-1] == 50 and len(writes) <= 3  # 50 commits, a write or two
    await table.persist_durably()  # nothing changed: no write
    assert len(writes) <= 3


async def test_a_periodic_write_in_flight_does_not_count_for_a_later_change(
    tmp_path: Path,
) -> None:
    """The flush loop's write took the table before this commit: the commit waits for a
    write of its own."""
    path = tmp_path / "consumer_offsets.json"
    table = ConsumerOffsetManager(path)
    table.commit("G", "T", 0, 1)
    periodic = asyncio.create_task(table.persist_async())
    await asyncio.sleep(0)  # the payload with offset 1 is taken, its write under way
    table.commit("G", "T", 0, 2)
    await table.persist_durably()
    await periodic
    on_disk = ConsumerOffsetManager(path)
    on_disk.load()
    assert on_disk.query("G", "T", 0) == 2


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


def test_pre_online_keeps_the_higher_offset_of_a_slave_table_at_the_same_version(
    tmp_path: Path,
) -> None:
    """A tie: neither table moved on its own, the slave's was written before the master's
    last commits (a power loss of the group): those commits stay.  A newer version (an
    acting slave's) still wins entry by entry."""
    master = ConsumerOffsetManager(tmp_path / "consumer_offsets.json")
    master.commit("G", "T", 0, 40)
    master.commit("G", "T", 1, 5)
    same = DataVersion.from_dict(master.data_version.to_dict())
    assert master.adopt_if_newer([("G", "T", 0, 20), ("G", "T", 1, 9), ("H", "T", 0, 3)], same)
    assert master.entries() == [("G", "T", 0, 40), ("G", "T", 1, 9), ("H", "T", 0, 3)]
    newer = DataVersion.from_dict(same.to_dict())
    newer.take_over()
    assert master.adopt_if_newer([("G", "T", 0, 30)], newer)
    assert master.query("G", "T", 0) == 30
