"""``hactl groups`` (broker groups, their members and acting masters) and ``hactl group
update|describe|lag|switch`` (consumer groups' settings and lag, a planned master
switch).

Every tool takes ``--namesrv H:P[,H:P]`` and the TLS options (``--tls-ca``,
``--tls-cert``, ``--tls-key``, or ``HAC_TLS_*``: :func:`.common.client_tls`) and the ACL
credentials (``--access-key``/``--secret-key`` or ``HAC_ACCESS_KEY``/``HAC_SECRET_KEY``:
:func:`.common.client_credentials`); ``--json`` makes the output machine-readable.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from typing import TYPE_CHECKING, Any

from ha_controller.cli.common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PARTIAL,
    add_namesrv_arguments,
    add_parser,
    add_tool,
    client_credentials,
    client_tls,
    comma_list,
    print_table,
    run_async,
)
from ha_controller.protocol.errors import BadRequest, InSyncReplicasNotEnough

if TYPE_CHECKING:
    from ha_controller.client.admin import GroupInfo, GroupLag

from ha_controller.cli.topics import any_topic_name

__all__ = ["add_commands", "age_text", "group_name", "lag_document", "switch_target"]

LAG_EPILOG = """\
exit status:
  0  every broker group answered
  1  no broker group holds an offset of the group (or none could be asked)
  3  some broker groups answered, others could not be asked (each is named)

