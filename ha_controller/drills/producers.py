"""Drill producers: every send recorded (invoke, then ok, fail or info).

:class:`ProducerWorkload` (normal, FIFO, delayed by one level or ``delay_ms``),
:class:`DelayedProducerWorkload` (levels and timers in turn) and
:class:`TransactionWorkload` (one transaction per message, a plan drawn per key); the
rules are in :mod:`ha_controller.drills.workloads`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Sequence
from typing import Any, Final, Literal, Self

from ha_controller.client.message import Message, ReceivedMessage, SendReceipt
from ha_controller.client.producer import Producer
from ha_controller.client.tools import body_for
from ha_controller.client.transaction import Transaction, TransactionChecker, TransactionResolution
from ha_controller.drills.history import (
    EndTx,
    HistoryWriter,
    SendInvoke,
    SendOk,
    SendOutcome,
)
from ha_controller.drills.tasks import InFlight, cancel_and_wait
from ha_controller.protocol.errors import (
    BrokerUnavailable,
    HaError,
    NotMaster,
    TopicNotFound,
)
from ha_controller.protocol.properties import now_ms

__all__ = [
    "BODY_SIZE",
    "TX_PLANS",
    "DelayedProducerWorkload",
    "ProducerWorkload",
    "TransactionWorkload",
    "TxPlan",
]

log = logging.getLogger(__name__)

#: the size of every drill message body (derived from its key: ``body_for(key, size)``)
BODY_SIZE: Final = 256


def _definitely_not_stored(exc: BaseException) -> bool:
    return isinstance(exc, BrokerUnavailable | NotMaster | TopicNotFound)


class ProducerWorkload:
    """Sends ``rate`` messages/s with ``concurrency`` sends in flight until stopped."""

    def __init__(
        self,
        namesrv: str,
        topic: str,
        history: HistoryWriter,
        *,
        process: str = "producer-0",
        rate: float = 100.0,
        concurrency: int = 4,
        size: int = BODY_SIZE,
        message_groups: int = 0,
        delay_level: int = 0,
        delay_ms: int = 0,
        max_attempts: int = 3,
        send_timeout_ms: int = 3000,
        checker: TransactionChecker | None = None,
    ) -> None:
        if rate <= 0 or concurrency < 1:
            raise ValueError("rate must be > 0 and concurrency >= 1")
        self.namesrv = namesrv
        self.topic = topic
        self.history = history
        self.process = process
        self.rate = rate
        self.concurrency = concurrency
        self.size = size
        self.message_groups = message_groups
        self.delay_level = delay_level
        self.delay_ms = delay_ms
        self.producer = Producer(
            namesrv,
            group=f"drill-{process}",
            max_attempts=max_attempts,
            send_timeout_ms=send_timeout_ms,
            checker=checker,
            # brokers send check-backs to the connection of the group's last heartbeat
            heartbeat_interval_s=1.0 if checker is not None else 10.0,
        )
        self.acked: set[str] = set()
        self.sent = 0
        self.failed = 0
        self.unknown = 0
        self._seq = 0
        self._inflight = InFlight()
        self._running = asyncio.Event()
        self._running.set()
        self._next_slot = 0.0
        self._task: asyncio.Task[None] | None = None

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    async def __aenter__(self) -> Self:
        await self.producer.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.process)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop_sending()
        await self.producer.aclose()

    async def stop(self) -> None:
        """Stop sending (see :meth:`stop_sending`) and close the producer."""
        await self.stop_sending()
        await self.producer.aclose()

    async def stop_sending(self) -> None:
        """Stop sending: in-flight sends may finish (bounded by the send timeout); what is
        still in flight then is cancelled and recorded as info."""
        self.pause()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(
                self.producer.send_timeout_ms * self.producer.max_attempts / 1000 + 1
            ):
                await self._inflight.idle.wait()
        await cancel_and_wait(self._task)
        self._task = None

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for _ in range(self.concurrency):
                tg.create_task(self._worker())

    async def _slot(self) -> None:
        """A simple pacer shared by the workers: one send every ``1/rate`` s."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._next_slot = max(self._next_slot + 1.0 / self.rate, now)
        if self._next_slot > now:
            await asyncio.sleep(self._next_slot - now)

    async def _worker(self) -> None:
        while True:
            await self._running.wait()
            await self._slot()
            if not self._running.is_set():
                continue
            await self.send_one()

    def _next_message(self) -> tuple[Message, SendInvoke]:
        key = f"{self.process}-{self._seq}"
        group = f"g{self._seq % self.message_groups}" if self.message_groups else None
        self._seq += 1
        deliver_ts: int | None = None
        if self.delay_ms:
            deliver_ts = now_ms() + self.delay_ms
        msg = Message(
            self.topic,
            body_for(key, self.size),
            keys=(key,),
            message_group=group,
            delay_level=self.delay_level,
            deliver_ts_ms=deliver_ts,
        )
        invoke = SendInvoke(
            key=key,
            topic=self.topic,
            group=group,
            delay_level=self.delay_level or None,
            due_ts_ms=deliver_ts,
        )
        return msg, invoke

    async def send_one(self) -> bool:
        """One recorded send; True when acknowledged."""
        msg, invoke = self._next_message()
        receipt = await self._send_recorded(msg, invoke)
        if receipt is None:
            return False
        self.acked.add(invoke.key)
        return True

    async def _send_recorded(
        self, msg: Message, invoke: SendInvoke, transaction: Transaction | None = None
    ) -> SendReceipt | None:
        """Send ``msg`` recording invoke and outcome; the receipt when acknowledged."""
        key = invoke.key
        self.history.record(self.process, "invoke", invoke)
        self.sent += 1
        with self._inflight.track():
            try:
                receipt = await self.producer.send(msg, transaction=transaction)
            except asyncio.CancelledError:
                self.history.record(self.process, "info", SendOutcome(key=key, error="cancelled"))
                self.unknown += 1
                raise
            except (HaError, OSError) as exc:
                error = f"{type(exc).__name__}: {exc}"
                broker = exc.broker_name if isinstance(exc, HaError) else None
                outcome = SendOutcome(key=key, error=error, broker=broker)
                if _definitely_not_stored(exc):
                    self.history.record(self.process, "fail", outcome)
                    self.failed += 1
                else:
                    self.history.record(self.process, "info", outcome)
                    self.unknown += 1
                return None
        self.history.record(
            self.process,
            "ok",
            SendOk(
                key=key,
                msg_id=receipt.msg_id,
                broker=receipt.broker_name,
                queue_id=receipt.queue_id,
                queue_offset=receipt.queue_offset,
                epoch=receipt.epoch,
                member_id=receipt.member_id,
            ),
        )
        return receipt

    async def burst(self, count: int) -> int:
        """Send ``count`` messages one after another (no pacing); returns how many were acked."""
        acked = 0
        for _ in range(count):
            acked += await self.send_one()
        return acked


