"""Orderly drill consumers whose queue locks are in the history.

:class:`RecordingQueueLocker` records every lock round (``lock`` invoke, then ok
``granted`` true/false, or info when the broker did not answer) and every unlock;
:class:`OrderlyWorkload` consumes in order with it (the rules:
:mod:`ha_controller.drills.workloads`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ha_controller.client.message import MessageQueue
from ha_controller.client.orderly import LockOutcome, OrderlyPushConsumer, QueueLocker
from ha_controller.drills.consumers import ListenerWorkload, mq_name
from ha_controller.drills.history import (
    HistoryWriter,
    Lock,
    Unlock,
)

__all__ = ["OrderlyWorkload", "RecordingQueueLocker"]


class RecordingQueueLocker(QueueLocker):
    """A :class:`QueueLocker` that records its lock rounds and unlocks in the history."""

    def __init__(self, history: HistoryWriter, process: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.history = history
        self.process = process
        self.granted_now: set[MessageQueue] = set()
        self.grants = 0
        self.refusals = 0

    def _value(self, mq: MessageQueue, *, granted: bool | None = None) -> Lock:
        return Lock(
            consumer=self.process, consumer_group=self.group, mq=mq_name(mq), granted=granted
        )

    def _unlock_value(self, mq: MessageQueue, reason: str) -> Unlock:
        return Unlock(
            consumer=self.process, consumer_group=self.group, mq=mq_name(mq), reason=reason
        )

    async def lock(self, mqs: Iterable[MessageQueue]) -> LockOutcome:
        wanted = sorted(mqs)
        for mq in wanted:
            self.history.record(self.process, "invoke", self._value(mq))
        outcome = await super().lock(wanted)
        for mq in sorted(outcome.granted):
            self.history.record(self.process, "ok", self._value(mq, granted=True))
            self.granted_now.add(mq)
            self.grants += 1
        for mq in sorted(outcome.refused):
            self.history.record(self.process, "ok", self._value(mq, granted=False))
            self.refusals += 1
            if mq in self.granted_now:  # the consumer stops consuming it at once
                self.granted_now.discard(mq)
                self.history.record(self.process, "info", self._unlock_value(mq, "dropped"))
        for mq in sorted(outcome.unknown):
            self.history.record(self.process, "info", self._value(mq))
        return outcome

    async def unlock(self, mqs: Iterable[MessageQueue]) -> None:
        wanted = sorted(mqs)
        # the consumer stopped consuming these before it asked
        for mq in wanted:
            self.history.record(self.process, "invoke", self._unlock_value(mq, "unlock"))
            self.granted_now.discard(mq)
        await super().unlock(wanted)
        for mq in wanted:
            self.history.record(self.process, "ok", self._unlock_value(mq, "unlock"))


class _RecordingOrderlyConsumer(OrderlyPushConsumer):
    def __init__(self, history: HistoryWriter, process: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.locker = RecordingQueueLocker(
            history,
            process,
            self.routes,
            self._pool,
            self.group,
            self.client_id,
            request_timeout_ms=self.request_timeout_ms,
        )


class OrderlyWorkload(ListenerWorkload):
    """An orderly push consumer whose deliveries, acks, locks and unlocks are recorded.

    Options are those of :class:`~ha_controller.client.orderly.OrderlyPushConsumer`
    (drill defaults: rebalance every 2 s, heartbeats every 1 s, no dead-letter topic).
    :meth:`start` is idempotent; :meth:`aclose` stops consuming: commit, unlock
    (recorded), close; idempotent.
    """

    def __init__(
        self,
        namesrv: str,
        topic: str,
        consumer_group: str,
        history: HistoryWriter,
        *,
        process: str = "orderly-0",
        **options: Any,
    ) -> None:
        self._init_recording(history, process, topic, consumer_group)
        defaults: dict[str, Any] = {
            "rebalance_interval_s": 2.0,
            "heartbeat_interval_s": 1.0,
            "commit_interval_s": 1.0,
            "suspend_timeout_ms": 2000,
            "pull_error_backoff_s": 0.3,
            "dead_letter": False,
        }
        self.consumer: _RecordingOrderlyConsumer = _RecordingOrderlyConsumer(
            history,
            process,
            namesrv,
            consumer_group,
            topic,
            self._listener,
            **{**defaults, **options},
        )
        self._started = False

    @property
    def locker(self) -> RecordingQueueLocker:
        locker = self.consumer.locker
        assert isinstance(locker, RecordingQueueLocker)
        return locker

    async def start(self) -> None:
        if self._started:
            return
        self._started = True
        await super().start()
