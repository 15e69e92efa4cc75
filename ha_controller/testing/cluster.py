"""A nameserver and broker groups as real processes, ready for a test to send to."""

from __future__ import annotations

import asyncio
import json
from collections.abc import (
    AsyncIterator,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ha_controller.testing.processes import (
    ProcessHandle,
    http_get,
    make_workdir,
    run_broker,
    run_nameserver,
    run_proxy,
    start_all,
)
from ha_controller.testing.tls import TlsFiles
from ha_controller.testing.waiting import eventually

if TYPE_CHECKING:
    from ha_controller.client.message import MessageQueue, ReceivedMessage
    from ha_controller.client.pull_consumer import PullConsumer


# Fast failure detection for tests and demos: 2 s heartbeat timeout, 500 ms scan.
FAST_ENV = {
    "HAC_BROKER_NOT_ACTIVE_TIMEOUT_MS": "2000",
    "HAC_BROKER_HEARTBEAT_INTERVAL_MS": "300",
    "HAC_SCAN_NOT_ACTIVE_BROKER_INTERVAL_MS": "500",
    "HAC_SEGMENT_SIZE_BYTES": str(16 * 1024 * 1024),
}


@dataclass
class Cluster:
    """A nameserver and broker groups started as real processes."""

    workdir: Path
    nameserver: ProcessHandle
    brokers: dict[tuple[str, int], ProcessHandle]
    env: dict[str, str]
    broker_env: dict[tuple[str, int], dict[str, str]] = field(default_factory=dict)
    tls: TlsFiles | None = None

    @property
    def namesrv(self) -> str:
        return self.nameserver.rpc

    def broker(self, name: str, broker_id: int) -> ProcessHandle:
        return self.brokers[(name, broker_id)]

    def restart(self, name: str, broker_id: int) -> ProcessHandle:
        old = self.brokers[(name, broker_id)]
        old.kill()
        handle = run_broker(
            self.namesrv,
            name,
            broker_id,
            self.workdir,
            env={**self.env, **self.broker_env.get((name, broker_id), {})},
        )
        self.brokers[(name, broker_id)] = handle
        return handle

    def run_proxy(
        self, *args: str, env: Mapping[str, str] | None = None, name: str = "proxy"
    ) -> ProcessHandle:
        """``hactl proxy`` for this cluster (:func:`run_proxy`), with the cluster's
        environment (secret, ACL, TLS) under ``env`` and an admin HTTP port; ``args``
        are more flags."""
        return run_proxy(
            self.namesrv,
            self.workdir,
            name=name,
            env={**self.env, **(env or {})},
            extra_args=("--http", "127.0.0.1:0", *args),
        )

    def stop(self) -> None:
        for handle in self.brokers.values():
            handle.kill()
        self.nameserver.stop()

    async def wait_ready(self, timeout: float = 30.0) -> None:
        """Every group's master online at the nameserver and every one of its slaves
        attached to it, which is what a SYNC send needs.  A process is "started" once it
        serves; on a loaded machine its registration and the slaves' HA links come
        later, and a test that sends at once fails with TopicNotFound or
        InSyncReplicasNotEnough (seen on a fresh clone beside a drill campaign)."""
        from ha_controller.client.admin import NameserverClient

        replicas: dict[str, set[int]] = {}
        for name, broker_id in self.brokers:
            replicas.setdefault(name, set()).add(broker_id)
        tls = self.tls.client_context() if self.tls is not None else None

        def attached(name: str) -> bool:
            status, body = http_get(self.broker(name, 0).http, "/api/v1/status", tls=self.tls)
            if status != 200:
                return False
            st = json.loads(body)
            ids = {s["brokerId"] for s in st["slaves"]}
            if "syncStateSet" in st and len(st["syncStateSet"] or ()) < len(replicas[name]):
                return False  # controller mode: every member in the sync-state set
            return not st["isolated"] and ids >= replicas[name] - {0}

        async with NameserverClient([self.namesrv], tls=tls) as ns:

            async def ready() -> bool:
                online = {g.broker_name for g in await ns.groups() if g.master_online}
                if not set(replicas) <= online:
                    return False
                return all([await asyncio.to_thread(attached, name) for name in replicas])

            await eventually(ready, timeout=timeout)


def run_cluster(
    groups: Sequence[str] = ("broker-a",),
    replicas: int = 3,
    *,
    workdir: Path | None = None,
    env: Mapping[str, str] | None = None,
    broker_env: Mapping[tuple[str, int], Mapping[str, str]] | None = None,
    tls: TlsFiles | None = None,
) -> Cluster:
    """Start a nameserver and, per group, a master and ``replicas - 1`` slaves.

    Slaves start first so that each master's pre-online finds them (a master
    without live slaves goes online at once).  With ``tls`` every process serves and
    dials with TLS (``tls.service_env()``; restarts keep it)."""
    workdir = workdir or make_workdir()
    tls_env = tls.service_env() if tls is not None else {}
    merged = {**FAST_ENV, "HAC_TOTAL_REPLICAS": str(replicas), **tls_env, **(env or {})}
    if replicas < 2:
        merged.setdefault("HAC_IN_SYNC_REPLICAS", "1")
    ns = run_nameserver(workdir, env=merged)
    per_broker = {k: dict(v) for k, v in (broker_env or {}).items()}
    cluster = Cluster(workdir, ns, {}, merged, per_broker, tls)
    try:
        # the slaves of every group at once, then the masters at once: a start is mostly
        # waiting (imports, binding, the first registration), not CPU
        for ids in (range(1, replicas), (0,)):
            batch = []
            for name in groups:
                for bid in ids:
                    env_b = {**merged, **per_broker.get((name, bid), {})}
                    handle = run_broker(ns.rpc, name, bid, workdir, env=env_b, start=False)
                    cluster.brokers[(name, bid)] = handle
                    batch.append(handle)
            start_all(batch)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def create_typed_topics(
    namesrv: str,
    topics: Mapping[str, str],
    *,
    queues: int = 4,
    orderly_groups: Iterable[str] = (),
) -> list[str]:
    """Create each topic of ``topics`` (name -> message type, as ``hactl topic create
    --message-type``) on every master, and set ``orderly_groups`` orderly (``hactl
    group update G --orderly``), in this process: one hactl subprocess per topic costs
    seconds.  Returns the broker groups the last change reached."""
    from ha_controller.client.admin import NameserverClient
    from ha_controller.protocol.topics import TopicMessageType

    async def create() -> list[str]:
        reached: list[str] = []
        async with NameserverClient([namesrv]) as ns:
            for topic, kind in topics.items():
                reached = await ns.create_topic(
                    topic, queues=queues, message_type=TopicMessageType(kind.upper())
                )
            for group in orderly_groups:
                reached = await ns.update_subscription_group(group, orderly=True)
        return reached

    return asyncio.run(create())


async def stored_messages(
    pull: PullConsumer, queues: Iterable[MessageQueue], *, max_msgs: int = 64
) -> AsyncIterator[ReceivedMessage]:
    """Every message stored in ``queues``, queue by queue from offset 0, read with pulls
    (of up to ``max_msgs``) the broker does not hold: a queue ends at the first pull that
    finds nothing."""
    from ha_controller.client.pull_consumer import PullStatus

    for mq in queues:
        offset = 0
        while True:
            res = await pull.pull(mq, offset, max_msgs=max_msgs, suspend_timeout_ms=0)
            if res.status is not PullStatus.FOUND:
                break
            for m in res.messages:
                yield m
            offset = res.next_begin_offset
