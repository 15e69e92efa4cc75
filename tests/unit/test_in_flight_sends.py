"""Sends in flight to a controlled group's old master end when a newer epoch shows
another master (controller mode), instead of waiting for their timeout."""

from __future__ import annotations

import asyncio

import pytest

from ha_controller.client.send_policy import InFlightSends


async def _in_flight(sends: InFlightSends, group: str, epoch: int, addr: str) -> str:
    """A send that would wait an hour unless ended: "ended" or "answered"."""
    moved = asyncio.timeout(None)
    try:
        async with moved:
            key = sends.add(group, epoch, addr, moved)
            try:
                await asyncio.sleep(3600)
            finally:
                sends.discard(group, key)
    except TimeoutError:
        return "ended"
    return "answered"


async def test_a_newer_epoch_with_another_master_ends_the_sends_to_the_old_one() -> None:
    sends = InFlightSends()
    loop = asyncio.get_running_loop()
    old = [asyncio.create_task(_in_flight(sends, "a", 3, "10.0.0.1:10911")) for _ in range(3)]
    other = asyncio.create_task(_in_flight(sends, "b", 3, "10.0.0.2:10911"))
    await asyncio.sleep(0)
    assert len(sends) == 4
    assert sends.superseded("a", 4, "10.0.0.3:10911", loop.time()) == 3
    assert await asyncio.wait_for(asyncio.gather(*old), 1) == ["ended"] * 3
    assert len(sends) == 1  # every ended send left the registry
    assert not other.done()  # another group's sends are not touched
    other.cancel()


@pytest.mark.parametrize(
    ("epoch", "addr"),
    [(3, "10.0.0.3:10911"), (2, "10.0.0.3:10911"), (4, "10.0.0.1:10911"), (4, None)],
    ids=["same-epoch", "older-epoch", "same-master-reelected", "no-master-yet"],
)
async def test_only_a_newer_epoch_with_another_master_ends_a_send(
    epoch: int, addr: str | None
) -> None:
    sends = InFlightSends()
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(_in_flight(sends, "a", 3, "10.0.0.1:10911"))
    await asyncio.sleep(0)
    ended = sends.superseded("a", epoch, addr, loop.time())
    await asyncio.sleep(0.05)
    # (no master shown in the new epoch yet: nowhere to send again, and ending the send
    # would only spend one of its attempts)
    assert ended == 0 and not task.done()
    task.cancel()
