"""Broker metrics (docs/http-and-metrics.md); every series carries the broker's identity."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from broker_agent.lag import QueueLag, bound_queues, by_topic
from ha_controller.auth import HA_REASONS, RPC_REASONS
from ha_controller.protocol.codes import method_name
from ha_controller.rpc.metrics import RpcCollector
from ha_controller.rpc.server import RpcServer

ESCAPE_KINDS = (
    "delay",
    "timer",
    "transaction",
    "transaction_half",
    "pop_ck",
    "pop_ack",
    "pop_retry",
)
ESCAPE_RESULTS = ("ok", "error", "unknown", "unconfirmed", "no_target")


class BrokerMetrics:
    def __init__(self, cluster: str, broker_name: str, broker_id: int) -> None:
        self.registry = CollectorRegistry()
        ident = {"cluster": cluster, "broker_name": broker_name, "broker_id": str(broker_id)}
        names = list(ident)

        def gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> Gauge:
            return Gauge(name, doc, [*names, *labels], registry=self.registry)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, [*names, *labels], registry=self.registry)

        self.ident = ident
        self.role = gauge("hac_broker_role", "1 for the broker's current role", ("role",))
        self.isolated = gauge("hac_broker_isolated", "1 while the broker is in pre-online")
        self.messages_in = counter("hac_messages_in", "Messages stored by sends", ("topic",))
        self.messages_out = counter(
            "hac_messages_out", "Messages returned to consumers", ("topic", "group")
        )
        self.replication_lag = gauge(
            "hac_replication_lag_bytes", "Commit-log bytes not yet on the furthest-behind copy"
        )
        self.timer_pending = gauge(
            "hac_timer_messages_pending",
            "Undelivered timer messages the timer holds in memory (about 360 bytes each)",
        )
        self.commitlog_max_offset = gauge(
            "hac_commitlog_max_offset_bytes", "End of the local commit log"
        )
        self.store_writable = gauge(
            "hac_store_writable",
            "1 while the store takes appends; 0 when it is full or read-only "
            "(a master refuses sends, a slave stops replicating)",
        )
        self.store_free_bytes = gauge(
            "hac_store_free_bytes", "Free bytes of the store's file system at the last sample"
        )
        self.key_index_entries = gauge(
            "hac_key_index_entries", "Keys and unique keys the key index holds now"
        )
        self.key_index_overflow = gauge(
            "hac_key_index_overflow",
            "Keys not indexed since the broker started because the index held "
            "key_index_max_entries",
        )
        self.store_bytes = gauge(
            "hac_store_bytes",
            "Bytes the store keeps: the commit log's span (file=commitlog) and the "
            "consume-queue files (file=consumequeue)",
            ("file",),
        )
        self.store_deleted_bytes = counter(
            "hac_store_deleted_bytes", "Bytes of store files deleted by retention", ("file",)
        )
        self.store_deleted = counter(
            "hac_store_deleted_segments",
            "Store files deleted by retention: commit-log segments, consume-queue files",
            ("file",),
        )
        self.records_repaired = counter(
            "hac_store_records_repaired",
            "Damaged commit-log records of this broker: copied back from a replica "
            "(result=repaired, records) or no replica had an intact copy "
            "(result=unrepairable, ranges; they stay refused to readers)",
            ("result",),
        )
        self.damaged_ranges = gauge(
            "hac_store_damaged_ranges",
            "Commit-log ranges this broker refuses to serve until a replica's copy is written back",
        )
        self.escape = counter(
            "hac_escape_messages",
            "Messages sent through the escape bridge",
            ("kind", "target", "result"),
        )
        self.lock_requests = counter("hac_lock_requests", "Queue lock requests", ("mode", "result"))
        self.preonline_syncs = counter(
            "hac_preonline_syncs", "Pre-online metadata syncs from slaves", ("result",)
        )
        self.fenced = counter(
            "hac_broker_fenced",
            "Times this master fenced itself (lease lost or told it was expired)",
        )
        self.pull_held = gauge("hac_pull_held_requests", "Long-poll pulls currently held")
        self.send_errors = counter("hac_send_errors", "Refused or failed sends", ("reason",))
        self.min_broker_id = gauge("hac_min_broker_id_in_group", "Lowest live id this broker knows")
        self.epoch = gauge(
            "hac_broker_epoch",
            "Controller mode: the last epoch of this broker's commit log (0 without a controller)",
        )
        self.sync_state_set_size = gauge(
            "hac_broker_sync_state_set_size",
            "Controller mode, master: members of its confirmed sync-state set, itself included",
        )
        for role in ("master", "slave", "acting"):
            self.role.labels(**ident, role=role).set(0)
        # Counters exist at 0 from the start: a counter that appears only on its first
        # increment hides that first event from rate() and increase().
        for result in ("ok", "failed"):
            self.preonline_syncs.labels(**ident, result=result)
        self.fenced.labels(**ident)
        for result in ("repaired", "unrepairable"):
            self.records_repaired.labels(**ident, result=result)
        self.damaged_ranges.labels(**ident).set(0)
        for mode in ("local", "strict", "peer"):
            for result in ("granted", "partial", "refused", "no_quorum"):
                self.lock_requests.labels(**ident, mode=mode, result=result)
        for reason in ("not_master", "replicas", "replica_timeout", "not_writable"):
            self.send_errors.labels(**ident, reason=reason)
        for kind in ("commitlog", "consumequeue"):
            self.store_bytes.labels(**ident, file=kind).set(0)
            self.store_deleted_bytes.labels(**ident, file=kind)
            self.store_deleted.labels(**ident, file=kind)
        self._escape_targets: set[str] = set()
        for target in ("local", "none"):
            self.init_escape_target(target)
        self.isolated.labels(**ident).set(0)
        self.store_writable.labels(**ident).set(1)
        self.epoch.labels(**ident).set(0)
        # cluster authentication (ha_controller.auth): control requests and the HA port
        self.auth_refused = counter(
            "hac_auth_refused_total",
            "Control-plane requests refused by cluster authentication (reason: unsigned, "
            "bad_signature, stale, replayed, replay_cache_full; HA port: "
            "ha_unauthenticated, ha_bad_signature, ha_offset_beyond_max)",
            ("reason",),
        )
        for reason in (*RPC_REASONS, *HA_REASONS):
            self.auth_refused.labels(**ident, reason=reason)
        # the client ACL (ha_controller.acl)
        self.acl_denied = counter(
            "hac_acl_denied_total",
            "Client requests refused by the ACL, by request code and reason (anonymous, "
            "unknown_user, bad_signature, stale, no_permission)",
            ("code", "reason"),
        )

    def export_consumer_lag(
        self,
        read: Callable[[], Sequence[QueueLag] | None],
        now_ms: Callable[[], int],
        max_queue_series: int,
    ) -> None:
        """``rocketmq_consumer_lag_*`` and ``hac_consumer_queue_*``, computed at scrape
        time from ``read()`` (None: this broker does not export them now)."""
        self.registry.register(ConsumerLagCollector(read, now_ms, max_queue_series, self.ident))

    def export_rpc(self, servers: Callable[[], Iterable[RpcServer]]) -> None:
        """``hac_rpc_*``: the connection bounds of the broker's listeners (RPC and HA),
        read at scrape time with the broker's identity labels."""
        self.registry.register(RpcCollector(servers, self.ident))

    def acl_denial(self, method: int, reason: str) -> None:
        """``Acl``'s refusal hook: count it by request code and reason."""
        self.acl_denied.labels(**self.ident, code=method_name(method), reason=reason).inc()

    def auth_refusal(self, reason: str, method: int) -> None:
        """``ClusterAuth``'s refusal hook: count it by reason."""
        self.auth_refused.labels(**self.ident, reason=reason).inc()

    def init_escape_target(self, target: str) -> None:
        """Create every escape series for ``target`` (a group name, "local", "none") at 0."""
        if target in self._escape_targets:
            return
        self._escape_targets.add(target)
        for kind in ESCAPE_KINDS:
            for result in ESCAPE_RESULTS:
                self.escape.labels(**self.ident, kind=kind, target=target, result=result)

    def set_role(self, role: str) -> None:
        for r in ("master", "slave", "acting"):
            self.role.labels(**self.ident, role=r).set(1 if r == role else 0)


