"""HA replication on the HA port (RocketMQ HAService ideas over our framing).

A slave connects to the master's HA port and reports its commit-log max
offset (HA_REPORT_OFFSET, one-way); the master streams commit-log bytes from
there (HA_TRANSFER, one-way, whole records) and keeps each slave's acked
offset, so a SYNC send can wait for ``in_sync_replicas`` copies.

A slave whose store cannot take what arrives (full disk, read-only) is *stalled*: it
stays attached (so a returning master's pre-online still sees its link, and the master
sees its acked offset stop) but discards what streams in and reports nothing.  Every
transfer still carries the master's end, so the slave's lag stays honest.  Once its
store takes appends again (sampled every second) it re-attaches from its own end and
catches up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from broker_agent.store.message_store import Dispatched, MessageStore
from ha_controller.proto import broker_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    BrokerUnavailable,
    ConnectionClosed,
    HaError,
    OffsetOutOfRange,
    StoreFull,
    StoreReadOnly,
)
from ha_controller.rpc import Dispatcher, RequestContext, RpcConnection, RpcServer, connect

log = logging.getLogger(__name__)

TRANSFER_CHUNK = 1024 * 1024
KEEPALIVE_S = 1.0
#: how often a stalled slave samples its store's free space
STALLED_CHECK_S = 1.0
#: a slave with bytes pending that acknowledged nothing for this long does not count
#: as a live copy (a stalled slave stays attached but goes silent)
SLAVE_SILENT_S = 2.0


@dataclass
class SlaveLink:
    conn: RpcConnection
    slave_addr: str
    broker_id: int
    acked: int
    pushed: int
    connected_at: float
    task: asyncio.Task[None] | None = None
    reported_at: float = 0.0


class HaMaster:
    """Master side: accepts slaves, streams the commit log, tracks acks."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.links: dict[RpcConnection, SlaveLink] = {}
        self._acked = asyncio.Condition()
        self._new_data = asyncio.Event()
        dispatcher = Dispatcher()
        dispatcher.add(RequestCode.HA_REPORT_OFFSET, broker_pb2.HaReport, self._on_report)
        self.server = RpcServer(dispatcher, name="ha")
        self.server.on_connection_closed(self._on_closed)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        return await self.server.start(host, port)

    def data_appended(self) -> None:
        """Called after every local put: wake the pushers."""
        self._new_data.set()

    def confirming(self, link: SlaveLink) -> bool:
        """Whether ``link``'s slave acknowledges what it is sent: caught up, or it
        reported within ``SLAVE_SILENT_S`` (a stalled slave stays attached, silent)."""
        return (
            link.acked >= self.store.commitlog_max_offset
            or time.monotonic() - link.reported_at < SLAVE_SILENT_S
        )

    def slave_count(self) -> int:
        """Slaves that can confirm writes (see :meth:`confirming`)."""
        return sum(1 for link in self.links.values() if self.confirming(link))

    def transfer_slaves(self) -> list[SlaveLink]:
        return list(self.links.values())

    def has_transfer_link(self, host: str) -> bool:
        return any(link.slave_addr.rsplit(":", 1)[0] == host for link in self.links.values())

    def in_sync_count(self, offset: int) -> int:
        """Copies (including ours) that hold everything below ``offset``."""
        return 1 + sum(1 for link in self.links.values() if link.acked >= offset)

    def lag_bytes(self) -> int:
        if not self.links:
            return 0
        top = self.store.commitlog_max_offset
        return max(top - link.acked for link in self.links.values())

    async def wait_for_copies(self, offset: int, copies: int, timeout_s: float) -> bool:
        if self.in_sync_count(offset) >= copies:
            return True
        try:
            async with asyncio.timeout(timeout_s), self._acked:
                await self._acked.wait_for(lambda: self.in_sync_count(offset) >= copies)
        except TimeoutError:
            return False
        return True

    async def _on_report(self, ctx: RequestContext, req: broker_pb2.HaReport) -> None:
        link = self.links.get(ctx.conn)
        if link is None:
            link = SlaveLink(
                ctx.conn,
                req.slave_addr or ctx.peer,
                req.broker_id,
                req.max_offset,
                req.max_offset,
                time.monotonic(),
            )
            if req.max_offset > self.store.commitlog_max_offset:
                log.error(
                    "slave %s reports offset %d beyond our max %d; refusing the link",
                    link.slave_addr,
                    req.max_offset,
                    self.store.commitlog_max_offset,
                )
                await ctx.conn.aclose()
                return
            self.links[ctx.conn] = link
            link.task = asyncio.get_running_loop().create_task(self._push(link))
            log.info(
                "slave %s (id %d) attached at offset %d",
                link.slave_addr,
                req.broker_id,
                req.max_offset,
            )
        link.acked = max(link.acked, req.max_offset)
        link.reported_at = time.monotonic()
        async with self._acked:
            self._acked.notify_all()

    def _on_closed(self, conn: RpcConnection) -> None:
        link = self.links.pop(conn, None)
        if link is not None:
            log.info("slave %s detached", link.slave_addr)
            if link.task is not None:
                link.task.cancel()

    async def _push(self, link: SlaveLink) -> None:
        try:
            while not link.conn.closed:
                top = self.store.commitlog_max_offset
                if link.pushed < top:
                    data = self.store.read_commitlog(link.pushed, TRANSFER_CHUNK)
                    if data:
                        msg = broker_pb2.HaTransfer(
                            offset=link.pushed, data=data, master_max_offset=top
                        )
                        link.conn.oneway(RequestCode.HA_TRANSFER, msg.SerializeToString())
                        link.pushed += len(data)
                        await link.conn.drain()
                        continue
                self._new_data.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(KEEPALIVE_S):
                        await self._new_data.wait()
                if link.pushed >= self.store.commitlog_max_offset:
                    keepalive = broker_pb2.HaTransfer(
                        offset=link.pushed, master_max_offset=self.store.commitlog_max_offset
                    )
                    link.conn.oneway(RequestCode.HA_TRANSFER, keepalive.SerializeToString())
        except (ConnectionClosed, ConnectionError):
            pass
        except HaError:
            log.exception("HA push to %s failed", link.slave_addr)
            await link.conn.aclose()

    async def aclose(self) -> None:
        for link in list(self.links.values()):
            if link.task is not None:
                link.task.cancel()
        await self.server.aclose(grace_s=0.5)


