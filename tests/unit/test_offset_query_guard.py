"""Who may answer QUERY_CONSUMER_OFFSET (``broker_agent.handlers.queries``): a consumer
starts a queue from that answer, so a table behind the group's last commits makes it
read those messages again.

The ``controller-slave-behind`` campaign (seed 3305) froze a slave for 6 s while the
consumers committed on the master, killed the master, and the elected member was
rebuilt: for a moment the frozen slave, just resumed, was the only member the routes
showed, the consumers' rebalance asked it for their offsets, and 127 messages of one
group came again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest
from fakes import FakeBroker

from broker_agent.handlers.queries import QueryHandlers
from ha_controller.config import BrokerConfig
from ha_controller.proto import broker_pb2
from ha_controller.protocol.errors import NotMaster
from ha_controller.rpc import RequestContext


@dataclass
class Link:
    replicating: bool


def slave(tmp_path: Path, *, acting: bool = True) -> tuple[FakeBroker, QueryHandlers]:
    cfg = BrokerConfig(
        broker_name="g1",
        broker_id=1,
        namesrv_addrs=("127.0.0.1:9",),
        store_dir=str(tmp_path),
        enable_slave_acting_master=acting,
    )
    broker = FakeBroker(cfg, addr="127.0.0.1:10911")
    broker.core.offsets.commit("CG", "T", 0, 7)  # its table as last synced
    return broker, QueryHandlers(broker.core, broker.write_path)  # type: ignore[arg-type]


async def query(h: QueryHandlers) -> int:
    req = broker_pb2.ConsumerOffsetRequest(consumer_group="CG", topic="T", queue_id=0)
    return (await h.query_offset(cast(RequestContext, None), req)).offset  # ctx unused


async def test_a_slave_that_neither_acts_nor_follows_a_master_does_not_answer(
    tmp_path: Path,
) -> None:
    broker, h = slave(tmp_path)
    try:
        broker.core.acting.on_min_broker_change(2, "127.0.0.1:10913", None, None)  # 2 acts
        with pytest.raises(NotMaster):
            await query(h)
        broker.core.ha_slave = Link(replicating=False)
        with pytest.raises(NotMaster):
            await query(h)
        broker.core.ha_slave = Link(replicating=True)  # it follows a master again
        assert await query(h) == 7
    finally:
        await broker.aclose()


async def test_the_acting_slave_and_a_slave_without_acting_answer(tmp_path: Path) -> None:
    broker, h = slave(tmp_path)
    try:
        broker.core.acting.on_min_broker_change(1, "127.0.0.1:10911", None, None)
        assert broker.core.acting.chosen
        assert await query(h) == 7
    finally:
        await broker.aclose()
    plain, h2 = slave(tmp_path / "plain", acting=False)
    try:
        assert await query(h2) == 7  # RocketMQ's slave without acting answers as before
    finally:
        await plain.aclose()
