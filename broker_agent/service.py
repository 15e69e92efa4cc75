"""The broker service: request handlers, life cycle with the nameservers,
acting-master state, replication and long polling around one store."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from broker_agent.acting import ActingState, Decision
from broker_agent.escape import EscapeBridge
from broker_agent.ha import HaMaster, HaSlave
from broker_agent.lock_service import LockService
from broker_agent.metrics import BrokerMetrics
from broker_agent.offsets import ConsumerOffsetManager
from broker_agent.pop import PopService
from broker_agent.pull_hold import PullHoldService
from broker_agent.schedule import DELAY_OFFSET_GROUP, ScheduleService, delayed_target
from broker_agent.store.message_store import (
    Dispatched,
    GetMessageStatus,
    MessageStore,
    StoreConfig,
)
from broker_agent.topics import TopicConfigManager
from broker_agent.transaction import TransactionService
from ha_controller import auth
from ha_controller.config import BrokerConfig
from ha_controller.proto import broker_pb2, common_pb2, nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    BadRequest,
    BrokerIsolated,
    HaError,
    InSyncReplicasNotEnough,
    NotMaster,
    SlaveAckTimeout,
    TopicNotFound,
)
from ha_controller.protocol.record import StoredMessage, make_msg_id, tag_hash
from ha_controller.routing import BrokerMemberGroup, Perm, TopicConfig
from ha_controller.rpc import ConnectionPool, Dispatcher, RequestContext, RpcConnection
from ha_controller.wire import (
    data_version_from_pb,
    data_version_to_pb,
    member_group_from_pb,
    topic_config_from_pb,
    topic_config_to_pb,
)

log = logging.getLogger(__name__)

CONSUMER_EXPIRY_S = 40.0
SLAVE_SYNC_INTERVAL_S = 2.0
MAX_PULL_BATCH = 256
# consumer offset commits travel through the commit log to the slaves
OFFSET_TOPIC = "rmq_sys_CONSUMER_OFFSETS"
# statuses that mean "nothing yet at this offset": a long-poll pull waits on them
WAITABLE = frozenset(
    {
        GetMessageStatus.NO_MATCHED_LOGIC_QUEUE,
        GetMessageStatus.NO_MESSAGE_IN_QUEUE,
        GetMessageStatus.OFFSET_OVERFLOW_ONE,
        GetMessageStatus.NO_MATCHED_MESSAGE,
        GetMessageStatus.OFFSET_FOUND_NULL,
    }
)


def now_ms() -> int:
    return int(time.time() * 1000)


def message_to_pb(m: StoredMessage, broker_name: str) -> broker_pb2.Message:
    return broker_pb2.Message(
        topic=m.topic,
        body=m.body,
        properties=m.properties,
        queue_id=m.queue_id,
        queue_offset=m.queue_offset,
        commit_log_offset=m.physical_offset,
        msg_id=make_msg_id(m.store_host, m.physical_offset),
        born_ts_ms=m.born_ts_ms,
        born_host=m.born_host,
        store_ts_ms=m.store_ts_ms,
        store_host=m.store_host,
        broker_name=broker_name,
        flag=m.flags,
    )


class ConsumerRegistry:
    """Which clients consume for a group (HEART_BEAT), for client-side rebalancing."""

    def __init__(self) -> None:
        self._seen: dict[str, dict[str, float]] = {}
        self._by_conn: dict[RpcConnection, set[tuple[str, str]]] = {}

    def heartbeat(self, conn: RpcConnection, client_id: str, groups: list[str]) -> None:
        now = time.monotonic()
        for g in groups:
            self._seen.setdefault(g, {})[client_id] = now
            self._by_conn.setdefault(conn, set()).add((g, client_id))

    def unregister(self, client_id: str, groups: list[str]) -> None:
        for g in groups:
            self._seen.get(g, {}).pop(client_id, None)

    def connection_closed(self, conn: RpcConnection) -> None:
        for g, c in self._by_conn.pop(conn, set()):
            self._seen.get(g, {}).pop(c, None)

    def clients(self, group: str) -> list[str]:
        now = time.monotonic()
        members = self._seen.get(group, {})
        for c in [c for c, t in members.items() if now - t > CONSUMER_EXPIRY_S]:
            del members[c]
        return sorted(members)


class BrokerService:
    """One broker: owns its store, HA side, acting state and background loops."""

    def __init__(self, cfg: BrokerConfig) -> None:
        self.cfg = cfg
        self.store_dir = Path(cfg.store_path)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.store = MessageStore.open(
            self.store_dir,
            StoreConfig(
                segment_size_bytes=cfg.segment_size_bytes,
                flush_mode=cfg.flush_mode,
                flush_interval_ms=cfg.flush_interval_ms,
                max_message_size_bytes=cfg.max_message_bytes,
            ),
        )
        self.topics = TopicConfigManager(
            self.store_dir / "topics.json", cfg.default_topic_queue_nums
        )
        self.topics.load()
        self.offsets = ConsumerOffsetManager(
            self.store_dir / "consumer_offsets.json", cfg.consumer_offset_update_version_step
        )
        self.offsets.load()
        self.acting = ActingState(cfg.broker_id, cfg.enable_slave_acting_master)
        self.metrics = BrokerMetrics(cfg.cluster, cfg.broker_name, cfg.broker_id)
        self.holds = PullHoldService(cfg.max_held_pulls, now_ms)
        self.consumers = ConsumerRegistry()
        self.pool = ConnectionPool(connect_timeout_ms=2000)
        self.dispatcher = Dispatcher()
        self.addr = ""  # advertised RPC address, set once bound
        self.ha_addr = ""
        self.http_addr = ""
        self.isolated = cfg.total_replicas > 1 and not cfg.skip_pre_online
        self.preonline_step = "waiting to start" if self.isolated else "online"
        self.ha_master: HaMaster | None = HaMaster(self.store) if cfg.is_master else None
        self.ha_slave: HaSlave | None = None
        self.member_group: BrokerMemberGroup | None = None
        self._queue_rr = itertools.count()
        self._tg: asyncio.TaskGroup | None = None
        self.special_service_hooks: list[Callable[[bool], None]] = []
        self.escape = EscapeBridge(self)
        self.schedule = ScheduleService(self, self.escape)
        self.locks = LockService(self)
        self._register_handlers()
        self.transactions = TransactionService(self)
        self.pop = PopService(self)
        self._update_role_metrics()

    # ---- wiring -----------------------------------------------------------

    def _register_handlers(self) -> None:
        d = self.dispatcher
        add = d.add
        add(RequestCode.SEND_MESSAGE, broker_pb2.SendMessageRequest, self._send)
        add(RequestCode.PULL_MESSAGE, broker_pb2.PullMessageRequest, self._pull)
        add(RequestCode.QUERY_CONSUMER_OFFSET, broker_pb2.ConsumerOffsetRequest, self._query_offset)
        add(
            RequestCode.UPDATE_CONSUMER_OFFSET,
            broker_pb2.ConsumerOffsetRequest,
            self._update_offset,
        )
        add(RequestCode.GET_MAX_OFFSET, broker_pb2.QueueOffsetRequest, self._max_offset)
        add(RequestCode.GET_MIN_OFFSET, broker_pb2.QueueOffsetRequest, self._min_offset)
        add(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, broker_pb2.QueueOffsetRequest, self._search)
        add(RequestCode.GET_EARLIEST_MSG_STORETIME, broker_pb2.QueueOffsetRequest, self._earliest)
        add(RequestCode.HEART_BEAT, broker_pb2.ClientHeartbeat, self._client_heartbeat)
        add(RequestCode.UNREGISTER_CLIENT, broker_pb2.ClientHeartbeat, self._client_unregister)
        add(RequestCode.GET_CONSUMER_LIST_BY_GROUP, broker_pb2.ConsumerListRequest, self._consumers)
        add(RequestCode.UPDATE_AND_CREATE_TOPIC, broker_pb2.CreateTopicRequest, self._create_topic)
        add(RequestCode.GET_ALL_TOPIC_CONFIG, common_pb2.Empty, self._all_topics)
        add(RequestCode.GET_ALL_CONSUMER_OFFSET, common_pb2.Empty, self._all_offsets)
        add(
            RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE,
            nameserver_pb2.NotifyMinBrokerIdChangeRequest,
            self._notify_min_id,
        )
        add(RequestCode.EXCHANGE_BROKER_HA_INFO, broker_pb2.BrokerHaInfo, self._exchange_ha_info)
        add(RequestCode.GET_BROKER_STATUS, common_pb2.Empty, self._status_rpc)
        self.locks.register(d)

    def on_connection_closed(self, conn: RpcConnection) -> None:
        self.consumers.connection_closed(conn)
        self.transactions.connection_closed(conn)

    # ---- status -----------------------------------------------------------

    def replication_lag(self) -> int:
        if self.ha_master is not None:
            return self.ha_master.lag_bytes()
        if self.ha_slave is not None:
            return self.ha_slave.lag_bytes
        return 0

    def status(self) -> dict[str, Any]:
        return {
            "cluster": self.cfg.cluster,
            "brokerName": self.cfg.broker_name,
            "brokerId": self.cfg.broker_id,
            "role": "master" if self.acting.is_master else "slave",
            "acting": self.acting.acting,
            "isolated": self.isolated,
            "preOnlineStep": self.preonline_step,
            "minBrokerIdInGroup": self.acting.min_broker_id,
            "commitLogMaxOffset": self.store.commitlog_max_offset,
            "replicationLagBytes": self.replication_lag(),
            "addr": self.addr,
            "haAddr": self.ha_addr,
            "slaves": (
                [
                    {"addr": link.slave_addr, "brokerId": link.broker_id, "ackedOffset": link.acked}
                    for link in self.ha_master.transfer_slaves()
                ]
                if self.ha_master is not None
                else []
            ),
        }

    def _update_role_metrics(self) -> None:
        self.metrics.set_role(self.acting.role)
        self.metrics.isolated.labels(**self.metrics.ident).set(1 if self.isolated else 0)
        self.metrics.min_broker_id.labels(**self.metrics.ident).set(self.acting.min_broker_id)

    def refresh_gauges(self) -> None:
        ident = self.metrics.ident
        self.metrics.replication_lag.labels(**ident).set(self.replication_lag())
        self.metrics.commitlog_max_offset.labels(**ident).set(self.store.commitlog_max_offset)
        self.metrics.pull_held.labels(**ident).set(self.holds.held_count)
        self._update_role_metrics()

    # ---- checks -----------------------------------------------------------

    def _check_online(self) -> None:
        if self.isolated:
            raise BrokerIsolated(f"{self.cfg.broker_name}/{self.cfg.broker_id} is in pre-online")

    def _check_master_only(self, what: str) -> None:
        self._check_online()
        if not self.acting.serves_master_only_ops:
            raise NotMaster(
                f"{what}: {self.cfg.broker_name}/{self.cfg.broker_id} is a slave and not acting"
            )

    def _topic_for_write(self, topic: str) -> TopicConfig:
        config = self.topics.get(topic)
        if config is None:
            if not self.cfg.auto_create_topic:
                raise TopicNotFound(f"topic {topic!r} does not exist on {self.cfg.broker_name}")
            config = self.topics.auto_create(topic)
            log.info("auto-created topic %s with %d queues", topic, config.write_queue_nums)
            self._schedule(self.register_all(), "register-after-topic")
        if not Perm.is_writeable(config.perm):
            raise BadRequest(f"topic {topic!r} is not writeable on {self.cfg.broker_name}")
        return config

    # ---- handlers: messages -----------------------------------------------

    async def _send(
        self, ctx: RequestContext, req: broker_pb2.SendMessageRequest
    ) -> broker_pb2.SendMessageResponse:
        self._check_online()
        if not self.acting.is_master:
            self.metrics.send_errors.labels(**self.metrics.ident, reason="not_master").inc()
            raise NotMaster(
                f"{self.cfg.broker_name}/{self.cfg.broker_id} is a slave; send to the master"
            )
        if not req.entries:
            raise BadRequest("send with no messages")
        config = self._topic_for_write(req.topic)
        queue_id = req.queue_id
        if queue_id < 0:
            queue_id = next(self._queue_rr) % config.write_queue_nums
        elif queue_id >= config.write_queue_nums:
            raise BadRequest(f"queue {queue_id} out of range for {req.topic}")
        needed = self._copies_needed()
        assert self.ha_master is not None
        if needed > 1 and 1 + self.ha_master.slave_count() < needed:
            self.metrics.send_errors.labels(**self.metrics.ident, reason="replicas").inc()
            raise InSyncReplicasNotEnough(
                f"{1 + self.ha_master.slave_count()} live copies, {needed} required"
            )
        resp = broker_pb2.SendMessageResponse(broker_name=self.cfg.broker_name)
        end = 0
        for entry in req.entries:
            props = dict(entry.properties)
            put_topic, put_qid = self.transactions.store_target(req.topic, queue_id, props)
            if put_topic == req.topic:  # a half message is not delayed until committed
                put_topic, put_qid = delayed_target(self.cfg, req.topic, queue_id, props)
            result = self.store.put(
                put_topic,
                put_qid,
                entry.body,
                props,
                flags=entry.flag,
                born_ts_ms=entry.born_ts_ms or None,
                born_host=req.born_host or ctx.peer,
                store_host=self.addr,
            )
            end = result.physical_offset + result.size
            self.holds.notify(
                put_topic, put_qid, result.queue_offset + 1, tag_hash(props.get("TAGS"))
            )
            resp.results.add(
                msg_id=result.msg_id,
                uniq_key=props.get("UNIQ_KEY", ""),
                queue_id=queue_id,
                queue_offset=result.queue_offset,
                commit_log_offset=result.physical_offset,
            )
        self.ha_master.data_appended()
        self.metrics.messages_in.labels(**self.metrics.ident, topic=req.topic).inc(len(req.entries))
        if needed > 1 and not req.no_replica_wait:
            ok = await self.ha_master.wait_for_copies(
                end, needed, self.cfg.slave_ack_timeout_ms / 1000
            )
            if not ok:
                self.metrics.send_errors.labels(
                    **self.metrics.ident, reason="replica_timeout"
                ).inc()
                raise SlaveAckTimeout(
                    f"stored but not confirmed by {needed - 1} slave(s) within "
                    f"{self.cfg.slave_ack_timeout_ms} ms"
                )
        return resp

    def _copies_needed(self) -> int:
        if self.cfg.replication_mode != "sync":
            return 1
        return min(self.cfg.in_sync_replicas, self.cfg.total_replicas)

    async def _pull(
        self, ctx: RequestContext, req: broker_pb2.PullMessageRequest
    ) -> broker_pb2.PullMessageResponse:
        self._check_online()
        tags = {tag_hash(t) for t in req.tags if t and t != "*"} or None
        max_msgs = max(1, min(req.max_msg_nums or 32, MAX_PULL_BATCH))
        max_bytes = req.max_bytes or 4 * 1024 * 1024
        if req.commit_offset >= 0 and req.consumer_group and self.acting.serves_master_only_ops:
            self.commit_consumer_offset(
                req.consumer_group, req.topic, req.queue_id, req.commit_offset
            )
        result = self.store.get_messages(
            req.topic, req.queue_id, req.queue_offset, max_msgs, max_bytes, tags
        )
        held = req.suspend_timeout_ms > 0 and self.cfg.long_polling_enable
        # A slave asked past its end is behind (the consumer read further on the master
        # before a failover, or a partition): wait for replication, never send the
        # consumer back (RocketMQ's offsetCheckInSlave=false), or it reads twice.
        behind = (
            not self.acting.is_master
            and result.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY
            and req.queue_offset > result.max_offset
        )
        if held and (result.status in WAITABLE or behind):
            offset = req.queue_offset
            if result.status is GetMessageStatus.NO_MATCHED_MESSAGE:
                offset = result.next_begin_offset
            timeout = min(
                req.suspend_timeout_ms, max(0, ctx.timeout_ms - 1000) or req.suspend_timeout_ms
            )
            self.metrics.pull_held.labels(**self.metrics.ident).set(self.holds.held_count + 1)
            await self.holds.hold(req.topic, req.queue_id, offset, timeout, tags)
            self.metrics.pull_held.labels(**self.metrics.ident).set(self.holds.held_count)
            result = self.store.get_messages(
                req.topic, req.queue_id, offset, max_msgs, max_bytes, tags
            )
        if behind and result.status is GetMessageStatus.OFFSET_OVERFLOW_BADLY:
            return broker_pb2.PullMessageResponse(
                status=broker_pb2.NO_NEW_MSG,
                next_begin_offset=req.queue_offset,
                min_offset=result.min_offset,
                max_offset=result.max_offset,
            )
        resp = broker_pb2.PullMessageResponse(
            next_begin_offset=result.next_begin_offset,
            min_offset=result.min_offset,
            max_offset=result.max_offset,
        )
        status = result.status
        if status is GetMessageStatus.FOUND:
            resp.status = broker_pb2.FOUND
            resp.messages.extend(message_to_pb(m, self.cfg.broker_name) for m in result.messages)
            self.metrics.messages_out.labels(
                **self.metrics.ident, topic=req.topic, group=req.consumer_group or "-"
            ).inc(len(result.messages))
        elif status is GetMessageStatus.NO_MATCHED_MESSAGE:
            resp.status = broker_pb2.NO_MATCHED_MSG
        elif status in WAITABLE:
            resp.status = broker_pb2.NO_NEW_MSG
        else:
            resp.status = broker_pb2.OFFSET_ILLEGAL
        if not self.acting.is_master and self.acting.master_online:
            resp.suggest_which_broker_id = 0
        return resp

    # ---- handlers: offsets and queries ------------------------------------

    async def _query_offset(
        self, ctx: RequestContext, req: broker_pb2.ConsumerOffsetRequest
    ) -> broker_pb2.OffsetResponse:
        self._check_online()
        return broker_pb2.OffsetResponse(
            offset=self.offsets.query(req.consumer_group, req.topic, req.queue_id)
        )

    async def _update_offset(
        self, ctx: RequestContext, req: broker_pb2.ConsumerOffsetRequest
    ) -> common_pb2.Empty:
        self._check_master_only("UPDATE_CONSUMER_OFFSET")
        if req.offset < 0:
            raise BadRequest("offset must be >= 0")
        end = self.commit_consumer_offset(req.consumer_group, req.topic, req.queue_id, req.offset)
        needed = self._copies_needed()
        if end is not None and needed > 1 and self.ha_master is not None:
            # best effort: a committed offset should reach the slave that may act next
            await self.ha_master.wait_for_copies(end, needed, self.cfg.slave_ack_timeout_ms / 1000)
        return common_pb2.Empty()

    def commit_consumer_offset(
        self, group: str, topic: str, queue_id: int, offset: int
    ) -> int | None:
        """Commit a consumer offset; on the master also append it to the commit log so
        it replicates to the slaves with the same durability as messages (an acting
        slave then knows every committed offset, not only the last periodic sync).
        Returns the commit-log end offset of that record, if one was written."""
        self.offsets.commit(group, topic, queue_id, offset)
        return self.replicate_offset(group, topic, queue_id, offset)

    def replicate_offset(self, group: str, topic: str, queue_id: int, offset: int) -> int | None:
        """On the master, append an offset record to the commit log (slaves apply it)."""
        if not self.acting.is_master or self.ha_master is None:
            return None
        result = self.store.put(
            OFFSET_TOPIC,
            0,
            b"",
            {"G": group, "T": topic, "Q": str(queue_id), "O": str(offset)},
            store_host=self.addr,
        )
        self.ha_master.data_appended()
        return result.physical_offset + result.size

    async def _max_offset(
        self, ctx: RequestContext, req: broker_pb2.QueueOffsetRequest
    ) -> broker_pb2.OffsetResponse:
        self._check_master_only("GET_MAX_OFFSET")
        return broker_pb2.OffsetResponse(offset=self.store.max_offset(req.topic, req.queue_id))

    async def _min_offset(
        self, ctx: RequestContext, req: broker_pb2.QueueOffsetRequest
    ) -> broker_pb2.OffsetResponse:
        self._check_master_only("GET_MIN_OFFSET")
        return broker_pb2.OffsetResponse(offset=self.store.min_offset(req.topic, req.queue_id))

    async def _search(
        self, ctx: RequestContext, req: broker_pb2.QueueOffsetRequest
    ) -> broker_pb2.OffsetResponse:
        self._check_master_only("SEARCH_OFFSET_BY_TIMESTAMP")
        return broker_pb2.OffsetResponse(
            offset=self.store.search_offset(req.topic, req.queue_id, req.timestamp_ms)
        )

    async def _earliest(
        self, ctx: RequestContext, req: broker_pb2.QueueOffsetRequest
    ) -> broker_pb2.TimestampResponse:
        self._check_master_only("GET_EARLIEST_MSG_STORETIME")
        ts = self.store.earliest_msg_store_time(req.topic, req.queue_id)
        return broker_pb2.TimestampResponse(timestamp_ms=-1 if ts is None else ts)

    async def _client_heartbeat(
        self, ctx: RequestContext, req: broker_pb2.ClientHeartbeat
    ) -> common_pb2.Empty:
        self.consumers.heartbeat(ctx.conn, req.client_id, list(req.consumer_groups))
        self.transactions.producer_seen(ctx.conn, list(req.producer_groups))
        return common_pb2.Empty()

    async def _client_unregister(
        self, ctx: RequestContext, req: broker_pb2.ClientHeartbeat
    ) -> common_pb2.Empty:
        self.consumers.unregister(req.client_id, list(req.consumer_groups))
        return common_pb2.Empty()

    async def _consumers(
        self, ctx: RequestContext, req: broker_pb2.ConsumerListRequest
    ) -> broker_pb2.ConsumerListResponse:
        return broker_pb2.ConsumerListResponse(
            client_ids=self.consumers.clients(req.consumer_group)
        )

    async def _create_topic(
        self, ctx: RequestContext, req: broker_pb2.CreateTopicRequest
    ) -> common_pb2.Empty:
        self._check_online()
        if not self.acting.is_master:
            raise NotMaster("topics are created on masters")
        config = topic_config_from_pb(req.topic)
        if config.read_queue_nums < 1 or config.write_queue_nums < 1:
            raise BadRequest("a topic needs at least one queue")
        if self.topics.upsert(config):
            log.info("topic %s created/updated: %s", config.topic_name, config)
            await self.register_all()
        return common_pb2.Empty()

    async def _all_topics(
        self, ctx: RequestContext, req: common_pb2.Empty
    ) -> broker_pb2.TopicConfigTable:
        return broker_pb2.TopicConfigTable(
            topics=[topic_config_to_pb(t) for t in self.topics.topics.values()],
            data_version=data_version_to_pb(self.topics.data_version),
        )

    async def _all_offsets(
        self, ctx: RequestContext, req: common_pb2.Empty
    ) -> broker_pb2.ConsumerOffsetTable:
        return broker_pb2.ConsumerOffsetTable(
            entries=[
                broker_pb2.ConsumerOffsetEntry(consumer_group=g, topic=t, queue_id=q, offset=o)
                for g, t, q, o in self.offsets.entries()
            ],
            data_version=data_version_to_pb(self.offsets.data_version),
        )

    async def _status_rpc(
        self, ctx: RequestContext, req: common_pb2.Empty
    ) -> broker_pb2.BrokerStatus:
        import json

        return broker_pb2.BrokerStatus(json=json.dumps(self.status()))

    # ---- handlers: membership --------------------------------------------

    async def _notify_min_id(
        self, ctx: RequestContext, req: nameserver_pb2.NotifyMinBrokerIdChangeRequest
    ) -> common_pb2.Empty:
        if not self.isolated:
            await self.apply_min_broker(
                req.min_broker_id,
                req.min_broker_addr or None,
                req.offline_broker_addr or None,
                req.ha_broker_addr or None,
            )
        return common_pb2.Empty()

    async def _exchange_ha_info(
        self, ctx: RequestContext, req: broker_pb2.BrokerHaInfo
    ) -> broker_pb2.BrokerHaInfo:
        if req.master_ha_addr:
            # a (returning) master tells this slave where to replicate from
            if not self.acting.is_master and self.ha_slave is not None:
                self.acting.master_addr = req.master_addr or self.acting.master_addr
                self.acting.master_ha_addr = req.master_ha_addr
                self.ha_slave.set_master(req.master_ha_addr)
            return broker_pb2.BrokerHaInfo()
        if not self.acting.is_master:
            return broker_pb2.BrokerHaInfo()
        return broker_pb2.BrokerHaInfo(
            master_ha_addr=self.ha_addr,
            master_flush_offset=self.store.commitlog_max_offset,
            master_addr=self.addr,
        )

    async def apply_min_broker(
        self, min_id: int, min_addr: str | None, offline: str | None, ha_addr: str | None
    ) -> Decision:
        decision = self.acting.on_min_broker_change(min_id, min_addr, offline, ha_addr)
        if not decision.changed:
            return decision
        log.info("%s", decision)
        if decision.master_offline and self.ha_slave is not None:
            self.ha_slave.set_master(None)
        if decision.start_special_services:
            self.offsets.bump_on_next_commit()
        if decision.start_special_services or decision.stop_special_services:
            self.change_special_service_status(decision.start_special_services)
        if decision.master_online and min_addr is not None and self.ha_slave is not None:
            if not ha_addr:
                ha_addr = await self._retrieve_master_ha(min_addr)
            if ha_addr:
                self.acting.master_ha_addr = ha_addr
                self.ha_slave.set_master(ha_addr)
            self.holds.notify_master_online()
        self._update_role_metrics()
        return decision

    def change_special_service_status(self, should_run: bool) -> None:
        """Start/stop the special services (rip32.md §2.6); a master runs them once online."""
        for hook in self.special_service_hooks:
            hook(should_run)

    async def _retrieve_master_ha(self, master_addr: str) -> str | None:
        try:
            info = await self.pool.call_pb(
                master_addr,
                RequestCode.EXCHANGE_BROKER_HA_INFO,
                broker_pb2.BrokerHaInfo(),
                broker_pb2.BrokerHaInfo,
                timeout_ms=3000,
            )
        except HaError as exc:
            log.info("cannot retrieve HA info from master %s: %s", master_addr, exc)
            return None
        return info.master_ha_addr or None

    # ---- nameserver life cycle --------------------------------------------

    def _register_request(self) -> nameserver_pb2.RegisterBrokerRequest:
        cfg = self.cfg
        ts = now_ms()
        req = nameserver_pb2.RegisterBrokerRequest(
            cluster=cfg.cluster,
            broker_addr=self.addr,
            broker_name=cfg.broker_name,
            broker_id=cfg.broker_id,
            ha_addr=self.ha_addr,
            topic_configs=[topic_config_to_pb(t) for t in self.topics.topics.values()],
            data_version=data_version_to_pb(self.topics.data_version),
            timestamp_ms=ts,
            enable_acting_master=cfg.enable_slave_acting_master,
        )
        if cfg.enable_slave_acting_master:
            req.heartbeat_timeout_ms = cfg.broker_not_active_timeout_ms
        if cfg.cluster_secret:
            req.signature = auth.sign(
                cfg.cluster_secret,
                auth.canonical(
                    "register", cfg.cluster, self.addr, cfg.broker_name, cfg.broker_id, ts
                ),
            )
        return req

    async def register_all(self) -> None:
        """Register with every nameserver (in parallel); never while isolated."""
        if self.isolated:
            return
        req = self._register_request()

        async def one(ns: str) -> None:
            try:
                conn = await self.pool.get(ns)
                resp = await conn.call_pb(
                    RequestCode.REGISTER_BROKER,
                    req,
                    nameserver_pb2.RegisterBrokerResponse,
                    timeout_ms=self.cfg.register_broker_timeout_ms,
                )
            except HaError as exc:
                log.warning("registration with %s failed: %s", ns, exc)
                return
            conn.attrs["registered"] = True
            if not self.acting.is_master and resp.master_addr:
                self.acting.master_addr = resp.master_addr
                if resp.master_ha_addr and self.ha_slave is not None:
                    self.acting.master_ha_addr = resp.master_ha_addr
                    self.ha_slave.set_master(resp.master_ha_addr)

        await asyncio.gather(*(one(ns) for ns in self.cfg.namesrv_addrs))

    async def _heartbeat_loop(self) -> None:
        interval = self.cfg.broker_heartbeat_interval_ms / 1000
        body = nameserver_pb2.BrokerHeartbeatRequest(
            cluster=self.cfg.cluster, broker_addr=self.addr, broker_name=self.cfg.broker_name
        ).SerializeToString()
        while True:
            await asyncio.sleep(interval)
            if self.isolated:
                continue
            for ns in self.cfg.namesrv_addrs:
                try:
                    conn = await self.pool.get(ns)
                    if not conn.attrs.get("registered"):
                        # a new connection: the nameserver expired us with the old one
                        await self.register_all()
                        continue
                    if self.cfg.compatible_with_old_namesrv:
                        await conn.call_pb(
                            RequestCode.QUERY_DATA_VERSION,
                            nameserver_pb2.QueryDataVersionRequest(
                                cluster=self.cfg.cluster,
                                broker_addr=self.addr,
                                broker_name=self.cfg.broker_name,
                                broker_id=self.cfg.broker_id,
                                data_version=data_version_to_pb(self.topics.data_version),
                            ),
                            nameserver_pb2.QueryDataVersionResponse,
                            timeout_ms=self.cfg.send_heartbeat_timeout_ms,
                        )
                    else:
                        conn.oneway(RequestCode.BROKER_HEARTBEAT, body)
                except HaError as exc:
                    log.debug("heartbeat to %s failed: %s", ns, exc)

    async def _register_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.register_name_server_period_ms / 1000)
            await self.register_all()

    async def fetch_member_group(self) -> BrokerMemberGroup | None:
        for ns in self.cfg.namesrv_addrs:
            try:
                pb = await self.pool.call_pb(
                    ns,
                    RequestCode.GET_BROKER_MEMBER_GROUP,
                    nameserver_pb2.GetBrokerMemberGroupRequest(
                        cluster=self.cfg.cluster, broker_name=self.cfg.broker_name
                    ),
                    nameserver_pb2.BrokerMemberGroup,
                    timeout_ms=2000,
                )
            except HaError as exc:
                log.debug("member group from %s failed: %s", ns, exc)
                continue
            return member_group_from_pb(pb)
        return None

    async def _member_group_loop(self) -> None:
        """The 1 s backstop for min-id notifications (rip32.md §2.4)."""
        while True:
            await asyncio.sleep(self.cfg.sync_broker_member_group_period_ms / 1000)
            if self.isolated:
                continue
            group = await self.fetch_member_group()
            if group is None or not group.broker_addrs:
                continue
            self.member_group = group
            min_id = group.minimum_broker_id()
            await self.apply_min_broker(min_id, group.broker_addrs.get(min_id), None, None)

    async def _slave_sync_loop(self) -> None:
        """Forward sync on a slave: topics and consumer offsets from the master."""
        while True:
            await asyncio.sleep(SLAVE_SYNC_INTERVAL_S)
            master = self.acting.master_addr
            if self.acting.acting or not self.acting.master_online or master is None:
                continue
            try:
                table = await self.pool.call_pb(
                    master,
                    RequestCode.GET_ALL_TOPIC_CONFIG,
                    common_pb2.Empty(),
                    broker_pb2.TopicConfigTable,
                    timeout_ms=3000,
                )
                offsets = await self.pool.call_pb(
                    master,
                    RequestCode.GET_ALL_CONSUMER_OFFSET,
                    common_pb2.Empty(),
                    broker_pb2.ConsumerOffsetTable,
                    timeout_ms=3000,
                )
            except HaError as exc:
                log.debug("slave sync from %s failed: %s", master, exc)
                continue
            changed = False
            for pb in table.topics:
                changed |= self.topics.upsert(topic_config_from_pb(pb))
            if changed:
                self.topics.data_version.assign(data_version_from_pb(table.data_version))
                self.topics.persist()
                await self.register_all()
            self.offsets.assign_from_master(
                [(e.consumer_group, e.topic, e.queue_id, e.offset) for e in offsets.entries],
                data_version_from_pb(offsets.data_version),
            )
            await self.schedule.sync_from_master(master)

    # ---- pre-online ---------------------------------------------------------

    async def preonline(self) -> None:
        """Stay isolated (unregistered, /readyz 503) until it is safe to serve.

        A master reverse-syncs the newer metadata of each slave (rip32.md §5), retrying
        from the slave that failed; a slave waits for its HA link to an online master.
        """
        cycle = 0
        synced: set[int] = set()
        while self.isolated:
            self.preonline_step = "reading member group"
            group = await self.fetch_member_group()
            if group is None:
                why: str | None = "no nameserver answered"
            elif self.acting.is_master:
                why = await self._preonline_master(group, synced)
            else:
                why = await self._preonline_slave(group)
            if why is not None:
                self._preonline_wait(why, cycle)
                cycle += 1
                await asyncio.sleep(1.0)
                continue
            self.isolated = False
            self.preonline_step = "online"
            log.info("pre-online done: registering as %s", self.acting.role)
            if group is not None and not self.acting.is_master:
                min_id = min((i for i in group.broker_addrs), default=self.cfg.broker_id)
                min_id = min(min_id, self.cfg.broker_id)
                min_addr = group.broker_addrs.get(min_id, self.addr)
                await self.apply_min_broker(min_id, min_addr, None, None)
            self._update_role_metrics()
            self.change_special_service_status(self.acting.serves_master_only_ops)
            await self.register_all()

    async def _preonline_master(self, group: BrokerMemberGroup, synced: set[int]) -> str | None:
        """Sync from each slave not synced yet; the reason to wait, or None when done."""
        slaves = sorted((i, a) for i, a in group.broker_addrs.items() if i != self.cfg.broker_id)
        for slave_id, slave_addr in slaves:
            if slave_id in synced:
                continue
            try:
                await self._sync_from_slave(slave_id, slave_addr)
            except HaError as exc:
                self.metrics.preonline_syncs.labels(**self.metrics.ident, result="failed").inc()
                return f"slave {slave_id} at {slave_addr}: {exc}"
            synced.add(slave_id)
        log.info("pre-online: %d slave(s) synced", len(synced))
        return None

    async def _preonline_slave(self, group: BrokerMemberGroup) -> str | None:
        """With the master online, wait for the HA link (10 s) before serving."""
        master_addr = group.broker_addrs.get(0)
        if master_addr is None or self.ha_slave is None:
            return None  # no master online: start directly
        self.preonline_step = "retrieving the master's HA address"
        ha_addr = await self._retrieve_master_ha(master_addr)
        if ha_addr is None:
            return f"master {master_addr} does not answer EXCHANGE_BROKER_HA_INFO"
        self.acting.master_addr = master_addr
        self.acting.master_ha_addr = ha_addr
        self.ha_slave.set_master(ha_addr)
        self.preonline_step = f"waiting for the HA link to {ha_addr}"
        try:
            async with asyncio.timeout(10.0):
                await self.ha_slave.transfer_ok.wait()
        except TimeoutError:
            return f"no HA transfer from master {ha_addr} within 10 s"
        return None

    def _preonline_wait(self, why: str, cycle: int) -> None:
        self.preonline_step = f"waiting: {why}"
        log.warning("pre-online cycle %d: staying isolated: %s", cycle + 1, why)

    async def _sync_from_slave(self, slave_id: int, slave_addr: str) -> None:
        self.preonline_step = f"exchanging HA info with slave {slave_id}"
        await self.pool.call_pb(
            slave_addr,
            RequestCode.EXCHANGE_BROKER_HA_INFO,
            broker_pb2.BrokerHaInfo(
                master_ha_addr=self.ha_addr,
                master_flush_offset=self.store.commitlog_max_offset,
                master_addr=self.addr,
            ),
            broker_pb2.BrokerHaInfo,
            timeout_ms=3000,
        )
        self.preonline_step = f"waiting for slave {slave_id} HA link"
        host = slave_addr.rsplit(":", 1)[0]
        assert self.ha_master is not None
        deadline = time.monotonic() + 10.0
        while not self.ha_master.has_transfer_link(host):
            if time.monotonic() > deadline:
                raise BadRequest(f"slave {slave_id} did not attach to the HA port within 10 s")
            await asyncio.sleep(0.05)
        self.preonline_step = f"pulling metadata from slave {slave_id}"
        table = await self.pool.call_pb(
            slave_addr,
            RequestCode.GET_ALL_CONSUMER_OFFSET,
            common_pb2.Empty(),
            broker_pb2.ConsumerOffsetTable,
            timeout_ms=3000,
        )
        theirs = data_version_from_pb(table.data_version)
        ours = self.offsets.data_version.copy()
        adopted = self.offsets.adopt_if_newer(
            [(e.consumer_group, e.topic, e.queue_id, e.offset) for e in table.entries], theirs
        )
        log.info(
            "pre-online: consumer offsets of slave %d %s (theirs %s, ours was %s)",
            slave_id,
            "adopted" if adopted else "older, kept ours",
            theirs.key(),
            ours.key(),
        )
        await self.schedule.adopt_from_slave(slave_id, slave_addr)
        await self.transactions.sync_from_slave(slave_id, slave_addr)
        self.metrics.preonline_syncs.labels(**self.metrics.ident, result="ok").inc()

    # ---- background ---------------------------------------------------------

    def _schedule(self, coro: Any, name: str) -> None:
        if self._tg is not None:
            self._tg.create_task(coro, name=name)
        else:
            coro.close()

    def _on_dispatched(self, dispatched: list[Dispatched]) -> None:
        for d in dispatched:
            if d.topic == OFFSET_TOPIC:
                self._apply_replicated_offset(d.queue_offset)
                continue
            self.holds.notify(d.topic, d.queue_id, d.queue_offset + 1, d.tag_hash)

    def _apply_replicated_offset(self, queue_offset: int) -> None:
        if self.acting.acting:
            return  # while acting our own table is the newest
        m = self.store.get_message_at(OFFSET_TOPIC, 0, queue_offset)
        if m is None:
            return
        p = m.properties
        try:
            if p["G"] == DELAY_OFFSET_GROUP:
                self.schedule.delay_offsets.apply_replicated(int(p["Q"]), int(p["O"]))
                return
            self.offsets.apply_replicated(p["G"], p["T"], int(p["Q"]), int(p["O"]))
        except (KeyError, ValueError):
            log.warning("malformed replicated offset record at %d: %s", queue_offset, p)

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.flush_interval_ms / 1000)
            await asyncio.to_thread(self.store.flush)
            await asyncio.to_thread(self.offsets.persist)

    async def _metric_targets_loop(self) -> None:
        while True:
            with contextlib.suppress(HaError):
                await self.escape.init_metric_targets()
            await asyncio.sleep(10.0)

    async def _hold_check_loop(self) -> None:
        interval = (
            self.cfg.long_polling_check_interval_ms
            if self.cfg.long_polling_enable
            else self.cfg.short_polling_check_interval_ms
        ) / 1000
        while True:
            await asyncio.sleep(interval)
            self.holds.check_all(self.store.max_offset)
            self.consumers.clients("")  # expire idle consumer entries lazily

    async def run(self, stop: asyncio.Event) -> None:
        """Run every background loop until ``stop`` is set, then shut down in phases."""
        if not self.acting.is_master:
            self.ha_slave = HaSlave(self.store, self.addr, self.cfg.broker_id, self._on_dispatched)
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                loops = [
                    tg.create_task(self._heartbeat_loop(), name="heartbeat"),
                    tg.create_task(self._register_loop(), name="register"),
                    tg.create_task(self._member_group_loop(), name="member-group"),
                    tg.create_task(self._flush_loop(), name="flush"),
                    tg.create_task(self._hold_check_loop(), name="hold-check"),
                    tg.create_task(self._metric_targets_loop(), name="metric-targets"),
                    tg.create_task(self.schedule.run(), name="schedule"),
                    tg.create_task(self.transactions.run(), name="transaction-check"),
                    tg.create_task(self.pop.run(), name="pop-revive"),
                ]
                if self.ha_slave is not None:
                    loops.append(tg.create_task(self.ha_slave.run(), name="ha-slave"))
                    loops.append(tg.create_task(self._slave_sync_loop(), name="slave-sync"))
                if self.isolated:
                    loops.append(tg.create_task(self.preonline(), name="pre-online"))
                else:
                    self.change_special_service_status(self.acting.is_master)
                    await self.register_all()
                await stop.wait()
                for task in loops:
                    task.cancel()
        finally:
            self._tg = None
            await self.shutdown()

    async def unregister_all(self) -> None:
        cfg = self.cfg
        ts = now_ms()
        req = nameserver_pb2.UnregisterBrokerRequest(
            cluster=cfg.cluster,
            broker_addr=self.addr,
            broker_name=cfg.broker_name,
            broker_id=cfg.broker_id,
            timestamp_ms=ts,
        )
        if cfg.cluster_secret:
            req.signature = auth.sign(
                cfg.cluster_secret,
                auth.canonical(
                    "unregister", cfg.cluster, self.addr, cfg.broker_name, cfg.broker_id, ts
                ),
            )
        for ns in cfg.namesrv_addrs:
            with contextlib.suppress(HaError):
                await self.pool.call_pb(
                    ns, RequestCode.UNREGISTER_BROKER, req, common_pb2.Empty, timeout_ms=1000
                )

    async def shutdown(self) -> None:
        if not self.isolated:
            await self.unregister_all()
        self.holds.close()
        if self.ha_slave is not None:
            await self.ha_slave.aclose()
        if self.ha_master is not None:
            await self.ha_master.aclose()
        await self.pool.aclose()
        self.offsets.persist()
        self.store.close()