class HaSlave:
    """Slave side: keeps one link to the master's HA port and appends what it streams."""

    def __init__(
        self,
        store: MessageStore,
        own_addr: str,
        broker_id: int,
        on_dispatched: Callable[[list[Dispatched]], None],
    ) -> None:
        self.store = store
        self.own_addr = own_addr
        self.broker_id = broker_id
        self._on_dispatched = on_dispatched
        self.master_ha_addr: str | None = None
        self.master_max_offset = 0
        self.conn: RpcConnection | None = None
        self._addr_changed = asyncio.Event()
        self.transfer_ok = asyncio.Event()
        self.last_transfer_at = 0.0
        self._stalled: str | None = None  # see stalled
        self._stall_checked_at = 0.0

    def set_master(self, ha_addr: str | None) -> None:
        if ha_addr != self.master_ha_addr:
            log.info("HA master address %s -> %s", self.master_ha_addr, ha_addr)
            self.master_ha_addr = ha_addr
            # the run loop wakes on this, closes the old link and attaches to the new one
            self._addr_changed.set()
            self.conn = None

    @property
    def stalled(self) -> str | None:
        """Why replication is paused (the store refused what streamed in), or None."""
        if self._stalled is None or self.store.writable:
            return None
        return self._stalled

    @property
    def replicating(self) -> bool:
        """A link to the master is up and the store takes what it streams."""
        return self.conn is not None and not self.conn.closed and self._stalled is None

    @property
    def lag_bytes(self) -> int:
        """Bytes the master had (as last learned) beyond our commit log, link or not."""
        return max(0, self.master_max_offset - self.store.commitlog_max_offset)

    def _store_takes_appends_again(self) -> bool:
        """While stalled: sample the store (at most every ``STALLED_CHECK_S``; a store
        that gets no appends takes no samples of its own) and say whether it recovered."""
        now = time.monotonic()
        if now - self._stall_checked_at >= STALLED_CHECK_S:
            self._stall_checked_at = now
            self.store.check_space()
        return self.store.writable

    async def run(self) -> None:
        """Connect, report, receive; reconnect with backoff. Runs until cancelled."""
        backoff = 0.1
        while True:
            addr = self.master_ha_addr
            if addr is None:
                self._addr_changed.clear()
                await self._addr_changed.wait()
                continue
            dispatcher = Dispatcher()
            dispatcher.add_raw(RequestCode.HA_TRANSFER, self._on_transfer)
            try:
                conn = await connect(addr, dispatcher=dispatcher, timeout_ms=2000)
            except BrokerUnavailable as exc:
                log.debug("HA connect to %s failed: %s", addr, exc)
                self._addr_changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(backoff):
                        await self._addr_changed.wait()
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.1
            self.conn = conn
            self.last_transfer_at = time.monotonic()  # the silence watchdog starts now
            self._report()
            log.info(
                "HA link to master %s established at offset %d",
                addr,
                self.store.commitlog_max_offset,
            )
            # watchdog: a silent master (SIGSTOP, partition) is dropped after 5 s
            while not conn.closed and self.master_ha_addr == addr:
                self._addr_changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await self._addr_changed.wait()
                if time.monotonic() - self.last_transfer_at > 5.0 and not conn.closed:
                    log.warning("HA master %s silent for 5 s; reconnecting", addr)
                    await conn.aclose()
            self.transfer_ok.clear()
            if self.conn is conn:
                self.conn = None
            await conn.aclose()

    def _report(self) -> None:
        if self.conn is None or self.conn.closed:
            return
        with contextlib.suppress(ConnectionClosed):
            self.conn.oneway(
                RequestCode.HA_REPORT_OFFSET,
                broker_pb2.HaReport(
                    max_offset=self.store.commitlog_max_offset,
                    slave_addr=self.own_addr,
                    broker_id=self.broker_id,
                ).SerializeToString(),
            )

    async def _on_transfer(self, ctx: RequestContext, body: bytes) -> None:
        # Runs synchronously up to the first await, so transfers apply in order.
        msg = broker_pb2.HaTransfer()
        msg.ParseFromString(body)
        self.last_transfer_at = time.monotonic()
        self.master_max_offset = msg.master_max_offset
        local = self.store.commitlog_max_offset
        if self._stalled is not None:  # keepalives too: an idle master streams nothing
            if not self._store_takes_appends_again():
                self.transfer_ok.set()  # the link works; the store does not
                return  # discard: the lag grows, visibly
            log.info("HA replication resumes: the store takes appends again at %d", local)
            self._stalled = None
            await ctx.conn.aclose()  # re-attach from our own end
            return
        if msg.data:
            if msg.offset != local:
                raise_it = OffsetOutOfRange(
                    f"HA transfer at {msg.offset} but local commit log ends at {local}"
                )
                log.warning("%s; re-attaching", raise_it)
                await ctx.conn.aclose()
                return
            try:
                self.store.append_replicated(msg.offset, msg.data)
            except (StoreFull, StoreReadOnly) as exc:
                # nothing was written; stay attached, discard until the store recovers
                self._stalled = str(exc)
                self._stall_checked_at = time.monotonic()
                log.warning(
                    "HA replication paused at %d: %s; discarding transfers until the store "
                    "takes appends again",
                    local,
                    exc,
                )
                self.transfer_ok.set()
                return
            dispatched = self.store.reput()
            if dispatched:
                self._on_dispatched(dispatched)
            self._report()
        self.transfer_ok.set()

    async def aclose(self) -> None:
        if self.conn is not None:
            await self.conn.aclose()