class DelayedProducerWorkload(ProducerWorkload):
    """Alternates delay-level and timer messages (never FIFO).

    ``levels_ms`` is the brokers' configured level table (``HAC_DELAY_LEVELS``) and
    ``levels`` the levels to draw from; timer delays are drawn from ``timer_ms``
    (inclusive bounds).  A level message is recorded with ``delay_ms`` = its level's
    configured delay, a timer message with its absolute ``due_ts_ms``.  While
    :attr:`blackout_ms` (wall-clock ``(start, end)``) is set, delays are drawn among
    those whose due time falls outside it (when there is one).
    """

    def __init__(
        self,
        namesrv: str,
        topic: str,
        history: HistoryWriter,
        *,
        levels_ms: Sequence[int],
        levels: Sequence[int],
        timer_ms: tuple[int, int],
        seed: int = 0,
        **options: Any,
    ) -> None:
        if not levels or any(not 1 <= lv <= len(levels_ms) for lv in levels):
            raise ValueError(f"levels {list(levels)} must be within 1..{len(levels_ms)}")
        if not 0 < timer_ms[0] <= timer_ms[1]:
            raise ValueError(f"timer_ms must be 0 < low <= high, got {timer_ms}")
        super().__init__(namesrv, topic, history, **options)
        self.levels_ms = tuple(levels_ms)
        self.levels = tuple(levels)
        self.timer_ms = timer_ms
        self.blackout_ms: tuple[int, int] | None = None
        self._rng = random.Random(seed)

    def _choose(self, now: int, delays: Sequence[int]) -> int:
        """One of ``delays`` (ms), avoiding due times in the blackout when possible."""
        if self.blackout_ms is not None:
            start, end = self.blackout_ms
            allowed = [d for d in delays if not start <= now + d <= end]
            if allowed:
                return self._rng.choice(allowed)
        return self._rng.choice(delays)

    def _next_message(self) -> tuple[Message, SendInvoke]:
        key = f"{self.process}-{self._seq}"
        timer = self._seq % 2 == 1
        self._seq += 1
        body = body_for(key, self.size)
        now = now_ms()
        if timer:
            low, high = self.timer_ms
            due = now + self._choose(now, range(low, high + 1, 50))
            msg = Message(self.topic, body, keys=(key,), deliver_ts_ms=due)
            return msg, SendInvoke(key=key, topic=self.topic, due_ts_ms=due)
        delay = self._choose(now, [self.levels_ms[lv - 1] for lv in self.levels])
        level = self.levels_ms.index(delay) + 1
        msg = Message(self.topic, body, keys=(key,), delay_level=level)
        return msg, SendInvoke(key=key, topic=self.topic, delay_ms=delay)


