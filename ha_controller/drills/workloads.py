"""Drill workloads: clients that record every operation in the history.

- :class:`ProducerWorkload` sends messages with unique keys (``<process>-<seq>``) at a
  bounded rate with a few sends in flight; normal, FIFO (``message_groups`` > 0: each
  key gets group ``g<n>`` round robin) or delayed (``delay_level`` or ``delay_ms``).
  Every send is an ``invoke`` followed by ``ok`` (acknowledged), ``fail`` (the client
  says it was not stored: no connection, not master, no route) or ``info`` (unknown:
  timeouts, a connection lost mid-call, anything else).
- Every body is :data:`BODY_SIZE` bytes derived from the key
  (:func:`~ha_controller.client.tools.body_for`); every consumer checks the body it
  received against its key and records a delivery whose body differs as ``receive`` ok
  with ``corrupt: true`` (the checkers count ``corrupt_deliveries``).
- :class:`PushWorkload` consumes with a :class:`~ha_controller.client.PushConsumer`;
  each listener call is a ``receive`` ok and, as the listener succeeds, an ``ack`` ok.
- :class:`PullWorkload` consumes every queue with a
  :class:`~ha_controller.client.PullConsumer` and commits offsets itself after each
  batch (``commit_offset`` invoke/ok/fail), so consumer-offset rollbacks after a master
  returns are visible; it can be paused (no pulls, no commits) around an offset probe.
  A pull that fails is a ``receive`` fail naming the queue's ``broker`` (no ``key``); the
  first pull of that queue that works again is a ``receive`` ok (no ``key`` when it
  found nothing): the read-unavailable windows of the checkers are measured from them
  (:func:`record_read_outcome`).  :class:`PopWorkload` records its failed receives the
  same way, without a broker (the client chooses it).
- :func:`offset_probe` reads the group's committed offsets from the brokers
  (``offset_probe`` ok, timed at the request's start so that commits acknowledged
  before it are strictly earlier).
- :class:`DelayedProducerWorkload` alternates delay-level and timer messages; a level
  is recorded as ``delay_ms`` (the broker's configured delay of that level, since the
  checker's level table is RocketMQ's default one), a timer as ``due_ts_ms``.
- :class:`TransactionWorkload` sends each message in a transaction (``tx: true``) and
  follows a plan drawn per key: commit or roll back at once (``end_tx`` invoke/ok/info)
  or leave it open for the brokers' check-back, which the producer's checker answers
  with the plan's outcome (``end_tx`` ok with ``via: "check"``).
- :class:`PopWorkload` receives with a :class:`~ha_controller.client.SimpleConsumer`
  (POP) and acks (``ack`` ok); a share of first deliveries is deliberately not acked
  (a ``nack`` info event, ignored by the checkers) so that the brokers revive it into
  the retry topic; judge it with ``CheckOptions(redelivery="after_ack")``.
- :class:`OrderlyWorkload` consumes in order with an
  :class:`~ha_controller.client.orderly.OrderlyPushConsumer` whose queue locker
  records every lock round (``lock`` invoke, then ok ``granted`` true/false or info
  when the broker did not answer) and every unlock (``unlock`` invoke/ok; a renewal the
  broker refuses is an ``unlock`` info ``"dropped"``: the client stops at once).

All loops run in a task group owned by the workload: ``async with`` starts and stops it;
cancellation is re-raised.  The producers are in :mod:`~ha_controller.drills.producers`,
the consumers in :mod:`~ha_controller.drills.consumers` and
:mod:`~ha_controller.drills.orderly_workload`; this module names them all.
"""

from __future__ import annotations

from ha_controller.drills.consumers import (
    Delivered,
    PopWorkload,
    PullWorkload,
    PushWorkload,
    mq_name,
    offset_probe,
    record_read_outcome,
    record_receive,
)
from ha_controller.drills.orderly_workload import OrderlyWorkload, RecordingQueueLocker
from ha_controller.drills.producers import (
    BODY_SIZE,
    DelayedProducerWorkload,
    ProducerWorkload,
    TransactionWorkload,
)

__all__ = [
    "BODY_SIZE",
    "DelayedProducerWorkload",
    "Delivered",
    "OrderlyWorkload",
    "PopWorkload",
    "ProducerWorkload",
    "PullWorkload",
    "PushWorkload",
    "RecordingQueueLocker",
    "TransactionWorkload",
    "mq_name",
    "offset_probe",
    "record_read_outcome",
    "record_receive",
]
