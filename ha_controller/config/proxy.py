"""``hactl proxy``'s settings: the RocketMQ 5 gRPC gateway (docs/grpc.md)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from ha_controller.config import checks, common
from ha_controller.config.base import Problem, Validated
from ha_controller.config.checks import listener_clash
from ha_controller.config.schema import GIB, KIB, MIB, setting
from ha_controller.config.tables import AclConfig, TlsConfig
from ha_controller.config.values import LogLevel

__all__ = ["ProxyConfig"]


@dataclass(frozen=True, kw_only=True)
class ProxyConfig(Validated):
    """``hactl proxy``: the RocketMQ 5 gRPC gateway (docs/grpc.md)."""

    namesrv_addrs: tuple[str, ...] = setting(
        ("127.0.0.1:9876",),
        check=checks.TARGETS,
        flag="namesrv",
        doc="Nameservers the gateway reads routes from.",
    )
    listen: str = setting(
        "0.0.0.0:8081",
        check=checks.LISTEN,
        doc="gRPC listener (port 0 = any).",
    )
    http_listen: str | None = setting(
        None,
        check=checks.LISTEN,
        flag="http",
        doc="Admin HTTP (healthz, readyz, metrics); unset = none.",
    )
    fifo_groups: tuple[str, ...] = setting(
        (),
        doc=(
            "Consumer groups served in order besides those set with `hactl group update G "
            "--orderly` (the gateway pops them with the broker's orderly POP)."
        ),
    )
    long_polling_timeout_ms: int = setting(
        20_000,
        ge=1000,
        doc="Push consumers' long polling, sent to them in the settings.",
    )
    default_invisible_ms: int = setting(
        30_000,
        doc="Invisible time of a receive that names none.",
    )
    send_attempts: int = setting(
        3,
        ge=1,
        doc="Tries of one send (a retriable failure moves it to another group).",
    )
    route_ttl_ms: int = setting(
        1000,
        ge=0,
        doc="How long a route from the nameserver is reused; 0 = ask every time.",
    )
    heartbeat_broker_interval_ms: int = setting(
        5000,
        doc="Heartbeats from the gateway to the brokers (RocketMQ heartbeatBrokerInterval).",
    )
    broker_timeout_ms: int = setting(
        3000,
        doc="Timeout of one request to a broker.",
    )
    max_messages_per_send: int = setting(
        1024,
        ge=1,
        doc=(
            "Most messages in one SendMessage; more is answered PAYLOAD_TOO_LARGE and nothing is "
            "sent. The official SDKs send one message per call, and RocketMQ's proxy bounds a "
            "batch only by its size; the gateway sends a batch's messages one after another "
            "(about 1 ms each), so 1024 keeps one call to about a second, within the SDKs' 3 s "
            "request timeout."
        ),
    )
    max_request_bytes: int = setting(
        16 * MIB,
        ge=4 * MIB + 64 * KIB,
        le=1 * GIB,
        doc=(
            "Largest serialized request (one gRPC message); gRPC refuses a larger one with "
            "RESOURCE_EXHAUSTED before reading it. It must hold one body of `max_message_bytes`, "
            "the largest the gateway takes, and 64 KiB of properties."
        ),
    )
    max_message_bytes: int = setting(
        4 * MIB,
        ge=1 * KIB,
        le=512 * MIB,
        doc=(
            "Largest message body (RocketMQ's proxy `maxMessageSize`), sent to producers in their "
            "settings; a larger one is answered MESSAGE_BODY_TOO_LARGE. User properties, tag and "
            "keys come on top (at most 16 KiB together, as RocketMQ's `maxUserPropertySize`). "
            "The brokers' own `max_message_bytes` must be at least this."
        ),
    )
    receive_min_invisible_ms: int = setting(
        10_000,
        ge=0,
        doc=(
            "Shortest invisible time a ReceiveMessage may ask for (RocketMQ's "
            "`minInvisibleTimeMillsForRecv`); a shorter one is answered ILLEGAL_INVISIBLE_TIME. "
            "Push consumers' receives (auto-renewed) use `default_invisible_ms` instead."
        ),
    )
    max_invisible_ms: int = setting(
        12 * 3600 * 1000,
        ge=1000,
        doc=(
            "Longest invisible time a ReceiveMessage or ChangeInvisibleDuration may ask for "
            "(RocketMQ's `maxInvisibleTimeMills`); a longer one is answered "
            "ILLEGAL_INVISIBLE_TIME."
        ),
    )
    max_delay_ms: int = setting(
        24 * 3600 * 1000,
        ge=1000,
        doc=(
            "Furthest ahead a delayed message's delivery time may be (RocketMQ's "
            "`maxDelayTimeMills`); further is answered ILLEGAL_DELIVERY_TIME."
        ),
    )
    max_concurrent_calls: int = setting(
        4096,
        ge=1,
        doc=(
            "Calls in progress at once (long polls and telemetry streams included); one more is "
            "refused with RESOURCE_EXHAUSTED. gRPC's backlog of calls not yet picked up is made "
            "twice this (at least 16384), so that a burst gets statuses, not resets."
        ),
    )
    max_concurrent_calls_per_client: int = setting(
        512,
        ge=1,
        doc=(
            "Calls in progress at once with one `x-mq-client-id` (calls without one share a "
            "single allowance); one more is refused with RESOURCE_EXHAUSTED."
        ),
    )
    max_concurrent_receives: int = setting(
        512,
        ge=1,
        doc=(
            "ReceiveMessage calls (long polls) in progress at once. Each holds a request in "
            "flight on the gateway's one connection to a broker, which takes 1024 at most "
            "(`limits.max_inflight_requests`): 512 leaves the other half for sends and acks."
        ),
    )
    max_concurrent_receives_per_client: int = setting(
        64,
        ge=1,
        doc=(
            "ReceiveMessage calls in progress at once with one `x-mq-client-id`; a push consumer "
            "holds one per broker group of each topic it subscribes."
        ),
    )
    lite_subscription_quota: int = setting(
        2000,
        ge=1,
        le=1_000_000,
        doc=(
            "Lite topics one lite consumer may subscribe under its parent topic (RocketMQ's "
            "`lite.sub.client.quota`, 2000), sent to lite consumers in their settings; a "
            "SyncLiteSubscription beyond it is answered LITE_SUBSCRIPTION_QUOTA_EXCEEDED and "
            "changes nothing."
        ),
    )
    max_lite_subscriptions: int = setting(
        100_000,
        ge=1,
        le=10_000_000,
        doc=(
            "Lite subscriptions (client, lite topic) the gateway holds in all (RocketMQ's "
            "broker `maxLiteSubscriptionCount`); one more is answered "
            "LITE_SUBSCRIPTION_QUOTA_EXCEEDED. Each costs about 250 B of the gateway's memory, "
            "and a lite consumer's receives send its group's lite topics with each pop "
            "(`bench/lite_topics.py`)."
        ),
    )
    max_lite_topic_bytes: int = setting(
        64,
        ge=1,
        le=1024,
        doc=(
            "Longest lite topic name in UTF-8 bytes (RocketMQ's proxy `maxLiteTopicSize`), sent "
            "to lite consumers in their settings; a longer one is answered ILLEGAL_LITE_TOPIC."
        ),
    )
    cluster_secret: str | None = setting(
        None,
        check=checks.NOT_EMPTY,
        secret=True,
        doc=(
            "The cluster's secret: the gateway's own requests (heartbeats, routes) are signed "
            "with it, and so are clients' requests, on behalf of their ACL user "
            "([security.md](security.md))."
        ),
    )
    tls: TlsConfig = field(default_factory=TlsConfig)
    acl: AclConfig = field(default_factory=AclConfig)
    acl_sync_interval_ms: int = setting(
        1000,
        ge=100,
        le=60_000,
        doc=(
            "How often the gateway fetches the cluster's ACL table from the nameservers (with a "
            "cluster secret): users and ACLs changed at runtime take effect within about this."
        ),
    )
    log_level: LogLevel = common.log_level()

    def _rules(self) -> Iterator[Problem]:
        if self.http_listen is not None:
            clash = listener_clash({"listen": self.listen, "http_listen": self.http_listen})
            if clash is not None:
                yield clash
        if self.max_concurrent_calls_per_client > self.max_concurrent_calls:
            yield (
                ("max_concurrent_calls_per_client", "max_concurrent_calls"),
                "one client cannot be allowed more calls than the gateway takes in total",
            )
        if self.max_concurrent_receives_per_client > self.max_concurrent_receives:
            yield (
                ("max_concurrent_receives_per_client", "max_concurrent_receives"),
                "one client cannot be allowed more receives than the gateway takes in total",
            )
        if self.max_concurrent_receives > self.max_concurrent_calls:
            yield (
                ("max_concurrent_receives", "max_concurrent_calls"),
                "receives are calls: they cannot be allowed more than calls in total",
            )
        if self.max_request_bytes < self.max_message_bytes + 64 * KIB:
            yield (
                ("max_request_bytes", "max_message_bytes"),
                f"a request must hold a body of max_message_bytes ({self.max_message_bytes}) and "
                "64 KiB of properties",
            )
        if self.receive_min_invisible_ms > self.max_invisible_ms:
            yield (
                ("receive_min_invisible_ms", "max_invisible_ms"),
                "the shortest invisible time cannot be longer than the longest",
            )
        if self.lite_subscription_quota > self.max_lite_subscriptions:
            yield (
                ("lite_subscription_quota", "max_lite_subscriptions"),
                "one client cannot be allowed more lite subscriptions than the gateway holds",
            )
        if self.acl.enabled and not self.acl.allow_anonymous and self.cluster_secret is None:
            yield (
                ("acl.allow_anonymous", "cluster_secret"),
                "acl.allow_anonymous = false needs a cluster_secret: the cluster's own "
                "requests are told from clients' by its signature",
            )
