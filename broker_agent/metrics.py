"""Broker metrics (docs/http-and-metrics.md); every series carries the broker's identity."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge

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
