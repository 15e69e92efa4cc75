"""``hactl broker``'s settings: one broker of a group."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ha_controller.config import checks, common
from ha_controller.config.base import Problem, Validated
from ha_controller.config.checks import listener_clash
from ha_controller.config.schema import GIB, KIB, MIB, setting
from ha_controller.config.tables import AclConfig, RpcLimits, TlsConfig
from ha_controller.config.values import FlushMode, LogLevel, ReplicationMode
from ha_controller.protocol.properties import DEFAULT_DELAY_LEVELS, parse_delay_levels
from ha_controller.protocol.record import BLANK_MIN_SIZE
from ha_controller.protocol.validation import RECORD_ALLOWANCE_BYTES

__all__ = ["BrokerConfig"]


@dataclass(frozen=True, kw_only=True)
class BrokerConfig(Validated):
    """``hactl broker``: one broker of a group (RocketMQ BrokerConfig + MessageStoreConfig)."""

    cluster: str = setting(
        "DefaultCluster",
        section="Identity and addresses (per broker in a container)",
        check=checks.NAME,
        doc="Cluster name the broker registers under.",
    )
    broker_name: str = setting(
        check=checks.NAME,
        per_broker=True,
        doc="The broker group (RocketMQ `brokerName`): every member of a group has the same name.",
    )
    broker_id: int = setting(
        ge=0,
        per_broker=True,
        doc="0 = master, others slaves.",
    )
    namesrv_addrs: tuple[str, ...] = setting(
        check=checks.TARGETS,
        flag="namesrv",
        doc=(
            "Every nameserver; the broker registers and heartbeats with each. Run two or more: a "
            "master that reaches no nameserver for `broker_not_active_timeout_ms` fences itself."
        ),
    )
    listen: str = setting(
        "0.0.0.0:10911",
        check=checks.LISTEN,
        per_broker=True,
        doc="RPC listener (clients, peers, nameserver notifications).",
    )
    ha_listen: str = setting(
        "0.0.0.0:10912",
        check=checks.LISTEN,
        per_broker=True,
        doc=(
            "HA replication listener. Only a master (id 0) binds it; its slaves connect to it. A "
            "slave advertises it but does not listen."
        ),
    )
    http_listen: str = setting(
        "0.0.0.0:10913",
        check=checks.LISTEN,
        flag="http",
        per_broker=True,
        doc=(
            "Admin HTTP listener: `/api/v1/status`, `/healthz`, `/readyz`, `/metrics`. Served "
            "over HTTPS when `tls.enabled`."
        ),
    )
    broker_ip1: str | None = setting(
        None,
        check=checks.HOST,
        per_broker=True,
        doc=(
            "RocketMQ `brokerIP1`: the host advertised for the RPC and HA ports (in registrations "
            "and routes) instead of the bound one; needed when a listener binds a wildcard. Unset "
            "= the bound address."
        ),
    )
    store_dir: str | None = setting(
        None,
        check=checks.NOT_EMPTY,
        per_broker=True,
        doc=(
            "Store directory (commit log, consume queues, checkpoint, topic and offset tables). "
            "Unset = `~/store/<broker_name>-<broker_id>`."
        ),
    )
    enable_slave_acting_master: bool = setting(
        True,
        section="RIP-32 switches (RocketMQ defaults false; this project turns them on)",
        doc=(
            "RIP-32 on the broker: a slave acts for its lost master when the nameserver names it; "
            "a master keeps a lease on id 0 and fences itself when it may have been expired. Also "
            "makes the registration carry `broker_not_active_timeout_ms` (without it the "
            "nameserver uses 120 s, as RocketMQ). RocketMQ defaults this to false."
        ),
    )
    enable_remote_escape: bool = setting(
        True,
        doc=(
            "An acting slave may send special messages (due delayed messages, open transactions, "
            "POP records) to a master of another group. Off, it only escapes to a master in the "
            "same process (broker container)."
        ),
    )
    skip_pre_online: bool = setting(
        False,
        doc=(
            "Start serving at once instead of isolated: a returning master then keeps its stale "
            "offsets. For drills that show what pre-online prevents; never in production."
        ),
    )
    broker_heartbeat_interval_ms: int = setting(
        1000,
        doc=(
            "`BROKER_HEARTBEAT` to every nameserver this often. Each acknowledged heartbeat "
            "extends a master's lease."
        ),
    )
    broker_not_active_timeout_ms: int = setting(
        10_000,
        doc=(
            "The nameserver expires the broker when its heartbeats stop for this long (sent in "
            "the registration), and a master's lease on id 0 is this long from the last "
            "acknowledged heartbeat."
        ),
    )
    send_heartbeat_timeout_ms: int = setting(
        1000,
        doc="Timeout of one heartbeat call.",
    )
    sync_broker_member_group_period_ms: int = setting(
        1000,
        doc=(
            "Poll of `GET_BROKER_MEMBER_GROUP`: the backstop that makes a slave act (or stop) "
            "even when a notification was lost."
        ),
    )
    register_name_server_period_ms: int = setting(
        30_000,
        ge=10_000,
        le=60_000,
        doc=(
            "How often the broker registers again with every nameserver (RocketMQ "
            "`registerNameServerPeriod`). RocketMQ clamps it to 10..60 s silently; a value "
            "outside that range is refused here, so that what runs is what is written."
        ),
    )
    register_broker_timeout_ms: int = setting(
        24_000,
        doc="Timeout of one `REGISTER_BROKER`.",
    )
    load_balance_poll_name_server_interval_ms: int = setting(
        30_000,
        doc=(
            "RocketMQ `loadBalancePollNameServerInterval`. Accepted and checked, but not read: "
            "the escape bridge reuses a route for at most 1 s and asks again after a miss or a "
            "failed send."
        ),
    )
    lock_in_strict_mode: bool = setting(
        False,
        doc=(
            "Queue locks (orderly consumption) need a quorum of the group (`total_replicas // 2 + "
            "1` copies) instead of the receiving broker alone, so an acting slave that never saw "
            "a lock cannot grant it to a second client."
        ),
    )
    compatible_with_old_namesrv: bool = setting(
        False,
        doc=(
            "Heartbeat with `QUERY_DATA_VERSION` as old nameservers need, instead of the "
            "lightweight `BROKER_HEARTBEAT` (RocketMQ `compatibleWithOldNameSrv`, true there). "
            "Off here: `BROKER_HEARTBEAT` and `GET_BROKER_MEMBER_GROUP` are the point of this "
            "product, and its nameserver always speaks them."
        ),
    )
    consumer_offset_update_version_step: int = setting(
        500,
        ge=1,
        doc=(
            "The consumer offset table's data version moves every this many commits; pre-online "
            "compares versions to adopt a slave's newer table."
        ),
    )
    delay_offset_update_version_step: int = setting(
        200,
        ge=1,
        doc="The same for the delay offset table (one update per delivered delayed message).",
    )
    total_replicas: int = setting(
        3,
        section="Replication and store",
        ge=1,
        le=64,
        doc=(
            "Members of the group, the master included. Bounds `in_sync_replicas`; pre-online "
            "runs only when it is above 1; the strict lock quorum is `total_replicas // 2 + 1`. "
            "(RocketMQ defaults it to 1; 3 is what two in-sync copies need with a spare, and "
            "what `hactl demo`, the drills and RocketMQ's own RIP-32 integration tests run.)"
        ),
    )
    in_sync_replicas: int = setting(
        2,
        ge=1,
        doc=(
            "Copies (the master's included) a SYNC send waits for; with fewer live slaves a send "
            "fails at once with the retriable `InSyncReplicasNotEnough`, so the producer tries "
            "another group."
        ),
    )
    replication_mode: ReplicationMode = setting(
        "sync",
        doc=(
            "`sync`: a send is acknowledged once `in_sync_replicas` copies hold it; `async`: once "
            "the master stored it."
        ),
    )
    flush_mode: FlushMode = setting(
        "async",
        doc=(
            "`async`: the commit log is fsynced every `flush_interval_ms`; `sync`: before each "
            "send is acknowledged."
        ),
    )
    flush_interval_ms: int = setting(
        500,
        doc=(
            'How often the commit log is fsynced with `flush_mode = "async"` (RocketMQ '
            "`flushIntervalCommitLog`)."
        ),
    )
    slave_ack_timeout_ms: int = setting(
        3000,
        ge=1,
        doc=(
            "How long a SYNC send waits for its slave copies. When they do not come in time the "
            "send fails with `SlaveAckTimeout`, which is not retriable: the message is stored and "
            "will be delivered, so resending it elsewhere would duplicate it. (Too few connected "
            "slaves is a different error: `InSyncReplicasNotEnough`, at once, nothing stored.) "
            "RocketMQ's `syncFlushTimeout` is 5 s."
        ),
    )
    sync_state_lag_ms: int = setting(
        2000,
        le=600_000,
        doc=(
            "Controller mode: a member of the sync-state set that has not acknowledged a write "
            "this much older is dropped from the set (through the controller; writes wait for it "
            "until then, so keep it below `slave_ack_timeout_ms`). A member whose HA link closes "
            "is dropped at once. RocketMQ's `haMaxTimeSlaveNotCatchup` is 15 s."
        ),
    )
    segment_size_bytes: int = setting(
        64 * MIB,
        ge=64 * KIB,
        le=2 * GIB,
        doc=(
            "Size of one commit-log segment file. Must be the same on every member: slaves copy "
            "records byte for byte."
        ),
    )
    max_message_bytes: int = setting(
        4 * MIB,
        ge=4 * KIB,
        doc=(
            "RocketMQ maxMessageSize: the largest message body. A stored record may have 64 KiB "
            "more for its properties and header, as in RocketMQ's store (within one segment); a "
            "client's message must leave 2 KiB of that for the properties the broker adds when "
            "it delivers a delayed message, commits a transaction, revives a POP message or "
            "escapes one to another group."
        ),
    )
    min_free_disk_ratio: float = setting(
        0.05,
        section="Disk space and retention",
        check=checks.FRACTION,
        doc=(
            "Below this share of the file system free (for unprivileged users), the store refuses "
            "appends (NotWritable, nothing stored); the reserve is left for consume queues, "
            "checkpoints and offset tables."
        ),
    )
    warn_free_disk_ratio: float | None = setting(
        None,
        check=checks.FRACTION,
        doc=(
            "Below this share free the broker withdraws the WRITE bit from its routes so that "
            "producers go elsewhere before anything is refused; unset = twice min_free_disk_ratio "
            "(at most 0.5)."
        ),
    )
    disk_check_interval_ms: int = setting(
        1000,
        doc=(
            "How often free space is sampled (statvfs) while appends go on; between samples the "
            "store counts what it wrote."
        ),
    )
    file_reserved_time_ms: int = setting(
        72 * 3600 * 1000,
        doc=(
            "RocketMQ fileReservedTime (72 hours), in ms like every duration here: a closed "
            "commit-log segment last written longer ago than this is expired."
        ),
    )
    delete_when: str = setting(
        "04",
        check=checks.DELETE_WHEN,
        doc=(
            'RocketMQ deleteWhen: the hours of day (local time, "04" or "04;05") in which expired '
            "segments are deleted."
        ),
    )
    disk_max_used_space_ratio: float = setting(
        0.75,
        check=checks.USED_RATIO,
        doc=(
            "RocketMQ diskMaxUsedSpaceRatio: with more of the file system used than this, expired "
            "segments are deleted at once, whatever the hour (unexpired ones never)."
        ),
    )
    clean_resource_interval_ms: int = setting(
        10_000,
        doc="RocketMQ cleanResourceInterval: how often retention looks for expired files.",
    )
    detached_slave_hold_ms: int = setting(
        600_000,
        ge=0,
        doc=(
            "A master deletes nothing its attached slaves lack, and for this long after a slave "
            "was last seen attached, nothing that slave lacked (also across a restart of the "
            "master; not while the disk is over disk_max_used_space_ratio or short of space): a "
            "slave that reconnects (after a freeze) or restarts within it continues where it was. "
            "One away longer may find its next bytes deleted and then waits for an operator (see "
            "the runbook). 0: only attached slaves hold deletion back."
        ),
    )
    max_open_files: int = setting(
        256,
        ge=8,
        le=1_000_000,
        doc=(
            "Open files the store may keep besides its active commit-log segment: older segments "
            "being read and consume-queue files, opened on demand and closed least recently used "
            "first."
        ),
    )
    consume_queue_file_entries: int = setting(
        300_000,
        ge=1,
        doc=(
            "Entries per consume-queue file (RocketMQ mappedFileSizeConsumeQueue / 20); retention "
            "deletes a queue's files whose messages are all deleted."
        ),
    )
    key_index_max_entries: int = setting(
        1_000_000,
        ge=0,
        doc=(
            "Message keys and unique keys the key index holds at most (`hactl message query`; "
            "12 bytes of memory each). Past it newer keys are not indexed until "
            "retention deletes old segments (counted, logged once); 0 turns the index off."
        ),
    )
    auto_create_topic: bool = setting(
        True,
        section="Topics, pulls",
        doc=(
            "A send to an unknown topic creates it with `default_topic_queue_nums` queues "
            "(RocketMQ's `autoCreateTopicEnable`). On by default; "
            "`helm/ha-controller/examples/production.yaml` turns it off, so that a misspelled "
            "topic fails the send instead of quietly becoming a new topic. With it off, create "
            "every topic with `hactl topic create`, which creates it on every group's master: an "
            "acting slave can only escape delayed messages and open transactions of a topic to a "
            "master that has that topic."
        ),
    )
    default_topic_queue_nums: int = setting(
        4,
        ge=1,
        le=1024,
        doc="Queues of an auto-created topic.",
    )
    long_polling_enable: bool = setting(
        True,
        doc=(
            "Hold a pull that finds nothing until a message arrives or the client's suspend "
            "timeout passes; off, such a pull is answered empty at once."
        ),
    )
    long_polling_check_interval_ms: int = setting(
        5000,
        doc=(
            "Backstop re-check of held pulls with long polling on (an arriving message wakes them "
            "at once anyway)."
        ),
    )
    short_polling_check_interval_ms: int = setting(
        1000,
        doc="The same re-check with long polling off.",
    )
    max_held_pulls: int = setting(
        10_000,
        ge=1,
        doc=(
            "Pulls held at once; one more that would be held is refused with the retriable "
            "`Overloaded`."
        ),
    )
    consumer_lag_max_queue_series: int = setting(
        1000,
        ge=0,
        doc=(
            "Per-queue consumer lag series (`hac_consumer_queue_lag_messages`, "
            "`hac_consumer_queue_oldest_age_seconds`) a scrape exports at most: the queues "
            "furthest behind; the others are counted in `hac_consumer_lag_queues_dropped`. "
            "The per-topic `rocketmq_consumer_lag_*` series always count every queue. "
            "0 = none per queue."
        ),
    )
    cluster_secret: str | None = setting(
        None,
        section="Auth",
        check=checks.NOT_EMPTY,
        secret=True,
        doc=(
            "HMAC key of the control plane; must equal the nameservers' and the other brokers' "
            "`cluster_secret`. The broker signs every request it sends to nameservers and "
            "brokers, refuses unsigned control requests (notices, HA-info exchange, lock votes, "
            "pre-online pulls), and its HA port counts and streams to a slave only after a "
            "challenge-response on the secret. Unset = open mode (see [security](security.md))."
        ),
    )
    admin_token: str | None = common.admin_token()
    delay_levels: str = setting(
        DEFAULT_DELAY_LEVELS,
        section="Special services, escape bridge, locks",
        check=checks.DELAY_LEVELS,
        doc=(
            "RocketMQ `messageDelayLevel`: the delay of each level, level 1 first. A level above "
            "the last is clamped to the last."
        ),
    )
    timer_max_delay_ms: int = setting(
        3 * 24 * 3_600_000,
        ge=1000,
        doc=(
            "RocketMQ timerMaxDelaySec (3 days): a timer message (TIMER_DELIVER_MS) due further "
            "ahead is refused (BadRequest). The timer keeps every undelivered timer message in "
            "memory, about 360 bytes each (hac_timer_messages_pending)."
        ),
    )
    escape_max_attempts: int = setting(
        10,
        ge=1,
        le=1000,
        doc=(
            "Attempts of one escape (a send to another group's master) before it counts as "
            "failed; the back-off between them doubles from `escape_backoff_initial_ms` to "
            "`escape_backoff_max_ms`. An open transaction whose escape failed this many times in "
            "a row is given up."
        ),
    )
    escape_backoff_initial_ms: int = setting(
        100,
        doc="First back-off between escape attempts.",
    )
    escape_backoff_max_ms: int = setting(
        10_000,
        doc="Longest back-off between escape attempts.",
    )
    escape_send_timeout_ms: int = setting(
        3000,
        doc="Timeout of one escape send.",
    )
    lock_max_live_time_ms: int = setting(
        60_000,
        ge=30_000,
        doc=(
            "RocketMQ REBALANCE_LOCK_MAX_LIVE_TIME. Clients renew every 20 s and treat a lock as "
            "theirs for 30 s, so a broker lifetime below 30 s would let two clients believe they "
            "own one queue."
        ),
    )
    lock_peer_timeout_ms: int = setting(
        1000,
        doc="Per-peer timeout of the strict-mode quorum lock round (RocketMQ: 1000 ms).",
    )
    pop_revive_interval_ms: int = setting(
        1000,
        doc=(
            "How often the POP revive service (on the master or the acting slave) reads the "
            "revive queues and puts messages whose invisible time is over and that were not acked "
            "into `%RETRY%<group>` (RocketMQ `reviveInterval`)."
        ),
    )
    transaction_check_interval_ms: int = setting(
        30_000,
        doc=(
            "How often the check service walks the open transactions (RocketMQ "
            "`transactionCheckInterval`)."
        ),
    )
    transaction_timeout_ms: int = setting(
        6000,
        doc=(
            "A half message is checked back with its producer once it is this old (RocketMQ "
            "`transactionTimeOut`)."
        ),
    )
    transaction_check_max: int = setting(
        15,
        ge=1,
        doc=(
            "Check-backs of one transaction before it is discarded (RocketMQ "
            "`transactionCheckMax`)."
        ),
    )
    tls: TlsConfig = field(default_factory=TlsConfig)
    acl: AclConfig = field(default_factory=AclConfig)
    limits: RpcLimits = field(default_factory=RpcLimits)
    log_level: LogLevel = common.log_level()

    # Derived from delay_levels: delay_levels_ms[level - 1] is that level's delay.
    delay_levels_ms: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "delay_levels_ms", parse_delay_levels(self.delay_levels))

    def _rules(self) -> Iterator[Problem]:
        if self.broker_heartbeat_interval_ms >= self.broker_not_active_timeout_ms:
            yield (
                ("broker_heartbeat_interval_ms", "broker_not_active_timeout_ms"),
                f"the heartbeat interval ({self.broker_heartbeat_interval_ms} ms) must be less "
                f"than the not-active timeout ({self.broker_not_active_timeout_ms} ms)",
            )
        if self.send_heartbeat_timeout_ms >= self.broker_not_active_timeout_ms:
            yield (
                ("send_heartbeat_timeout_ms", "broker_not_active_timeout_ms"),
                f"the heartbeat send timeout ({self.send_heartbeat_timeout_ms} ms) must be less "
                f"than the not-active timeout ({self.broker_not_active_timeout_ms} ms)",
            )
        if self.in_sync_replicas > self.total_replicas:
            yield (
                ("in_sync_replicas", "total_replicas"),
                f"in_sync_replicas ({self.in_sync_replicas}) cannot exceed total_replicas "
                f"({self.total_replicas})",
            )
        if self.escape_backoff_initial_ms > self.escape_backoff_max_ms:
            yield (
                ("escape_backoff_initial_ms", "escape_backoff_max_ms"),
                f"the initial backoff ({self.escape_backoff_initial_ms} ms) exceeds the maximum "
                f"({self.escape_backoff_max_ms} ms)",
            )
        if self.max_message_bytes >= self.segment_size_bytes:
            yield (
                ("max_message_bytes", "segment_size_bytes"),
                f"a message of max_message_bytes ({self.max_message_bytes}) must fit in one "
                f"segment ({self.segment_size_bytes} bytes)",
            )
        if (
            self.warn_free_disk_ratio is not None
            and self.warn_free_disk_ratio < self.min_free_disk_ratio
        ):
            yield (
                ("warn_free_disk_ratio", "min_free_disk_ratio"),
                f"the warning reserve ({self.warn_free_disk_ratio}) cannot be below the hard "
                f"reserve ({self.min_free_disk_ratio})",
            )
        if self.max_message_bytes > self.limits.max_frame_bytes:
            yield (
                ("max_message_bytes", "limits.max_frame_bytes"),
                f"a message of max_message_bytes ({self.max_message_bytes}) must fit in one "
                f"frame ({self.limits.max_frame_bytes} bytes)",
            )
        clash = listener_clash(
            {"listen": self.listen, "ha_listen": self.ha_listen, "http_listen": self.http_listen}
        )
        if clash is not None:
            yield clash
        if self.acl.enabled and not self.acl.allow_anonymous and self.cluster_secret is None:
            yield (
                ("acl.allow_anonymous", "cluster_secret"),
                "acl.allow_anonymous = false needs a cluster_secret: the cluster's own "
                "requests are told from clients' by its signature",
            )

    @property
    def is_master(self) -> bool:
        return self.broker_id == 0

    @property
    def store_path(self) -> Path:
        if self.store_dir is not None:
            return Path(self.store_dir).expanduser()
        return Path.home() / "store" / f"{self.broker_name}-{self.broker_id}"

    @property
    def max_record_bytes(self) -> int:
        """The largest record the store takes: a body of ``max_message_bytes`` and up to
        64 KiB of properties and header (RocketMQ's store: ``MessageExtEncoder``), within
        one segment (a blank record must fit after it)."""
        return min(
            self.max_message_bytes + RECORD_ALLOWANCE_BYTES,
            self.segment_size_bytes - BLANK_MIN_SIZE,
        )

    @property
    def max_delay_level(self) -> int:
        return len(self.delay_levels_ms)

    @property
    def lock_quorum(self) -> int:
        """Strict-mode lock quorum: ``total_replicas // 2 + 1`` (RocketMQ lockBatchMQ)."""
        return self.total_replicas // 2 + 1

    def delay_level_ms(self, level: int) -> int:
        """The delay of ``level`` (1-based) in ms.

        A level above the highest is clamped to the highest, as RocketMQ does;
        a level below 1 means "not delayed" and is an error here.
        """
        if level < 1:
            raise ValueError(f"delay level must be >= 1, got {level}")
        return self.delay_levels_ms[min(level, len(self.delay_levels_ms)) - 1]
