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

Authentication (:mod:`ha_controller.auth`).  With a cluster secret a slave first
proves itself: it sends HA_HELLO with a nonce, the master answers a fresh random
challenge for the connection plus its own proof of the secret (the slave refuses a
master that cannot prove it), and the slave answers HA_AUTH, HMAC(secret, challenge ||
broker name || broker id || its address).  Until then the master counts none of the
connection's reports (an unauthenticated report closes it) and streams nothing, and
the slave applies nothing it receives.  A link's identity (id, address) is the one
the handshake proved, and a copy counts once per broker id.  In every mode a report
beyond the master's own end closes the link: it cannot be a real copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from broker_agent.membership.epochs import Epoch, EpochFile, divergence
from broker_agent.replication.holds import SlaveHolds
from broker_agent.replication.sync_set import SyncSet
from broker_agent.store.message_store import Dispatched, MessageStore
from ha_controller.auth import ClusterAuth
from ha_controller.proto import broker_pb2, common_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    BadRequest,
    BrokerUnavailable,
    ConnectionClosed,
    HaError,
    OffsetOutOfRange,
    RecordUnderRepair,
    SignatureInvalid,
    StaleEpoch,
    StoreFull,
    StoreReadOnly,
    TlsError,
)
from ha_controller.rpc import Dispatcher, RequestContext, RpcConnection, RpcServer, connect
from ha_controller.rpc.bounds import Throttle

log = logging.getLogger(__name__)

TRANSFER_CHUNK = 1024 * 1024
KEEPALIVE_S = 1.0
#: how often a stalled slave samples its store's free space
STALLED_CHECK_S = 1.0
#: a slave with bytes pending that acknowledged nothing for this long does not count
#: as a live copy (a stalled slave stays attached but goes silent)
SLAVE_SILENT_S = 2.0
#: how long a push waits before it reads a damaged range again (see store.repair)
REPAIR_WAIT_S = 0.2
#: how long each step of the HA handshake may take
HANDSHAKE_TIMEOUT_MS = 2000
#: connection attributes of the handshake (master side: the challenge it issued and the
#: slave it proved; slave side: the master proved itself)
_CHALLENGE = "ha_challenge"
_SLAVE = "ha_slave"
_MASTER_PROVED = "ha_master_proved"
#: controller mode, master side: the member id of a slave that passed the epoch check
_EPOCH_CHECKED = "ha_epoch_checked"


@dataclass(frozen=True, slots=True)
class ProvedSlave:
    """Who a slave proved to be in the handshake."""

    broker_name: str
    broker_id: int
    addr: str


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
    #: controller mode: the slave's member id (its configured broker_id)
    member: int | None = None


