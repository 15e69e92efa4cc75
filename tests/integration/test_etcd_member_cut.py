"""The controller's etcd client and leadership when one etcd member stops answering,
over a real etcd and real sockets (CHANGELOG, "The controller-mode families", (c)).

A member cut off from the others (``controller-isolate`` cuts the master off with one
etcd member), or one still forwarding to a leader that is gone, accepts a request and
holds it until the client gives up.  Here that member is a relay in front of the real
etcd that stops relaying when the test cuts it: the same address, a connection that
stays open, no answer."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import pytest

from ha_controller.controller.etcd import EtcdClient
from ha_controller.controller.store import Leadership
from ha_controller.testing.etcd import EtcdCluster


class Relay:
    """A TCP relay to ``target``; :meth:`cut` makes it swallow everything from then on
    (connections stay open, nothing is answered)."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.cut_off = asyncio.Event()
        self.server: asyncio.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []
        self.addr = ""

    def cut(self) -> None:
        self.cut_off.set()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            with contextlib.suppress(ConnectionError):
                while chunk := await reader.read(65536):
                    if self.cut_off.is_set():
                        continue  # swallowed: the member holds the request
                    writer.write(chunk)
                    await writer.drain()
        finally:
            writer.close()  # one side ended: so does the other

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers.append(up_writer)
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Relay]:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        host, port = self.server.sockets[0].getsockname()[:2]
        self.addr = f"{host}:{port}"
        try:
            yield self
        finally:
            self.server.close()
            for w in self.writers:
                w.close()
            await self.server.wait_closed()


@pytest.fixture
async def relay(etcd: EtcdCluster) -> AsyncIterator[Relay]:
    async with Relay(etcd.members[0].endpoint).running() as r:
        yield r


async def test_a_call_under_way_does_not_go_back_to_the_member_it_gave_up_on(
    etcd: EtcdCluster, relay: Relay
) -> None:
    """Two calls meet the cut member first; the first gives up on it, tries the next
    member and is answered.  The second, which began before that answer, must try the
    next member too: the answer used to move the shared preference past the member the
    second call was about to try, which sent it back to the cut one, and it failed with
    etcd up (the controller's renewal failing so, with a leader change on top, kept it
    from leading for 6 s)."""
    client = EtcdClient([relay.addr, etcd.members[0].endpoint])
    try:
        await client.put("/t/k", "v")  # through the relay while it still relays
        relay.cut()
        first = asyncio.create_task(client.get("/t/k", timeout_s=0.5))
        second = asyncio.create_task(client.get("/t/k", timeout_s=1.5))
        kv = await first
        assert kv is not None and kv.value == "v"
        kv = await second
        assert kv is not None and kv.value == "v"
        # and a call that begins now starts at a member that answers
        started = time.monotonic()
        assert await client.get("/t/k", timeout_s=1.0) is not None
        assert time.monotonic() - started < 0.5
    finally:
        await client.aclose()


async def test_the_leader_keeps_leading_when_two_members_it_may_renew_through_hang(
    etcd: EtcdCluster, relay: Relay
) -> None:
    """The leader renews through the member it last reached; that member is cut off,
    and so is the next one (a member still forwarding to a leader that is gone holds a
    renewal as long): the renewal must reach the third while the lease is still surely
    held, 0.8 of its TTL (docs/failover.md, "How long until an election": up to
    2 x ttl / 3).  With the client's 2 s per member it came back after 4 s, past the
    2.4 s the leader trusts a 3 s lease for: it stopped leading and elected no one."""
    async with Relay(etcd.members[0].endpoint).running() as second:
        client = EtcdClient([relay.addr, second.addr, etcd.members[0].endpoint])
        lead = Leadership(client, "ns-a", prefix="/t", ttl_s=3)
        try:
            await lead.step()
            assert lead.leading
            relay.cut()
            second.cut()
            started = time.monotonic()
            await lead.step()
            took = time.monotonic() - started
            assert lead.leading, f"the renewal took {took:.1f} s, past the lease's trust"
            assert took < 2 * lead.ttl_s / 3 + 0.4
            await lead.step()  # the next renewal goes straight to the member that answers
            assert lead.leading
            kv = await client.get("/t/controller/leader")
            assert kv is not None and kv.value == "ns-a" and kv.lease == lead.lease
        finally:
            await lead.resign()
            await client.aclose()
