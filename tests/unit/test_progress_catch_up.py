"""After an unclean stop the special services' tables catch up with the progress
records stored since their files were written, forward only (metadata.progress)."""

from __future__ import annotations

from pathlib import Path

from broker_agent.special.schedule.delay_offsets import DelayOffsetTable, delay_record
from broker_agent.special.schedule.timer import TimerCheckpointFile, TimerMark
from broker_agent.store import MessageStore, StoreConfig
from ha_controller.protocol.properties import OFFSET_TOPIC

CFG = StoreConfig(segment_size_bytes=64 * 1024, max_message_size_bytes=16 * 1024)


def test_tables_take_the_records_ahead_of_them_and_only_those(tmp_path: Path) -> None:
    delay = DelayOffsetTable(tmp_path / "delay_offsets.json")
    delay.load()
    delay.update(1, 5)
    delay.update(2, 9)  # an acting slave's own progress: no record of it
    delay.persist()
    timer = TimerCheckpointFile(tmp_path / "timer_checkpoint.json")
    timer.load()
    timer.advance(TimerMark(1_000, 3))
    timer.persist()
    with MessageStore.open(tmp_path / "store", CFG) as store:
        for record in (
            delay_record(1, 6),
            delay_record(2, 4),
            TimerMark(900, 2).record(),
            delay_record(1, 7),
            TimerMark(1_500, 4).record(),
            TimerMark(1_200, 4).record(),  # behind the one before: not taken
        ):
            store.put(OFFSET_TOPIC, 0, b"", record)
        assert delay.catch_up_with_log(store) == 3
        assert timer.catch_up_with_log(store) == 3
    assert (delay.get(1), delay.get(2)) == (7, 9)
    assert (timer.cp.last_read_time_ms, timer.cp.master_timer_queue_offset) == (1_500, 4)