#: RocketMQ 5's lag series (BrokerMetricsConstant): per consumer group and topic
CONSUMER_LAG_LABELS = ("consumer_group", "topic", "is_retry", "is_system")
#: ours, per queue, behind ``consumer_lag_max_queue_series``
CONSUMER_QUEUE_LABELS = ("consumer_group", "topic", "queue_id")


class ConsumerLagCollector(Collector):
    """Consumer lag read at scrape time (:mod:`broker_agent.lag`).

    Per (group, topic): RocketMQ 5's ``rocketmq_consumer_lag_messages`` and
    ``rocketmq_consumer_lag_latency`` (milliseconds, as RocketMQ's); per queue, the
    ``max_queue_series`` queues furthest behind: ``hac_consumer_queue_lag_messages``
    and ``hac_consumer_queue_oldest_age_seconds``; the queues left out are counted.
    ``read`` answers None on a broker that must not export lag now (a slave that is
    not acting, a master in pre-online): two brokers of a group never both report
    it."""

    def __init__(
        self,
        read: Callable[[], Sequence[QueueLag] | None],
        now_ms: Callable[[], int],
        max_queue_series: int,
        labels: Mapping[str, str],
    ) -> None:
        self._read = read
        self._now_ms = now_ms
        self._max_queue_series = max_queue_series
        self._labels = dict(labels)
        self.overflows = 0

    def collect(self) -> Iterator[Metric]:
        names = list(self._labels)
        ident = list(self._labels.values())

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=[*names, *extra])

        lag = gauge(
            "rocketmq_consumer_lag_messages",
            "Consumer lag messages: max offset minus committed offset, summed over the "
            "topic's queues",
            CONSUMER_LAG_LABELS,
        )
        latency = gauge(
            "rocketmq_consumer_lag_latency",
            "Consumer lag time in milliseconds: now minus the store time of the oldest "
            "unconsumed message (0 when none waits)",
            CONSUMER_LAG_LABELS,
        )
        queue_lag = gauge(
            "hac_consumer_queue_lag_messages",
            "Unconsumed messages of one queue (the queues furthest behind, at most "
            "consumer_lag_max_queue_series)",
            CONSUMER_QUEUE_LABELS,
        )
        queue_age = gauge(
            "hac_consumer_queue_oldest_age_seconds",
            "Age of the oldest unconsumed message of one queue (0 when none waits)",
            CONSUMER_QUEUE_LABELS,
        )
        dropped = gauge(
            "hac_consumer_lag_queues_dropped",
            "Queues left out of the per-queue lag series at the last scrape "
            "(consumer_lag_max_queue_series); the per-topic series still count them",
        )
        overflows = CounterMetricFamily(
            "hac_consumer_lag_overflows",
            "Scrapes that left queues out of the per-queue lag series",
            labels=names,
        )
        queues = self._read()
        left_out = 0
        if queues is not None:
            now = self._now_ms()
            for t in by_topic(queues):
                at = [*ident, t.group, t.topic, str(t.is_retry).lower(), str(t.is_system).lower()]
                lag.add_metric(at, t.lag)
                latency.add_metric(at, t.age_ms(now))
            kept, left_out = bound_queues(queues, self._max_queue_series)
            for q in kept:
                at = [*ident, q.group, q.topic, str(q.queue_id)]
                queue_lag.add_metric(at, q.lag)
                queue_age.add_metric(at, q.age_ms(now) / 1000)
            if left_out:
                self.overflows += 1
        dropped.add_metric(ident, left_out)
        overflows.add_metric(ident, self.overflows)
        yield from (lag, latency, queue_lag, queue_age, dropped, overflows)
