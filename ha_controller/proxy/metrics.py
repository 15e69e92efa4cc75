"""The gateway's Prometheus metrics (prefix ``hac_proxy_``), in one registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "hac_proxy_requests_total",
            "v2 RPCs answered, by method and v2 status code",
            ["method", "code"],
            registry=self.registry,
        )
        self.clients = Gauge(
            "hac_proxy_clients",
            "v2 clients with a live telemetry stream, by client type",
            ["type"],
            registry=self.registry,
        )
        self.send_retries = Counter(
            "hac_proxy_send_retries_total",
            "sends the gateway moved to another broker group after a retriable failure",
            registry=self.registry,
        )
        self.transaction_checks = Counter(
            "hac_proxy_transaction_checks_total",
            "CHECK_TRANSACTION_STATE from brokers, by outcome (forwarded|no_producer|dropped)",
            ["result"],
            registry=self.registry,
        )
        self.held_receives = Gauge(
            "hac_proxy_held_receives",
            "ReceiveMessage calls waiting (long polling)",
            registry=self.registry,
        )
        self.renewals = Counter(
            "hac_proxy_renewals_total",
            "invisible-time renewals for push consumers, by outcome (ok|failed|dropped)",
            ["result"],
            registry=self.registry,
        )
        self.renewing = Gauge(
            "hac_proxy_renewing_messages",
            "messages handed to push consumers whose invisible time the gateway renews",
            registry=self.registry,
        )
        self.refused = Counter(
            "hac_proxy_refused_total",
            "v2 calls refused by the gateway's bounds, by reason (the limit's config key, "
            "or malformed)",
            ["reason"],
            registry=self.registry,
        )
        self.calls = Gauge(
            "hac_proxy_calls",
            "v2 calls in progress (long polls and telemetry streams included)",
            registry=self.registry,
        )
        self.lite_subscriptions = Gauge(
            "hac_proxy_lite_subscriptions",
            "lite subscriptions (client, lite topic) the gateway holds",
            registry=self.registry,
        )