class HaMaster:
    """Master side: accepts slaves, streams the commit log, tracks acks."""

    def __init__(
        self,
        store: MessageStore,
        *,
        auth: ClusterAuth | None = None,
        broker_name: str = "",
        epochs: EpochFile | None = None,
        sync: SyncSet | None = None,
        on_stale: Callable[[str], None] | None = None,
    ) -> None:
        self.store = store
        #: controller mode: this log's epochs (slaves check theirs against them before
        #: their first report) and the sync-state set every write waits for
        self.epochs = epochs
        self.sync = sync
        self._on_stale = on_stale or (lambda why: None)
        #: with a secret, slaves must pass the handshake (see the module's docstring)
        self.auth = auth or ClusterAuth(None)
        self.broker_name = broker_name
        self.links: dict[RpcConnection, SlaveLink] = {}
        #: what slaves that are away still lack (see :meth:`retention_floor`)
        self.holds = SlaveHolds()
        self._acked = asyncio.Condition()
        self._new_data = asyncio.Event()
        dispatcher = Dispatcher()
        dispatcher.add(RequestCode.HA_REPORT_OFFSET, broker_pb2.HaReport, self._on_report)
        dispatcher.add(RequestCode.HA_HELLO, broker_pb2.HaHello, self._on_hello)
        dispatcher.add(RequestCode.HA_AUTH, broker_pb2.HaAuth, self._on_auth)
        dispatcher.add(RequestCode.HA_EPOCH, broker_pb2.EpochRequest, self._on_epoch)
        self.server = RpcServer(dispatcher, name="ha")
        self.server.on_connection_closed(self._on_closed)

    async def start(
        self, host: str, port: int, *, ssl_context: ssl.SSLContext | None = None
    ) -> tuple[str, int]:
        """Bind the HA listener; with ``ssl_context`` (the broker's [tls]) slaves must
        connect with TLS (and, under mutual TLS, a client certificate)."""
        self.server.ssl_context = ssl_context
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
        """Slaves (distinct broker ids) that can confirm writes (see :meth:`confirming`)."""
        return len({link.broker_id for link in self.links.values() if self.confirming(link)})

    def transfer_slaves(self) -> list[SlaveLink]:
        return list(self.links.values())

    def has_transfer_link(self, host: str) -> bool:
        return any(link.slave_addr.rsplit(":", 1)[0] == host for link in self.links.values())

    def retention_floor(
        self, hold_ms: int, *, pressed: bool = False, now_ms: int | None = None
    ) -> int | None:
        """The commit-log offset retention must not delete up to: the smallest offset
        acknowledged by an attached slave or, for ``hold_ms`` after it was last seen and
        unless the disk is ``pressed``, by one that is away (:mod:`.holds`).  None: no
        slave to wait for."""
        return self.holds.floor(
            (link.acked for link in self.links.values()),
            now_ms=int(time.time() * 1000) if now_ms is None else now_ms,
            hold_ms=hold_ms,
            log_start=self.store.commitlog_min_offset,
            pressed=pressed,
        )

    def keep_holds(self) -> None:
        """The slaves' positions as the holds' file is to keep them (``SlaveHolds.keep``),
        taken on the loop."""
        attached: dict[int, int] = {}
        for link in self.links.values():
            attached[link.broker_id] = min(attached.get(link.broker_id, link.acked), link.acked)
        self.holds.keep(attached, int(time.time() * 1000))

    def in_sync_count(self, offset: int) -> int:
        """Copies (including ours) that hold everything below ``offset``: one per slave
        broker id (a slave reconnecting may briefly have two links)."""
        return 1 + len({link.broker_id for link in self.links.values() if link.acked >= offset})

    def acked_by_member(self) -> dict[int, int]:
        """Controller mode: member id -> the furthest offset its links acknowledged."""
        out: dict[int, int] = {}
        for link in self.links.values():
            if link.member is not None:
                out[link.member] = max(out.get(link.member, -1), link.acked)
        return out

    def _held(self, offset: int, copies: int) -> bool:
        if self.in_sync_count(offset) < copies:
            return False
        if self.sync is None:
            return True
        acked = self.acked_by_member()
        return all(acked.get(m, -1) >= offset for m in self.sync.required)

    async def sync_changed(self) -> None:
        """The sync-state set shrank or grew: writes waiting re-check what they need."""
        async with self._acked:
            self._acked.notify_all()

    def lag_bytes(self) -> int:
        if not self.links:
            return 0
        top = self.store.commitlog_max_offset
        return max(top - link.acked for link in self.links.values())

    async def wait_for_copies(self, offset: int, copies: int, timeout_s: float) -> bool:
        """Until ``copies`` copies hold everything below ``offset`` and, in controller
        mode, every member of the sync-state set does (replication.sync_set)."""
        if self._held(offset, copies):
            return True
        try:
            async with asyncio.timeout(timeout_s), self._acked:
                await self._acked.wait_for(lambda: self._held(offset, copies))
        except TimeoutError:
            return False
        return True

    # ---- the handshake ----------------------------------------------------------------

    async def _on_hello(
        self, ctx: RequestContext, req: broker_pb2.HaHello
    ) -> broker_pb2.HaChallenge:
        """A fresh challenge for this connection and our proof of the secret (an empty
        answer: this master has no secret)."""
        if not self.auth.enabled:
            return broker_pb2.HaChallenge()
        challenge = self.auth.ha_challenge()
        ctx.conn.attrs[_CHALLENGE] = challenge
        return broker_pb2.HaChallenge(
            challenge=challenge,
            master_proof=self.auth.ha_master_proof(req.slave_nonce, challenge, self.broker_name),
        )

    async def _on_auth(self, ctx: RequestContext, req: broker_pb2.HaAuth) -> common_pb2.Empty:
        """The slave's answer to the challenge: from now on its reports count."""
        if not self.auth.enabled:
            return common_pb2.Empty()
        challenge = ctx.conn.attrs.pop(_CHALLENGE, None)  # one answer per challenge
        if challenge is None or not self.auth.ha_signature_ok(
            req.signature, challenge, req.broker_name, req.broker_id, req.slave_addr
        ):
            raise self.auth.refuse(
                "ha_bad_signature",
                RequestCode.HA_AUTH,
                ctx.peer,
                SignatureInvalid(
                    "HA handshake: the answer does not match this master's challenge and "
                    "cluster_secret"
                ),
            )
        if req.broker_name != self.broker_name or req.broker_id == 0:
            raise BadRequest(
                f"HA handshake: {req.broker_name} id {req.broker_id} at {req.slave_addr} is "
                f"not a slave of {self.broker_name}"
            )
        ctx.conn.attrs[_SLAVE] = ProvedSlave(req.broker_name, req.broker_id, req.slave_addr)
        log.info(
            "HA handshake: slave %s (id %d) proved the cluster secret",
            req.slave_addr,
            req.broker_id,
        )
        return common_pb2.Empty()

    async def _on_epoch(
        self, ctx: RequestContext, req: broker_pb2.EpochRequest
    ) -> broker_pb2.EpochCache:
        """Controller mode: a slave's epoch check before its first report.  Our epochs
        (it cuts its log back to where the two part), or StaleEpoch when it has seen a
        newer epoch than ours: then we are a replaced master and step down."""
        if self.epochs is None:
            raise BadRequest("HA epoch check: this master has no controller (RIP-32 only)")
        if self.auth.enabled and ctx.conn.attrs.get(_SLAVE) is None:
            raise BadRequest("HA epoch check before the handshake (cluster secret)")
        ours = self.epochs.last
        if req.epoch > ours:
            why = (
                f"slave member {req.member_id} at {ctx.peer} has seen epoch {req.epoch}; "
                f"this master's is {ours}"
            )
            self._on_stale(why)
            raise StaleEpoch(why)
        ctx.conn.attrs[_EPOCH_CHECKED] = req.member_id
        return broker_pb2.EpochCache(
            epochs=[
                broker_pb2.EpochEntry(epoch=e, start_offset=start)
                for e, start in self.epochs.entries
            ],
            max_offset=self.store.commitlog_max_offset,
            epoch=ours,
        )

    async def _refuse_report(self, ctx: RequestContext, reason: str, why: str) -> None:
        self.links.pop(ctx.conn, None)
        self.auth.refuse(reason, RequestCode.HA_REPORT_OFFSET, ctx.peer, SignatureInvalid(why))
        await ctx.conn.aclose()

    # ---- reports ---------------------------------------------------------------------

    async def _on_report(self, ctx: RequestContext, req: broker_pb2.HaReport) -> None:
        proved: ProvedSlave | None = ctx.conn.attrs.get(_SLAVE)
        if self.auth.enabled and proved is None:
            # counted as no copy, streamed nothing: closed
            await self._refuse_report(
                ctx, "ha_unauthenticated", "HA report before the handshake (cluster secret)"
            )
            return
        link = self.links.get(ctx.conn)
        checked: int | None = ctx.conn.attrs.get(_EPOCH_CHECKED)
        if self.epochs is not None and checked is None:
            # its log may part from ours: a report before the epoch check is no copy
            log.warning(
                "slave %s reports before the epoch check (controller mode); refusing the link",
                req.slave_addr or ctx.peer,
            )
            self.links.pop(ctx.conn, None)
            await ctx.conn.aclose()
            return
        top = self.store.commitlog_max_offset
        if req.max_offset > top:
            # no real copy holds more than we do: a forgery, or our log lost its tail
            # (pre-online's catch-up copies it back first)
            log.error(
                "slave %s reports offset %d beyond our max %d; refusing the link",
                link.slave_addr if link is not None else (req.slave_addr or ctx.peer),
                req.max_offset,
                top,
            )
            await self._refuse_report(
                ctx, "ha_offset_beyond_max", f"offset {req.max_offset} beyond the master's {top}"
            )
            return
        if link is None:
            link = SlaveLink(
                ctx.conn,
                proved.addr if proved is not None else (req.slave_addr or ctx.peer),
                proved.broker_id if proved is not None else req.broker_id,
                req.max_offset,
                req.max_offset,
                time.monotonic(),
                member=checked,
            )
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
        self.holds.progressed(link.broker_id, link.acked)
        async with self._acked:
            self._acked.notify_all()

    def _on_closed(self, conn: RpcConnection) -> None:
        link = self.links.pop(conn, None)
        if link is not None:
            log.info("slave %s detached", link.slave_addr)
            if not any(other.broker_id == link.broker_id for other in self.links.values()):
                self.holds.detached(link.broker_id, link.acked, int(time.time() * 1000))
            if link.task is not None:
                link.task.cancel()

    async def _push(self, link: SlaveLink) -> None:
        try:
            while not link.conn.closed:
                top = self.store.commitlog_max_offset
                low = self.store.commitlog_min_offset
                if link.pushed < low:
                    # retention deleted what the slave asks for (it was not attached):
                    # an empty slave starts at our start (its log rebases there); one
                    # holding records below it refuses the transfer and says why
                    log.warning(
                        "slave %s asks for offset %d; the commit log starts at %d now",
                        link.slave_addr,
                        link.pushed,
                        low,
                    )
                    link.pushed = low
                if link.pushed < top:
                    try:
                        data = self.store.read_commitlog(link.pushed, TRANSFER_CHUNK)
                    except RecordUnderRepair:
                        # bytes we cannot verify are sent to no slave: wait for the
                        # repair (replication.repair) at this offset, link kept
                        await asyncio.sleep(REPAIR_WAIT_S)
                        continue
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
        *,
        ssl_context: ssl.SSLContext | None = None,
        auth: ClusterAuth | None = None,
        broker_name: str = "",
        epochs: EpochFile | None = None,
        member_id: int | None = None,
        on_cut: Callable[[int, list[Epoch]], None] | None = None,
    ) -> None:
        self.store = store
        #: controller mode: this log's epochs, checked against the master's before the
        #: first report; ``on_cut`` is told where to cut the log back when they part
        self.epochs = epochs
        self.member_id = member_id
        self._on_cut = on_cut or (lambda offset, epochs: None)
        #: with a secret, every link starts with the handshake (module docstring)
        self.auth = auth or ClusterAuth(None)
        self.broker_name = broker_name
        self._handshake_log = Throttle(10.0)
        #: TLS to the master's HA port (the broker's [tls] client side); None = plaintext
        self.ssl_context = ssl_context
        self.own_addr = own_addr
        self.broker_id = broker_id
        self._on_dispatched = on_dispatched
        self.master_ha_addr: str | None = None
        self.master_max_offset = 0
        self.conn: RpcConnection | None = None
        #: the master address ``conn`` goes to (reports go out only while it is current)
        self._conn_addr: str | None = None
        self._addr_changed = asyncio.Event()
        self.transfer_ok = asyncio.Event()
        self.last_transfer_at = 0.0
        self._stalled: str | None = None  # see stalled
        self._stall_checked_at = 0.0

    def set_master(self, ha_addr: str | None) -> None:
        if ha_addr != self.master_ha_addr:
            log.info("HA master address %s -> %s", self.master_ha_addr, ha_addr)
            self.master_ha_addr = ha_addr
            # the run loop wakes on this, closes the old link and attaches to the new
            # one; until then nothing is reported on the old link (_report).  The link is
            # kept, not forgotten: told "gone" and "back" in one instant (two nameserver
            # notices), the loop keeps the same link, and it must go on acknowledging
            self._addr_changed.set()

    @property
    def stalled(self) -> str | None:
        """Why replication is paused (the store refused what streamed in), or None."""
        if self._stalled is None or self.store.writable:
            return None
        return self._stalled

    @property
    def replicating(self) -> bool:
        """A link to the master is up and the store takes what it streams."""
        return self._current_conn() is not None and self._stalled is None

    def _current_conn(self) -> RpcConnection | None:
        """The open link to the master we are told about, if any."""
        conn = self.conn
        if conn is None or conn.closed or self._conn_addr != self.master_ha_addr:
            return None
        return conn

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
                conn = await connect(
                    addr, dispatcher=dispatcher, timeout_ms=2000, ssl_context=self.ssl_context
                )
            except BrokerUnavailable as exc:
                # a TLS failure does not heal by retrying: say so where operators look
                level = logging.WARNING if isinstance(exc, TlsError) else logging.DEBUG
                log.log(level, "HA connect to %s failed: %s", addr, exc)
                self._addr_changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(backoff):
                        await self._addr_changed.wait()
                backoff = min(backoff * 2, 2.0)
                continue
            if self.auth.enabled and not await self._handshake(conn, addr):
                await conn.aclose()
                self._addr_changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(backoff):
                        await self._addr_changed.wait()
                backoff = min(backoff * 2, 2.0)
                continue
            if self.epochs is not None:
                verdict = await self._check_epochs(conn, addr)
                if verdict == "cut":
                    await conn.aclose()
                    return  # the service is rebuilt around the cut log
                if verdict != "ok":
                    await conn.aclose()
                    self._addr_changed.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(backoff):
                            await self._addr_changed.wait()
                    backoff = min(backoff * 2, 2.0)
                    continue
            backoff = 0.1
            self.conn, self._conn_addr = conn, addr
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

    async def _handshake(self, conn: RpcConnection, addr: str) -> bool:
        """Prove the secret to the master (and make it prove it); False when that failed
        (logged at most every 10 s)."""
        auth = self.auth
        nonce = auth.ha_nonce()
        try:
            challenge = await conn.call_pb(
                RequestCode.HA_HELLO,
                broker_pb2.HaHello(slave_nonce=nonce),
                broker_pb2.HaChallenge,
                timeout_ms=HANDSHAKE_TIMEOUT_MS,
            )
            if not challenge.challenge:
                raise SignatureInvalid("the master has no cluster_secret")
            if not auth.ha_proof_ok(
                challenge.master_proof, nonce, challenge.challenge, self.broker_name
            ):
                raise SignatureInvalid("the master's proof does not match our cluster_secret")
            await conn.call_pb(
                RequestCode.HA_AUTH,
                broker_pb2.HaAuth(
                    broker_name=self.broker_name,
                    broker_id=self.broker_id,
                    slave_addr=self.own_addr,
                    signature=auth.ha_slave_signature(
                        challenge.challenge, self.broker_name, self.broker_id, self.own_addr
                    ),
                ),
                common_pb2.Empty,
                timeout_ms=HANDSHAKE_TIMEOUT_MS,
            )
        except HaError as exc:
            count = self._handshake_log.hit(time.monotonic())
            if count:
                log.warning(
                    "HA handshake with master %s failed (%d time(s) since the last such line): %s",
                    addr,
                    count,
                    exc,
                )
            return False
        conn.attrs[_MASTER_PROVED] = True
        return True

    async def _check_epochs(self, conn: RpcConnection, addr: str) -> str:
        """Controller mode: compare our epochs with the master's.  "ok" (our log is a
        prefix of its: take its list), "cut" (``on_cut`` was told where ours parts),
        or why the link was refused (a master of an older epoch than ours)."""
        assert self.epochs is not None
        try:
            cache = await conn.call_pb(
                RequestCode.HA_EPOCH,
                broker_pb2.EpochRequest(member_id=self.member_id or 0, epoch=self.epochs.last),
                broker_pb2.EpochCache,
                timeout_ms=HANDSHAKE_TIMEOUT_MS,
            )
        except HaError as exc:
            count = self._handshake_log.hit(time.monotonic())
            if count:
                log.warning(
                    "HA epoch check with master %s refused (%d time(s) since the last such "
                    "line): %s",
                    addr,
                    count,
                    exc,
                )
            return str(exc)
        theirs: list[Epoch] = [(e.epoch, e.start_offset) for e in cache.epochs]
        end = self.store.commitlog_max_offset
        cut = divergence(self.epochs.entries, end, theirs, cache.max_offset)
        if cut is not None:
            log.warning(
                "HA epoch check: our log (last epoch %d, end %d) parts from master %s's "
                "(epoch %d) at %d: cutting back there before following it",
                self.epochs.last,
                end,
                addr,
                cache.epoch,
                cut,
            )
            self._on_cut(cut, theirs)
            return "cut"
        self.epochs.follow(theirs, end)
        return "ok"

    def _report(self, *, now: bool = False) -> None:
        """HA_REPORT_OFFSET with our commit-log end; ``now`` writes it at once instead
        of at the end of this event-loop tick."""
        conn = self._current_conn()
        if conn is None:
            return
        with contextlib.suppress(ConnectionClosed):
            conn.oneway(
                RequestCode.HA_REPORT_OFFSET,
                broker_pb2.HaReport(
                    max_offset=self.store.commitlog_max_offset,
                    slave_addr=self.own_addr,
                    broker_id=self.broker_id,
                    member_id=self.member_id,
                ).SerializeToString(),
            )
            if now:
                conn.flush()

    async def _on_transfer(self, ctx: RequestContext, body: bytes) -> None:
        # Runs synchronously up to the first await, so transfers apply in order.
        if self.auth.enabled and not ctx.conn.attrs.get(_MASTER_PROVED):
            return  # nothing from a master that did not prove the secret
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
            # an empty log may start where the master's starts now (retention deleted
            # the rest: a new slave, or one that lost its volume)
            if msg.offset != local and not self.store.can_start_replica_at(msg.offset):
                gap = (
                    ": the master no longer holds what this slave lacks (away longer than "
                    "its detached_slave_hold_ms?); move this store away and restart to "
                    "copy the master's log anew"
                    if msg.offset > local
                    else ""
                )
                raise_it = OffsetOutOfRange(
                    f"HA transfer at {msg.offset} but local commit log ends at {local}{gap}"
                )
                log.warning("%s; re-attaching", raise_it)
                await ctx.conn.aclose()
                return
            try:
                self.store.append_replicated(msg.offset, msg.data)
            except RecordUnderRepair as exc:
                # our active segment shrank under us: nothing is appended past the hole
                # until the repair loop copied it back from the master; re-attach then
                log.warning("HA transfer at %d not applied: %s; re-attaching", msg.offset, exc)
                await asyncio.sleep(REPAIR_WAIT_S)
                await ctx.conn.aclose()
                return
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
            # Acknowledge first: the copy is in our commit log, which is what the
            # master's SYNC send waits for; building the consume queues (reput) is
            # local work that recovery redoes from the log (RocketMQ's slave reports
            # its commit-log offset independently of its reput, too).
            self._report(now=True)
            dispatched = self.store.reput()
            if dispatched:
                self._on_dispatched(dispatched)
        else:
            # a keepalive: answer it, so that an idle master still counts us as a copy
            # that confirms (HaMaster.confirming); silent for 2 s, we would count only
            # while caught up, and a burst after an idle spell would be refused
            # (InSyncReplicasNotEnough) until our first acknowledgement arrived
            self._report()
        self.transfer_ok.set()

    async def aclose(self) -> None:
        if self.conn is not None:
            await self.conn.aclose()
