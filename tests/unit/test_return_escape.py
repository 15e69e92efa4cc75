"""The escape bridge of a master that may have been expired, or whose disk is full
(issue 17, defects A and C), over fakes: no sockets beyond the fake nameserver and
masters of tests/unit/test_escape.py."""

from __future__ import annotations

import pytest
from test_escape import TOPIC, Env, env, three_groups

from ha_controller.protocol.errors import BrokerIsolated, EscapeFailed, StoreFull

__all__ = ["env"]  # the fixture, imported for pytest


async def test_a_fenced_master_hands_nothing_on(env: Env) -> None:
    master = env.broker(broker_id=0)
    three_groups(env)
    master.core.isolated = True  # fenced: back in pre-online
    with pytest.raises(EscapeFailed) as failed:
        await master.escape.put_message(TOPIC, b"x", {}, kind="delay")
    assert isinstance(failed.value.__cause__, BrokerIsolated)
    with pytest.raises(EscapeFailed):
        await master.escape.put_message_to_specific_queue(TOPIC, b"x", {}, kind="pop_retry")
    assert master.core.store.max_offset(TOPIC, 0) == 0
    assert sum(len(m.sends) for m in env.masters.values()) == 0


async def test_a_master_whose_store_is_full_escapes_to_another_group(env: Env) -> None:
    master = env.broker(broker_id=0, total_replicas=2, in_sync_replicas=2)
    three_groups(env)
    master.core.store.refuse = StoreFull("store full")  # the write path: NotWritable
    result = await master.escape.put_message(TOPIC, b"x", {"K": "v"}, kind="delay")
    assert result.target in ("broker_b", "broker_c")
    assert sum(len(m.sends) for m in env.masters.values()) == 1
    # any other refusal of the local put is still the caller's to retry
    master.core.store.refuse = None
    assert master.core.ha_master is not None
    master.core.ha_master.live = 0  # its slave is gone: InSyncReplicasNotEnough
    with pytest.raises(EscapeFailed, match="live copies"):
        await master.escape.put_message(TOPIC, b"x", {}, kind="delay")
    assert sum(len(m.sends) for m in env.masters.values()) == 1
    assert master.core.store.appended == []


async def test_a_full_master_without_remote_escape_waits(env: Env) -> None:
    master = env.broker(broker_id=0, enable_remote_escape=False)
    three_groups(env)
    master.core.store.refuse = StoreFull("store full")
    with pytest.raises(EscapeFailed):
        await master.escape.put_message(TOPIC, b"x", {}, kind="delay")
    assert sum(len(m.sends) for m in env.masters.values()) == 0