With --json one document {"group", "lag", "queues": [{"topic", "brokerName",
"brokerId", "queueId", "maxOffset", "consumerOffset", "lag", "oldestAgeMs"}],
"failed": {brokerName: reason}}; brokerId is the member that answered (0, or the
acting slave's id), consumerOffset -1 and oldestAgeMs null where nothing is committed
or nothing waits.
"""


def group_name(text: str) -> str:
    """A consumer group name a client may use (see
    :func:`ha_controller.protocol.topics.group_name_problem`)."""
    from ha_controller.protocol.topics import group_name_problem

    problem = group_name_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def switch_target_arg(text: str) -> int | None:
    """``--to``: a member id, or ``auto`` (None: chosen from the group view)."""
    if text == "auto":
        return None
    try:
        member = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a member id or auto, got {text!r}") from None
    if member < 0:
        raise argparse.ArgumentTypeError(f"a member id is 0 or more, got {member}")
    return member


def add_commands(sub: Any) -> None:
    """Add ``group`` and ``groups``."""
    group = add_parser(
        sub,
        "group",
        help="manage consumer groups' settings",
        description="Manage consumer groups' own settings (RocketMQ subscription group configs).",
    )
    group_sub = group.add_subparsers(dest="group_command", required=True, metavar="ACTION")
    gu = add_parser(
        group_sub,
        "update",
        help="set a consumer group's settings on every master",
        description=textwrap.fill(
            "Set a consumer group's settings on every master.  --orderly makes its POP "
            "orderly (RocketMQ's consumeMessageOrderly): each queue goes to one batch at a "
            "time, until the batch is acked or its invisible time is over; the gRPC gateway "
            "then tells the group's SDK clients to consume FIFO."
        ),
    )
    add_namesrv_arguments(gu)
    gu.add_argument("group", type=group_name, help="the consumer group")
    gu.add_argument("--cluster", help="only the masters of this cluster (default: all)")
    orderly = gu.add_mutually_exclusive_group(required=True)
    orderly.add_argument(
        "--orderly",
        dest="orderly",
        action="store_true",
        default=argparse.SUPPRESS,
        help="consume in order",
    )
    orderly.add_argument(
        "--no-orderly",
        dest="orderly",
        action="store_false",
        default=argparse.SUPPRESS,
        help="consume concurrently",
    )
    gu.set_defaults(func=run_async(_group_update))
    gd = add_parser(
        group_sub,
        "describe",
        help="a consumer group's settings on every broker group",
        description="A consumer group's settings, as each broker group's master has them.",
    )
    add_namesrv_arguments(gd)
    gd.add_argument("group", type=group_name, help="the consumer group")
    gd.add_argument("--cluster", help="only the masters of this cluster (default: all)")
    gd.add_argument("--json", action="store_true", help="machine-readable output")
    gd.set_defaults(func=run_async(_group_describe))
    gl = add_parser(
        group_sub,
        "lag",
        help="a consumer group's lag on every queue",
        description=textwrap.fill(
            "A consumer group's lag on every queue of every broker group, as the group's "
            "master (or the slave acting for it) computes it for "
            "rocketmq_consumer_lag_messages: the queue's max offset, the group's committed "
            "offset, the lag (their difference) and how long the oldest unconsumed message "
            "has waited.  A queue the group committed nothing for shows '-' and counts no "
            "lag, as in RocketMQ."
        ),
        epilog=LAG_EPILOG,
    )
    add_namesrv_arguments(gl)
    gl.add_argument("group", type=group_name, help="the consumer group")
    gl.add_argument("--topic", type=any_topic_name, help="only this topic")
    gl.add_argument("--cluster", help="only the broker groups of this cluster (default: all)")
    gl.add_argument("--json", action="store_true", help="machine-readable output")
    gl.set_defaults(func=run_async(_group_lag))
    gs = add_parser(
        group_sub,
        "switch",
        help="make another member a broker group's master (controller mode)",
        description=textwrap.fill(
            "Planned handover of a broker group's master (controller mode: the nameservers "
            "run with --etcd-endpoints).  The master stops taking writes, the target member "
            "catches up with it, the controller moves the group to a new epoch with the "
            "target as master (brokerId 0) and the old master rejoins as a slave.  Writes "
            "to the group pause for about half a second; nothing acknowledged is lost.  "
            "The target must be in the group's sync-state set (hactl groups shows it); "
            "--to auto takes its lowest member other than the master.  "
            "This is what a Kubernetes preStop hook or a node drain calls: with "
            "--if-master ID it switches only when member ID is the master, and does "
            "nothing (exit 0) on any other member."
        ),
    )
    add_namesrv_arguments(gs)
    gs.add_argument("broker_group", metavar="GROUP", help="the broker group (broker name)")
    gs.add_argument(
        "--to",
        dest="target",
        type=switch_target_arg,
        required=True,
        metavar="ID|auto",
        help=(
            "member id (configured broker_id) of the new master, or auto: the lowest "
            "in-sync slave of the nameserver's group view"
        ),
    )
    gs.add_argument(
        "--if-master",
        dest="if_master",
        type=int,
        metavar="ID",
        help="switch only when member ID is the group's master now; otherwise do nothing",
    )
    gs.add_argument("--cluster", default="DefaultCluster", help="its cluster (default %(default)s)")
    gs.add_argument(
        "--timeout-ms",
        type=int,
        default=3000,
        metavar="MS",
        help="how long the master may pause for the target (default %(default)s)",
    )
    gs.add_argument("--json", action="store_true", help="machine-readable output")
    gs.set_defaults(func=run_async(_group_switch))

    add_tool(sub, "groups", "show broker groups, their members and acting masters", _groups)


def switch_target(group: GroupInfo, target: int | None, if_master: int | None) -> int | None:
    """The member ``hactl group switch`` makes master: ``target``, or for ``auto`` the
    lowest member of the sync-state set other than the master; None when ``if_master``
    names a member that is not the master (nothing to do)."""
    if group.epoch is None or group.master_member is None:
        raise BadRequest(
            f"{group.broker_name}: not in controller mode (the nameservers run without "
            "--etcd-endpoints), so it has no master to switch"
        )
    if if_master is not None and if_master != group.master_member:
        return None
    if target is not None:
        return target
    slaves = sorted(m for m in group.sync_state_set if m != group.master_member)
    if not slaves:
        raise InSyncReplicasNotEnough(
            f"{group.broker_name}: the sync-state set {list(group.sync_state_set)} holds no "
            f"slave besides master {group.master_member}: no member can take over now"
        )
    return slaves[0]


async def _group_switch(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient

    async with NameserverClient(
        comma_list(args.namesrv), tls=client_tls(args), credentials=client_credentials(args)
    ) as ns:
        target = args.target
        if target is None or args.if_master is not None:
            found = [
                g
                for g in await ns.groups()
                if g.cluster == args.cluster and g.broker_name == args.broker_group
            ]
            if not found:
                raise BadRequest(f"no broker group {args.broker_group} in cluster {args.cluster}")
            target = switch_target(found[0], target, args.if_master)
            if target is None:
                master = found[0].master_member
                if args.json:
                    print(json.dumps({"group": args.broker_group, "masterId": master}))
                else:
                    print(
                        f"{args.broker_group}: member {args.if_master} is not the master "
                        f"(member {master} is): nothing to switch"
                    )
                return EXIT_OK
        resp = await ns.switch_master(
            args.cluster, args.broker_group, target, timeout_ms=args.timeout_ms
        )
    state = resp.controller.state
    out = {
        "group": args.broker_group,
        "epoch": state.epoch,
        "masterId": state.master_member,
        "syncStateSet": sorted(state.sync_state_set),
        "pausedMs": resp.paused_ms,
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"{args.broker_group}: member {state.master_member} is master of epoch "
            f"{state.epoch} (writes paused {resp.paused_ms} ms on the old master; "
            f"sync-state set {sorted(state.sync_state_set)})"
        )
    return EXIT_OK


async def _groups(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient

    async with NameserverClient(
        comma_list(args.namesrv), tls=client_tls(args), credentials=client_credentials(args)
    ) as ns:
        groups = await ns.groups()
    if args.json:
        print(
            json.dumps(
                [
                    {
                        "cluster": g.cluster,
                        "brokerName": g.broker_name,
                        "enableActingMaster": g.enable_acting_master,
                        "members": {str(k): v for k, v in sorted(g.members.items())},
                        "masterOnline": g.master_online,
                        "actingBrokerId": g.acting_broker_id,
                        **(
                            {
                                "epoch": g.epoch,
                                "masterId": g.master_member,
                                "syncStateSet": list(g.sync_state_set),
                            }
                            if g.epoch is not None
                            else {}
                        ),
                    }
                    for g in groups
                ]
            )
        )
        return EXIT_OK
    controlled = any(g.epoch is not None for g in groups)
    rows = [
        (
            g.cluster,
            g.broker_name,
            "yes" if g.master_online else "NO",
            "-" if g.acting_broker_id is None else g.acting_broker_id,
            *(
                (
                    "-" if g.epoch is None else g.epoch,
                    "-" if g.master_member is None else g.master_member,
                    ",".join(str(m) for m in g.sync_state_set) or "-",
                )
                if controlled
                else ()
            ),
            " ".join(f"{k}={v}" for k, v in sorted(g.members.items())),
        )
        for g in groups
    ]
    head: tuple[str, ...] = ("CLUSTER", "GROUP", "MASTER", "ACTING")
    if controlled:
        head = (*head, "EPOCH", "MASTER-ID", "SYNC-SET")
    print_table((*head, "MEMBERS"), rows)
    return EXIT_OK


async def _group_update(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient

    async with NameserverClient(
        comma_list(args.namesrv), tls=client_tls(args), credentials=client_credentials(args)
    ) as ns:
        updated = await ns.update_subscription_group(
            args.group, orderly=args.orderly, cluster=args.cluster
        )
    if not updated:
        where = f"cluster {args.cluster}" if args.cluster else "the cluster"
        print(f"hactl group update: no master of {where} is online", file=sys.stderr)
        return EXIT_FAILED
    mode = "orderly" if args.orderly else "concurrently"
    print(f"group {args.group} consumes {mode} on {', '.join(updated)}")
    return EXIT_OK


def age_text(ms: int | None) -> str:
    """``57s``, ``12m03s``, ``2h05m`` (:func:`.progress.format_duration`); ``-`` for
    None, and sub-second ages as ``0.4s``."""
    from ha_controller.cli.progress import format_duration

    if ms is None:
        return "-"
    return f"{ms / 1000:.1f}s" if ms < 1000 else format_duration(ms / 1000)


def lag_document(lag: GroupLag) -> dict[str, Any]:
    """The ``hactl group lag --json`` document."""
    return {
        "group": lag.group,
        "lag": lag.lag,
        "queues": [
            {
                "topic": q.topic,
                "brokerName": q.broker_name,
                "brokerId": lag.answered_by[q.broker_name],
                "queueId": q.queue_id,
                "maxOffset": q.max_offset,
                "consumerOffset": q.consumer_offset,
                "lag": q.lag,
                "oldestAgeMs": q.oldest_age_ms,
            }
            for q in lag.queues
        ],
        "failed": dict(sorted(lag.failed.items())),
    }


async def _group_lag(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient

    async with NameserverClient(
        comma_list(args.namesrv), tls=client_tls(args), credentials=client_credentials(args)
    ) as ns:
        lag = await ns.consumer_lag(args.group, topic=args.topic, cluster=args.cluster)
    if args.json:
        print(json.dumps(lag_document(lag)))
    elif lag.queues:
        ages = [q.oldest_age_ms for q in lag.queues if q.oldest_age_ms is not None]
        oldest = f", oldest unconsumed message {age_text(max(ages))} old" if ages else ""
        print(f"consumer group {args.group}: lag {lag.lag} messages{oldest}")
        for name, member in sorted(lag.answered_by.items()):
            if member != 0:
                print(f"{name}: answered by slave {member}, acting for its master")
        print_table(
            ("TOPIC", "BROKER", "QUEUE", "MAX", "CONSUMER", "LAG", "OLDEST"),
            [
                (
                    q.topic,
                    q.broker_name,
                    q.queue_id,
                    q.max_offset,
                    "-" if q.consumer_offset < 0 else q.consumer_offset,
                    q.lag,
                    age_text(q.oldest_age_ms),
                )
                for q in lag.queues
            ],
        )
    for name, why in sorted(lag.failed.items()):
        print(f"hactl group lag: {name} could not be asked: {why}", file=sys.stderr)
    if not lag.queues:
        if not args.json:
            where = f" for topic {args.topic}" if args.topic else ""
            print(
                f"hactl group lag: consumer group {args.group} has committed no offset{where} "
                f"on {'any broker group that answered' if lag.failed else 'any broker group'}",
                file=sys.stderr,
            )
        return EXIT_FAILED
    return EXIT_PARTIAL if lag.failed else EXIT_OK


async def _group_describe(args: argparse.Namespace) -> int:
    from ha_controller.client.admin import NameserverClient

    async with NameserverClient(
        comma_list(args.namesrv), tls=client_tls(args), credentials=client_credentials(args)
    ) as ns:
        per_group = await ns.subscription_group(args.group, args.cluster)
    if args.json:
        print(json.dumps({"group": args.group, "orderly": per_group}))
    else:
        for name, orderly in sorted(per_group.items()):
            state = "not configured" if orderly is None else "orderly" if orderly else "concurrent"
            print(f"{args.group} on {name}: {state}")
    return EXIT_OK
