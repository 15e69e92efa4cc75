"""A replica confirmation that spans a cut of the log confirms nothing (campaign seed
5002).

A master cut off by a partition reads a record for a pull (or appends a send) and waits
for its slaves; it is fenced, the partition heals, its pre-online cuts that record away
and the master takes writes again; the slaves re-attach and confirm the new bytes at
the same offsets.  The wait then ends "confirmed", and the pull was answered with the
removed record (delivered twice: the acting slave had delivered it) — a send would have
been acknowledged though it was gone.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from broker_agent.store import MessageStore, StoreConfig
from broker_agent.write_path import WritePath

CFG = StoreConfig(segment_size_bytes=64 * 1024, max_message_size_bytes=16 * 1024)


class HeldSlaves:
    """``wait_for_copies`` that returns True once ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.waiting = asyncio.Event()

    async def wait_for_copies(self, offset: int, copies: int, timeout_s: float) -> bool:
        self.waiting.set()
        await self.release.wait()
        return True


def write_path(store: MessageStore, slaves: HeldSlaves) -> WritePath:
    core = SimpleNamespace(
        store=store,
        ha_master=slaves,
        cfg=SimpleNamespace(slave_ack_timeout_ms=3000),
        copies_needed=lambda: 2,
    )
    return WritePath(cast(Any, core))


async def test_a_confirm_across_a_cut_of_its_bytes_is_no_confirm(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path, CFG) as store:
        kept = store.put("T", 0, b"kept", {})
        cut_at = kept.physical_offset + kept.size
        tail = store.put("T", 0, b"in the tail", {})
        slaves = HeldSlaves()
        waiting = asyncio.create_task(
            write_path(store, slaves).confirm(tail.physical_offset + tail.size)
        )
        await slaves.waiting.wait()
        store.cut_back(cut_at)  # the returning master's pre-online
        again = store.put("T", 0, b"written after the return", {})
        assert again.physical_offset == tail.physical_offset  # the same offsets again
        slaves.release.set()

        assert await waiting is False


async def test_a_cut_above_the_bytes_waited_for_does_not_matter(tmp_path: Path) -> None:
    with MessageStore.open(tmp_path, CFG) as store:
        mine = store.put("T", 0, b"mine", {})
        end = mine.physical_offset + mine.size
        store.put("T", 0, b"somebody else's tail", {})
        slaves = HeldSlaves()
        waiting = asyncio.create_task(write_path(store, slaves).confirm(end))
        await slaves.waiting.wait()
        store.cut_back(end)  # the slaves had everything up to mine
        slaves.release.set()

        assert await waiting is True
