"""What lite topics (RIP-83) cost: memory per lite subscription and the time to subscribe
100,000 lite topics, in the gateway's table and through a real gateway.

    .venv/bin/python bench/lite_topics.py [--lite-topics 100000] [--clients 50]

1. In this process, the gateway's table (``ha_controller.proxy.lite.LiteSubscriptions``)
   with ``--lite-topics`` lite topics of one consumer group, spread over ``--clients``
   clients (each within ``lite_subscription_quota``, 2000 by default: 100,000 need 50
   clients): the memory it holds (tracemalloc) per subscription; the time of one
   PARTIAL_ADD per lite topic (what the SDKs' ``subscribe_lite`` sends) and of one
   COMPLETE_ADD per client (their 30 s resync); and what a pop of that group then costs:
   the set it carries, the POP request's size, the broker's filter made from it.
2. Over real processes (a nameserver, one broker, ``hactl proxy``): the same lite topics
   subscribed with SyncLiteSubscription calls over gRPC (``--clients`` clients at once,
   one PARTIAL_ADD per lite topic), the gateway's resident memory (VmRSS) before and
   after, and a ReceiveMessage of one message with the group's lite topics all
   subscribed, against a group with one.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ha_controller.filter.selector import Selector
from ha_controller.proto import broker_pb2
from ha_controller.proto.rocketmq.v2 import definition_pb2 as v2
from ha_controller.proxy.lite import LiteSubscriptions, Subscriber

PARENT = "BenchLite"
GROUP = "g-bench-lite"
MIB = 1024 * 1024


def names(n: int) -> list[str]:
    return [f"device-{i:07d}" for i in range(n)]  # 14 bytes, as a device or session id


def spread(all_names: list[str], clients: int) -> list[tuple[Subscriber, list[str]]]:
    per = -(-len(all_names) // clients)
    return [
        (Subscriber(f"client-{c}", GROUP, PARENT), all_names[c * per : (c + 1) * per])
        for c in range(clients)
    ]


def in_process(n: int, clients: int) -> None:
    print(f"== the gateway's table, in this process: {n:,} lite topics, {clients} clients")
    # timed without tracemalloc (it slows every allocation), then measured with it
    parts = spread(names(n), clients)
    quota = max(len(p) for _, p in parts)
    table = LiteSubscriptions(client_quota=quota, max_total=n)
    t0 = time.perf_counter()
    for sub, part in parts:
        for name in part:
            table.sync(sub, v2.PARTIAL_ADD, (name,))
    add_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    frozen = table.group_topics(GROUP, PARENT)
    freeze_s = time.perf_counter() - t0
    del table, frozen, parts
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    parts = spread(names(n), clients)  # the names counted: the gateway holds its own
    table = LiteSubscriptions(client_quota=quota, max_total=n)
    for sub, part in parts:
        for name in part:
            table.sync(sub, v2.PARTIAL_ADD, (name,))
    frozen = table.group_topics(GROUP, PARENT)
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    held = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert len(table) == n and len(frozen) == n
    print(
        f"  memory held: {held / MIB:.1f} MiB = {held / n:.0f} B per lite subscription "
        "(its name included)"
    )
    print(
        f"  {n:,} PARTIAL_ADDs of one lite topic: {add_s:.2f} s "
        f"({add_s / n * 1e6:.1f} us each, the table only)"
    )
    t0 = time.perf_counter()
    for sub, part in parts:
        table.sync(sub, v2.COMPLETE_ADD, part)
    resync_s = time.perf_counter() - t0
    print(f"  {clients} COMPLETE_ADDs (resync, unchanged sets): {resync_s * 1000:.0f} ms")
    print(f"  the set a pop carries, made again after a change: {freeze_s * 1000:.1f} ms")

    req = broker_pb2.PopMessageRequest(
        consumer_group=GROUP, topic=PARENT, queue_id=-1, lite=True, lite_topics=frozen
    )
    t0 = time.perf_counter()
    wire = req.SerializeToString()
    build_s = time.perf_counter() - t0
    parsed = broker_pb2.PopMessageRequest.FromString(wire)
    t0 = time.perf_counter()
    selector = Selector.of_request(parsed.tags, parsed.sql92, parsed.lite_topics)
    select_s = time.perf_counter() - t0
    assert selector.properties is not None
    print(
        f"  each pop of the group: a {len(wire) / MIB:.2f} MiB request "
        f"(serialized in {build_s * 1000:.1f} ms), the broker's filter made in "
        f"{select_s * 1000:.1f} ms"
    )


async def end_to_end(n: int, clients: int) -> None:
    import grpc

    from bench.common import start_cluster
    from ha_controller.client.admin import NameserverClient
    from ha_controller.proto.rocketmq.v2 import service_pb2 as v2s
    from ha_controller.proto.rocketmq.v2 import service_pb2_grpc
    from ha_controller.protocol.topics import TopicMessageType

    print(f"== through hactl proxy: {n:,} lite topics, {clients} clients subscribing at once")
    cluster = await start_cluster(1)
    try:
        async with NameserverClient([cluster.namesrv]) as ns:
            await ns.create_topic(PARENT, queues=8, message_type=TopicMessageType.LITE)
        quota = -(-n // clients)
        proxy = cluster.run_proxy(
            env={
                "HAC_LITE_SUBSCRIPTION_QUOTA": str(max(quota, 1)),
                "HAC_MAX_LITE_SUBSCRIPTIONS": str(max(n, quota) + 1),
                "HAC_LOG_LEVEL": "WARNING",
            },
            name="proxy-lite-bench",
        )
        try:
            async with grpc.aio.insecure_channel(proxy.rpc) as ch:
                stub: Any = service_pb2_grpc.MessagingServiceStub(ch)  # type: ignore[no-untyped-call]
                await _measure(stub, v2s, proxy.pid, n, clients)
        finally:
            proxy.stop()
    finally:
        cluster.stop()


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


async def _measure(stub: Any, v2s: Any, pid: int, n: int, clients: int) -> None:
    parent = v2.Resource(name=PARENT)

    def meta(cid: str) -> tuple[tuple[str, str], ...]:
        return (("x-mq-client-id", cid),)

    async def heartbeat(cid: str, group: str) -> None:
        await stub.Heartbeat(
            v2s.HeartbeatRequest(
                group=v2.Resource(name=group), client_type=v2.LITE_SIMPLE_CONSUMER
            ),
            metadata=meta(cid),
            timeout=10,
        )

    async def sync(cid: str, group: str, action: int, lite: list[str]) -> None:
        resp = await stub.SyncLiteSubscription(
            v2s.SyncLiteSubscriptionRequest(
                action=action, topic=parent, group=v2.Resource(name=group), lite_topic_set=lite
            ),
            metadata=meta(cid),
            timeout=30,
        )
        if resp.status.code != v2.OK:
            raise RuntimeError(f"SyncLiteSubscription: {resp.status}")

    parts = [(s.client_id, p) for s, p in spread(names(n), clients)]
    for cid, _ in parts:
        await heartbeat(cid, GROUP)
    await heartbeat("bench-one", "g-bench-one")
    await sync("bench-one", "g-bench-one", v2.PARTIAL_ADD, ["device-0000000"])
    gc.collect()
    await asyncio.sleep(1)
    rss_before = rss(pid)
    latencies: list[float] = []

    async def client(cid: str, part: list[str]) -> None:
        for name in part:
            t = time.perf_counter()
            await sync(cid, GROUP, v2.PARTIAL_ADD, [name])
            latencies.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(client(cid, part) for cid, part in parts))
    took = time.perf_counter() - t0
    await asyncio.sleep(1)
    rss_after = rss(pid)
    latencies.sort()
    print(
        f"  {n:,} SyncLiteSubscription PARTIAL_ADDs (one lite topic each): {took:.1f} s, "
        f"{n / took:,.0f}/s; p50 {statistics.median(latencies) * 1000:.1f} ms, "
        f"p99 {latencies[int(len(latencies) * 0.99)] * 1000:.1f} ms"
    )
    grown = rss_after - rss_before
    print(
        f"  gateway VmRSS {rss_before / MIB:.0f} -> {rss_after / MIB:.0f} MiB: "
        f"{grown / n:.0f} B per lite subscription"
    )
    t0 = time.perf_counter()
    await asyncio.gather(*(sync(cid, GROUP, v2.COMPLETE_ADD, part) for cid, part in parts))
    print(
        f"  {clients} COMPLETE_ADDs of {len(parts[0][1]):,} each (the SDKs' 30 s resync): "
        f"{(time.perf_counter() - t0) * 1000:.0f} ms"
    )

    # one message each, received by the big group and by the group of one lite topic
    sent = await stub.SendMessage(
        v2s.SendMessageRequest(
            messages=[
                v2.Message(
                    topic=parent,
                    body=b"x",
                    system_properties=v2.SystemProperties(
                        message_id=f"BENCHLITE{i:04d}", message_type=v2.LITE, lite_topic=name
                    ),
                )
                for i, name in enumerate(("device-0000000", names(n)[-1]))
            ]
        ),
        timeout=10,
    )
    assert all(e.status.code == v2.OK for e in sent.entries), sent
    route = await stub.QueryRoute(v2s.QueryRouteRequest(topic=parent), timeout=10)
    queue = route.message_queues[0]  # a receive pops all of its broker's queues
    for group, cid, want, subscribed in (
        ("g-bench-one", "bench-one", 1, 1),
        (GROUP, parts[0][0], 2, n),
    ):
        t = time.perf_counter()
        got = 0
        while got < want and time.perf_counter() - t < 30:
            request = v2s.ReceiveMessageRequest(
                group=v2.Resource(name=group),
                message_queue=queue,
                filter_expression=v2.FilterExpression(type=v2.TAG, expression="*"),
                batch_size=16,
                invisible_duration=_duration(30),
                long_polling_timeout=_duration(1),
            )
            async for r in stub.ReceiveMessage(request, metadata=meta(cid), timeout=10):
                if r.WhichOneof("content") == "message":
                    got += 1
        print(
            f"  a receive of its {want} message(s) by a group with {subscribed:,} lite "
            f"topic(s) subscribed: {(time.perf_counter() - t) * 1000:.0f} ms"
        )


def _duration(seconds: int) -> Any:
    from google.protobuf.duration_pb2 import Duration

    return Duration(seconds=seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lite-topics", type=int, default=100_000)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--no-processes", action="store_true", help="part 1 only")
    args = parser.parse_args()
    in_process(args.lite_topics, args.clients)
    if not args.no_processes:
        asyncio.run(end_to_end(args.lite_topics, args.clients))


if __name__ == "__main__":
    main()
