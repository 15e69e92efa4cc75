"""Delayed (level) and timer messages, along RocketMQ's seams:

- :mod:`.target`: where a delayed message waits and where it goes back to (send side);
- :mod:`.delay_offsets`: the delay-level progress table;
- :mod:`.timer`: the timer store (timer checkpoint, due-time index, the timer loop);
- :mod:`.recall_table` and :mod:`.recall`: RECALL_MESSAGE;
- :mod:`.delivery`: what the level loops and the timer loop share;
- :mod:`.service`: :class:`ScheduleService` (ScheduleMessageService), the delay-level
  loops, with the timer loop and recall beside them.

A returning master reverse-syncs the delay offsets, the timer checkpoint and the
recalls in pre-online, so it delivers nothing again that its acting slave delivered.
"""

from broker_agent.special.schedule.delay_offsets import DelayOffsetTable
from broker_agent.special.schedule.recall_table import RecallTable
from broker_agent.special.schedule.service import ScheduleService
from broker_agent.special.schedule.target import delayed_target, due_ms, restored
from broker_agent.special.schedule.timer import (
    TimerCheckpoint,
    TimerCheckpointFile,
    TimerIndex,
    TimerMark,
)

__all__ = [
    "DelayOffsetTable",
    "RecallTable",
    "ScheduleService",
    "TimerCheckpoint",
    "TimerCheckpointFile",
    "TimerIndex",
    "TimerMark",
    "delayed_target",
    "due_ms",
    "restored",
]