# --- transactions ----------------------------------------------------------------------

TxPlan = Literal["commit", "rollback", "check-commit", "check-rollback"]
TX_PLANS: Final[tuple[TxPlan, ...]] = ("commit", "rollback", "check-commit", "check-rollback")


class TransactionWorkload(ProducerWorkload):
    """One transaction per message, resolved at once or left to the brokers' check.

    Each key draws a plan (weights ``plan_weights`` over :data:`TX_PLANS`).  ``commit``
    / ``rollback`` end the transaction right after the half message is stored; the
    ``check-*`` plans leave it open and the producer's checker answers the brokers'
    check-back with the plan's outcome (also for an explicit end whose outcome was
    unknown).  :attr:`acked` holds the keys that must be delivered (stored and
    committed); :meth:`unresolved` those stored and not resolved yet.
    """

    def __init__(
        self,
        namesrv: str,
        topic: str,
        history: HistoryWriter,
        *,
        seed: int = 0,
        plan_weights: Sequence[float] = (0.35, 0.15, 0.3, 0.2),
        **options: Any,
    ) -> None:
        if len(plan_weights) != len(TX_PLANS):
            raise ValueError(f"plan_weights needs {len(TX_PLANS)} weights")
        super().__init__(namesrv, topic, history, checker=self._check, **options)
        self.plan_weights = tuple(plan_weights)
        self.plans: dict[str, TxPlan] = {}
        self.stored: set[str] = set()
        self.resolved: dict[str, bool] = {}  # key -> committed
        self.checks = 0
        self._rng = random.Random(seed)

    def unresolved(self) -> set[str]:
        return self.stored - self.resolved.keys()

    async def stop(self) -> None:
        """Stop sending; the producer stays open (until the workload exits) to answer the
        brokers' check-backs of the transactions still open."""
        await self.stop_sending()

    def _resolve(self, key: str, commit: bool) -> None:
        self.resolved[key] = commit
        if commit and key in self.stored:
            self.acked.add(key)

    async def send_one(self) -> bool:
        key = f"{self.process}-{self._seq}"
        self._seq += 1
        plan = self._rng.choices(TX_PLANS, self.plan_weights)[0]
        self.plans[key] = plan
        msg = Message(self.topic, body_for(key, self.size), keys=(key,))
        tx = self.producer.begin_transaction()
        invoke = SendInvoke(key=key, topic=self.topic, tx=True)
        if await self._send_recorded(msg, invoke, tx) is None:
            return False
        self.stored.add(key)
        if key in self.resolved:  # a check answered before the send's ok arrived
            self._resolve(key, self.resolved[key])
        if plan in ("commit", "rollback"):
            await self._end(tx, key, commit=plan == "commit")
        return True

    async def _end(self, tx: Transaction, key: str, *, commit: bool) -> None:
        value = EndTx(key=key, commit=commit)
        self.history.record(self.process, "invoke", value)
        with self._inflight.track():
            try:
                await (tx.commit() if commit else tx.rollback())
            except asyncio.CancelledError:
                self.history.record(self.process, "info", value)
                raise
            except (HaError, OSError) as exc:
                # END_TRANSACTION may or may not have arrived: the check decides
                log.debug("end of transaction %s failed: %s", key, exc)
                self.history.record(self.process, "info", value)
                return
        self.history.record(self.process, "ok", value)
        self._resolve(key, commit)

    async def _check(self, message: ReceivedMessage) -> TransactionResolution:
        plan = self.plans.get(message.key)
        if plan is None:
            return TransactionResolution.UNKNOWN
        commit = plan in ("commit", "check-commit")
        self.checks += 1
        # The answer goes out as END_TRANSACTION right after; should it be lost, the
        # brokers ask again (the schema records the producer's answer as the outcome).
        self.history.record(self.process, "ok", EndTx(key=message.key, commit=commit, via="check"))
        self._resolve(message.key, commit)
        return TransactionResolution.COMMIT if commit else TransactionResolution.ROLLBACK


# --- POP ---------------------------------------------------------------------------------
