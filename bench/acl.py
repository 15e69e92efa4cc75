"""What the client ACL costs: the guard per request, and produce with it on and off.

    .venv/bin/python bench/acl.py guard [--requests 50000]
    .venv/bin/python bench/acl.py produce [--count 20000] [--rounds 2]

``guard`` runs the dispatcher guard in this process on one signed 1 KiB SEND_MESSAGE
(its body, its signature, the replay window, the decision): with the ACL off (only the
group-name checks) as the baseline, then with ACL 2.0 on for a Normal user with 50
entries (prefixes and literals), with the decision cached and without (every request
a topic not seen before), and a Super user.  It prints microseconds per request and
the ratio to the baseline.

``produce`` starts one group (master + SYNC slave) twice in the same run, without
the ACL and with a cluster secret and the ACL (anonymous access off, the producer
signing as a Normal user), sends ``--count`` 1 KiB messages with 64 in flight to
each, alternating ``--rounds`` times, and prints msg/s of both and their ratio.
``make bench`` prints the same row (:func:`produce_row`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import produce_ab

SECRET = "bench cluster secret"
ADMIN = ("admin", "admin-secret-key")
USER = ("bench-user", "bench-user-secret")
TOPIC = "BenchAcl"
SIZE = 1024
ACL_FILE = f"""
[[users]]
access_key = "{ADMIN[0]}"
secret_key = "{ADMIN[1]}"
admin = true

[[users]]
access_key = "{USER[0]}"
secret_key = "{USER[1]}"
topic_perms = [{", ".join(f'"{TOPIC}{i}=PUB|SUB"' for i in range(40))}, "{TOPIC}=PUB|SUB"]
group_perms = [{", ".join(f'"g{i}=SUB"' for i in range(9))}]
"""


# ---- the guard, in process ----------------------------------------------------------------


def _guard_cost(requests: int) -> dict[str, float]:
    import tomllib
    from dataclasses import dataclass

    from ha_controller.acl import Acl, AclHolder, Credentials, PolicyEntry, guard, parse_acl
    from ha_controller.auth import ClusterAuth
    from ha_controller.proto import broker_pb2
    from ha_controller.protocol.codes import RequestCode
    from ha_controller.rpc.connection import RequestContext

    table = parse_acl(tomllib.loads(ACL_FILE))
    table = table.create_acl(
        USER[0],
        [
            PolicyEntry.from_dict({"resource": f"Topic:pre{i}-*", "actions": ["Pub"]})
            for i in range(10)
        ],
    )

    @dataclass
    class Conn:
        peer: str = "10.1.2.3:40000"

    code = RequestCode.SEND_MESSAGE

    def body(topic: str) -> bytes:
        return broker_pb2.SendMessageRequest(
            producer_group="p", topic=topic, entries=[broker_pb2.SendEntry(body=b"x" * SIZE)]
        ).SerializeToString()

    def run(check: Any, creds: Credentials | None, topics: list[str]) -> float:
        bodies = [body(t) for t in topics]
        signed = [(b, creds.sign(code, b) if creds else None) for b in bodies]
        n = len(signed)
        t0 = time.perf_counter()
        for i in range(requests):
            b, auth = signed[i % n]
            if creds is not None and i >= n:
                auth = creds.sign(code, b)  # a fresh nonce each time, as a client sends
            check(RequestContext(Conn(), code, 0.0, 0, auth), b)  # type: ignore[arg-type]
        return (time.perf_counter() - t0) / requests * 1e6

    user = Credentials(*USER)
    root = Credentials(*ADMIN)
    off = guard(ClusterAuth(None), Acl(None))
    on = guard(ClusterAuth(SECRET), Acl(AclHolder(table), allow_anonymous=False))
    sign_only = 0.0
    b = body(TOPIC)
    t0 = time.perf_counter()
    for _ in range(requests):
        user.sign(code, b)
    sign_only = (time.perf_counter() - t0) / requests * 1e6
    out = {
        "acl off (baseline)": run(off, None, [TOPIC]),
        "acl on, Normal user, decision cached": run(on, user, [TOPIC]) - sign_only,
        "acl on, Normal user, a new topic each time": run(
            on, user, [f"pre{i % 10}-{i}" for i in range(requests)]
        )
        - sign_only,
        "acl on, Super user": run(on, root, [TOPIC]) - sign_only,
    }
    return out


def cmd_guard(args: argparse.Namespace) -> None:
    costs = _guard_cost(args.requests)
    base = costs["acl off (baseline)"]
    print(f"guard cost per 1 KiB SEND_MESSAGE ({args.requests} requests, this process):")
    for name, us in costs.items():
        print(f"  {name:<45} {us:7.1f} us   {us / base:5.1f}x the baseline")
    if args.json:
        print(json.dumps(costs))


# ---- produce with the ACL on and off ------------------------------------------------------


def _acl_mode() -> produce_ab.Mode:
    from ha_controller.acl import Credentials

    return produce_ab.Mode(
        env={
            "HAC_CLUSTER_SECRET": SECRET,
            "HAC_ACL_ENABLED": "true",
            "HAC_ACL_ALLOW_ANONYMOUS": "false",
        },
        creds=Credentials(*USER),
        admin=Credentials(*ADMIN),
        prepare=_write_acl_file,
    )


def _write_acl_file(workdir: Path) -> dict[str, str]:
    path = workdir / "acl.toml"
    path.write_text(ACL_FILE)
    return {"HAC_ACL_FILE": str(path)}


async def produce_row(count: int = 20_000, rounds: int = 2) -> dict[str, float]:
    """msg/s of produce with the ACL off and on (the best of ``rounds`` each,
    alternating), and on/off."""
    best = await produce_ab.compare(
        {"off": produce_ab.Mode(), "on": _acl_mode()}, TOPIC, count, rounds
    )
    return {
        "acl_off_msgs_s": best["off"],
        "acl_on_msgs_s": best["on"],
        "ratio": best["on"] / best["off"],
    }


def cmd_produce(args: argparse.Namespace) -> None:
    row = asyncio.run(produce_row(args.count, args.rounds))
    print(
        f"produce 1 KiB, SYNC, 64 in flight: ACL off {row['acl_off_msgs_s']:,.0f} msg/s, "
        f"ACL on {row['acl_on_msgs_s']:,.0f} msg/s: on/off {row['ratio']:.2f}x"
    )
    if args.json:
        print(json.dumps(row))


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("guard", help="the guard's cost per request, in process")
    g.add_argument("--requests", type=int, default=50_000)
    g.add_argument("--json", action="store_true")
    g.set_defaults(func=cmd_guard)
    pr = sub.add_parser("produce", help="produce msg/s with the ACL off and on")
    pr.add_argument("--count", type=int, default=20_000)
    pr.add_argument("--rounds", type=int, default=2)
    pr.add_argument("--json", action="store_true")
    pr.set_defaults(func=cmd_produce)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
