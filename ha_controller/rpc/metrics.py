"""``hac_rpc_*``: the connection bounds of RPC listeners as Prometheus metrics.

Read from the servers at scrape time.  Only the services import this module (the RPC
package itself and the client SDK do not load ``prometheus_client``); each registers
one collector with its listeners in its own metrics module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ha_controller.rpc.bounds import PAUSE_REASONS, REFUSED_REASONS
from ha_controller.rpc.server import RpcServer

__all__ = ["RPC_METRICS", "RpcCollector"]

#: name (as exposed) -> labels besides ``listener`` and the service's identity labels
RPC_METRICS: dict[str, tuple[str, ...]] = {
    "hac_rpc_connections": (),
    "hac_rpc_connections_accepted_total": (),
    "hac_rpc_connections_refused_total": ("reason",),
    "hac_rpc_accept_errors_total": (),
    "hac_rpc_frames_timed_out_total": (),
    "hac_rpc_idle_timeouts_total": (),
    "hac_rpc_reads_paused_total": ("reason",),
    "hac_rpc_assembly_bytes": (),
    "hac_rpc_assembly_budget_used_bytes": (),
}


class RpcCollector(Collector):
    """One series per listener (label ``listener``: the server's name), plus ``labels``."""

    def __init__(
        self,
        servers: Callable[[], Iterable[RpcServer]],
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self._servers = servers
        self._labels = dict(labels or {})

    def collect(self) -> Iterator[Metric]:
        names = [*self._labels, "listener"]
        values = list(self._labels.values())

        def gauge(name: str, doc: str, extra: tuple[str, ...] = ()) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=[*names, *extra])

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> CounterMetricFamily:
            return CounterMetricFamily(name.removesuffix("_total"), doc, labels=[*names, *extra])

        conns = gauge("hac_rpc_connections", "Open connections of the listener")
        accepted = counter("hac_rpc_connections_accepted_total", "Connections accepted")
        refused = counter(
            "hac_rpc_connections_refused_total",
            "Connections closed at once on accept (reason: the bound that refused them, "
            "tls_required: plaintext to a TLS listener, tls_handshake: a failed handshake)",
            ("reason",),
        )
        accept_errors = counter(
            "hac_rpc_accept_errors_total",
            "Failed accept() calls (EMFILE, ENFILE, ...), each followed by a back-off",
        )
        timed_out = counter(
            "hac_rpc_frames_timed_out_total",
            "Connections aborted because a frame did not complete within limits.frame_timeout_ms",
        )
        idle = counter(
            "hac_rpc_idle_timeouts_total",
            "Connections closed after limits.idle_timeout_ms without a complete frame",
        )
        paused = counter(
            "hac_rpc_reads_paused_total",
            "Times a connection stopped being read (write_backlog: its replies are not read; "
            "assembly_budget: no memory for its incomplete frame)",
            ("reason",),
        )
        assembly = gauge(
            "hac_rpc_assembly_bytes", "Bytes of incomplete frames held for the listener"
        )
        budget = gauge(
            "hac_rpc_assembly_budget_used_bytes",
            "Bytes of limits.assembly_budget_bytes in use (may exceed it by one overdraft)",
        )
        for server in self._servers():
            at = [*values, server.name]
            stats = server.stats
            conns.add_metric(at, server.open_connections)
            accepted.add_metric(at, stats.accepted)
            for reason in REFUSED_REASONS:
                refused.add_metric([*at, reason], stats.refused[reason])
            accept_errors.add_metric(at, stats.accept_errors)
            timed_out.add_metric(at, stats.frames_timed_out)
            idle.add_metric(at, stats.idle_timeouts)
            for reason in PAUSE_REASONS:
                paused.add_metric([*at, reason], stats.reads_paused[reason])
            assembly.add_metric(at, server.assembly_bytes)
            budget.add_metric(at, server.budget.used)
        yield from (conns, accepted, refused, accept_errors, timed_out, idle, paused)
        yield from (assembly, budget)
