"""What consumer lag costs a broker: one scrape of its lag series, in this process.

    .venv/bin/python bench/consumer_lag.py [--groups 1 10 100] [--queues 64] [--repeat 5]

A real store (a temporary directory) holds one topic of ``--queues`` queues with 20
messages each; ``--groups`` consumer groups have each committed offset 10 on every
queue (so every queue lags and its oldest message is read for its store time).  Each
size times the computation alone (``BrokerCore.consumer_lag``'s, over the store and
an offset table) and a whole ``generate_latest`` of the lag collector with the
default bound of 1000 per-queue series.  Lag costs nothing per message: this is all
it costs, once per scrape.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from broker_agent.lag import queue_lags
from broker_agent.metrics import ConsumerLagCollector
from broker_agent.store import MessageStore, StoreConfig
from ha_controller.protocol.properties import now_ms

TOPIC = "LagTopic"


def timed(fn: object, repeat: int) -> float:
    """Median seconds of ``repeat`` calls."""
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()  # type: ignore[operator]
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, nargs="+", default=[1, 10, 100])
    ap.add_argument("--queues", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        with MessageStore.open(Path(tmp) / "store", StoreConfig()) as store:
            for q in range(args.queues):
                for _ in range(20):
                    store.put(TOPIC, q, b"x" * 128)
            print(f"{'groups':>7} {'queue rows':>11} {'compute ms':>11} {'scrape ms':>10} "
                  f"{'us/row':>7} {'bytes':>9}")  # fmt: skip
            for groups in args.groups:
                offsets = [
                    (f"g{g:04d}", TOPIC, q, 10) for g in range(groups) for q in range(args.queues)
                ]

                def compute(offsets: list[tuple[str, str, int, int]] = offsets) -> list[object]:
                    return list(queue_lags(store, offsets, lambda t: args.queues))

                registry = CollectorRegistry()
                registry.register(
                    ConsumerLagCollector(
                        compute,  # type: ignore[arg-type]
                        now_ms,
                        1000,
                        {"cluster": "c", "broker_name": "b", "broker_id": "0"},
                    )
                )
                body = generate_latest(registry)
                c = timed(compute, args.repeat)
                s = timed(lambda registry=registry: generate_latest(registry), args.repeat)
                rows = groups * args.queues
                print(
                    f"{groups:>7} {rows:>11} {c * 1000:>11.1f} {s * 1000:>10.1f} "
                    f"{s / rows * 1e6:>7.1f} {len(body):>9}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
