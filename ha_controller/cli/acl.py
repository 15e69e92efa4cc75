"""``hactl user create|update|delete|get|list`` and ``hactl acl
create|update|delete|get|list``: ACL 2.0 users and their policy entries, changed at
runtime, without a restart (RocketMQ 5.3's ``mqadmin createUser`` / ``createAcl``).

Every command is a Super user's (``--access-key``/``--secret-key`` or
``HAC_ACCESS_KEY``/``HAC_SECRET_KEY``) and needs a cluster with a ``cluster_secret``.
A bad argument (an unknown action, a malformed resource, a short password) is a usage
error before anything is sent (exit 2); a change the cluster refuses (a user that
exists, an entry that does not) is one line on stderr (exit 1) and changes nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from typing import TYPE_CHECKING, Any

from ha_controller.cli.common import (
    EXIT_OK,
    add_namesrv_arguments,
    add_parser,
    client_credentials,
    client_tls,
    comma_list,
    float_above,
    print_table,
    run_async,
)

if TYPE_CHECKING:
    from ha_controller.client.acl_admin import AclAdmin
    from ha_controller.client.admin import NameserverClient

__all__ = ["add_commands"]


_MODEL = (
    "A resource is Topic:NAME, Group:NAME, Cluster:NAME, a prefix (Topic:orders-*), a "
    "whole type (Topic:*) or * (everything).  Actions: Pub, Sub, Create, Update, Delete, "
    "Get, List, All.  For each action on a resource the most specific matching entry "
    "decides (a name before a longer prefix, before Topic:*, before *); among equally "
    "specific ones Deny wins; no matching entry is a refusal.  Super users pass every "
    "check.  A change made here is in effect on every broker, nameserver and gateway "
    "within about a second."
)


def _resource(text: str) -> str:
    from ha_controller.acl import AclInvalid, Resource

    try:
        return Resource.parse(text).key()
    except AclInvalid as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _actions(text: str) -> list[str]:
    from ha_controller.acl import AclInvalid
    from ha_controller.acl.model import parse_actions

    try:
        return sorted(a.value for a in parse_actions(text.split(",")))
    except AclInvalid as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _source_ip(text: str) -> str:
    from ha_controller.acl import AclInvalid
    from ha_controller.acl.model import parse_source_ips

    try:
        return str(parse_source_ips([text])[0])
    except (AclInvalid, IndexError) as exc:
        raise argparse.ArgumentTypeError(str(exc) or "empty source IP") from None


def _choice(kind: Any) -> Any:
    def parse(text: str) -> str:
        from ha_controller.acl import AclInvalid

        try:
            return str(kind.parse(text, kind.__name__).value)
        except AclInvalid as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _username(text: str) -> str:
    from ha_controller.acl import AclInvalid
    from ha_controller.acl.model import subject_of

    try:
        return subject_of(text)
    except AclInvalid as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_commands(sub: Any) -> None:
    """Add ``user`` and ``acl``."""
    from ha_controller.acl.model import Decision, UserStatus, UserType

    def common(t: argparse.ArgumentParser) -> None:
        add_namesrv_arguments(t)
        t.add_argument("--cluster", help="the cluster whose brokers take it (default: any)")
        t.add_argument("--json", action="store_true", help="machine-readable output")

    def change(t: argparse.ArgumentParser) -> None:
        t.add_argument(
            "--wait",
            type=float_above(0),
            default=5.0,
            metavar="S",
            help="seconds to wait until every broker and nameserver holds the change",
        )

    # ---- user -------------------------------------------------------------------------
    user = add_parser(
        sub,
        "user",
        help="manage ACL users (Super users only)",
        description=textwrap.fill(
            "Manage the ACL's users: a username (the access key a client signs with), a "
            "password (its secret key), a type (Super: allowed everything; Normal: its "
            "ACL decides) and a status (enable | disable).  " + _MODEL
        ),
    )
    user_sub = user.add_subparsers(dest="user_command", required=True, metavar="ACTION")

    def user_action(name: str, help_text: str, fn: Any) -> argparse.ArgumentParser:
        t = add_parser(user_sub, name, help=help_text, description=help_text)
        common(t)
        t.set_defaults(func=run_async(fn))
        return t

    def password_args(t: argparse.ArgumentParser) -> None:
        g = t.add_argument_group(
            "password",
            "the user's secret key, 8 characters or more: from --password-file, the "
            "variable HAC_USER_PASSWORD, or --password (visible to every user of this "
            "machine while the command runs)",
        )
        g.add_argument("--password-file", metavar="FILE", help="a file holding it")
        g.add_argument("--password", metavar="SECRET", help="the password itself")

    uc = user_action("create", "create a user", _user_create)
    uc.add_argument("username", type=_username)
    password_args(uc)
    uc.add_argument("--type", type=_choice(UserType), default="Normal", help="Super | Normal")
    uc.add_argument("--status", type=_choice(UserStatus), default="enable")
    change(uc)
    uu = user_action("update", "change a user's password, type or status", _user_update)
    uu.add_argument("username", type=_username)
    password_args(uu)
    uu.add_argument("--type", type=_choice(UserType), help="Super | Normal")
    uu.add_argument("--status", type=_choice(UserStatus), help="enable | disable")
    change(uu)
    ud = user_action("delete", "delete a user and its ACL", _user_delete)
    ud.add_argument("username", type=_username)
    change(ud)
    ug = user_action("get", "show a user (never its password)", _user_get)
    ug.add_argument("username", type=_username)
    ul = user_action("list", "list the users", _user_list)
    ul.add_argument("--filter", default="", help="only usernames containing this")

    # ---- acl ------------------------------------------------------------------------
    acl = add_parser(
        sub,
        "acl",
        help="manage users' ACL entries (Super users only)",
        description=textwrap.fill("Manage the users' policy entries.  " + _MODEL),
    )
    acl_sub = acl.add_subparsers(dest="acl_command", required=True, metavar="ACTION")

    def acl_action(name: str, help_text: str, fn: Any) -> argparse.ArgumentParser:
        t = add_parser(acl_sub, name, help=help_text, description=help_text)
        common(t)
        t.set_defaults(func=run_async(fn))
        return t

    def entry_args(t: argparse.ArgumentParser) -> None:
        t.add_argument("subject", type=_username, metavar="User:NAME")
        t.add_argument(
            "--resource",
            "-r",
            type=_resource,
            action="append",
            required=True,
            help="a resource (repeat for several)",
        )
        t.add_argument(
            "--actions", "-a", type=_actions, required=True, help="comma-separated: Pub,Sub"
        )
        t.add_argument(
            "--source-ip",
            "-i",
            type=_source_ip,
            action="append",
            default=[],
            metavar="CIDR",
            help="only from these addresses (repeat; default: any)",
        )
        t.add_argument(
            "--decision", "-d", type=_choice(Decision), default="Allow", help="Allow | Deny"
        )
        change(t)

    entry_args(acl_action("create", "add entries to a user's ACL", _acl_create))
    entry_args(
        acl_action("update", "replace a user's entries for the resources named", _acl_update)
    )
    ad = acl_action("delete", "delete a user's entries for a resource, or all", _acl_delete)
    ad.add_argument("subject", type=_username, metavar="User:NAME")
    ad.add_argument("--resource", "-r", type=_resource, help="only this resource's entries")
    change(ad)
    ag = acl_action("get", "show a user's entries", _acl_get)
    ag.add_argument("subject", type=_username, metavar="User:NAME")
    al = acl_action("list", "list every user's entries", _acl_list)
    al.add_argument("--subject-filter", default="", help="only users containing this")
    al.add_argument("--resource-filter", default="", help="only resources containing this")


# ---- running them ---------------------------------------------------------------------------


def _admin(args: argparse.Namespace) -> tuple[NameserverClient, AclAdmin]:
    from ha_controller.client.acl_admin import AclAdmin
    from ha_controller.client.admin import NameserverClient

    ns = NameserverClient(
        comma_list(args.namesrv), tls=client_tls(args), credentials=client_credentials(args)
    )
    return ns, AclAdmin(ns, cluster=args.cluster)


def _password(args: argparse.Namespace, *, required: bool) -> str:
    from ha_controller.protocol.errors import ConfigError

    if args.password_file:
        try:
            with open(args.password_file, encoding="utf-8") as f:
                text = f.read().rstrip("\r\n")
        except OSError as exc:
            raise ConfigError(f"--password-file: cannot read it: {exc.strerror}") from None
    else:
        text = args.password or os.environ.get("HAC_USER_PASSWORD", "")
    if required and not text:
        raise ConfigError("a password is needed: --password-file, HAC_USER_PASSWORD or --password")
    return text


async def _done(args: argparse.Namespace, admin: AclAdmin, what: str, revision: int) -> int:
    spread = await admin.wait_everywhere(revision, args.wait)
    if args.json:
        print(
            json.dumps({"revision": revision, "holding": spread.holding, "behind": spread.behind})
        )
    else:
        n = len(spread.holding) + len(spread.behind)
        print(f"{what}: revision {revision}, in effect on {len(spread.holding)}/{n} nodes")
    if spread.behind:
        print(
            f"hactl: not yet on {', '.join(spread.behind)} after {args.wait:.0f} s (unreachable "
            "or behind; they take it when they are back)",
            file=sys.stderr,
        )
    return EXIT_OK


async def _user_create(args: argparse.Namespace) -> int:
    ns, admin = _admin(args)
    async with ns:
        rev = await admin.create_user(
            args.username,
            _password(args, required=True),
            user_type=args.type,
            status=args.status,
        )
        return await _done(args, admin, f"user {args.username} created", rev)


async def _user_update(args: argparse.Namespace) -> int:
    ns, admin = _admin(args)
    async with ns:
        rev = await admin.update_user(
            args.username,
            secret_key=_password(args, required=False),
            user_type=args.type or "",
            status=args.status or "",
        )
        return await _done(args, admin, f"user {args.username} updated", rev)


async def _user_delete(args: argparse.Namespace) -> int:
    ns, admin = _admin(args)
    async with ns:
        rev = await admin.delete_user(args.username)
        return await _done(args, admin, f"user {args.username} deleted", rev)


def _print_users(args: argparse.Namespace, users: list[Any]) -> None:
    if args.json:
        print(
            json.dumps(
                [
                    {"username": u.username, "userType": u.user_type, "userStatus": u.status}
                    for u in users
                ]
            )
        )
        return
    print_table(
        ("USERNAME", "TYPE", "STATUS"), [(u.username, u.user_type, u.status) for u in users]
    )


async def _user_get(args: argparse.Namespace) -> int:
    ns, admin = _admin(args)
    async with ns:
        _print_users(args, [await admin.user(args.username)])
    return EXIT_OK


async def _user_list(args: argparse.Namespace) -> int:
    ns, admin = _admin(args)
    async with ns:
        _print_users(args, await admin.users(args.filter))
    return EXIT_OK


def _entries(args: argparse.Namespace) -> list[Any]:
    from ha_controller.acl import PolicyEntry

    return [
        PolicyEntry.from_dict(
            {
                "resource": r,
                "actions": args.actions,
                "source_ips": args.source_ip,
                "decision": args.decision,
            }
        )
        for r in args.resource
    ]


async def _acl_create(args: argparse.Namespace) -> int:
    ns, admin = _admin(args)
    async with ns:
        rev = await admin.create_acl(args.subject, _entries(args))
        return await _done(args, admin, f"ACL of {args.subject}: entries created", rev)


async def _acl_update(args: argparse.Namespace) -> int:
    ns, admin = _admin(args)
    async with ns:
        rev = await admin.update_acl(args.subject, _entries(args))
        return await _done(args, admin, f"ACL of {args.subject}: entries updated", rev)


async def _acl_delete(args: argparse.Namespace) -> int:
    ns, admin = _admin(args)
    async with ns:
        rev = await admin.delete_acl(args.subject, args.resource or "")
        return await _done(args, admin, f"ACL of {args.subject}: entries deleted", rev)


def _print_acls(args: argparse.Namespace, acls: dict[str, list[Any]]) -> None:
    if args.json:
        print(
            json.dumps(
                [
                    {"subject": f"User:{s}", "entries": [e.to_dict() for e in entries]}
                    for s, entries in acls.items()
                ]
            )
        )
        return
    rows = [
        (
            f"User:{s}",
            e.resource.key(),
            ",".join(sorted(a.value for a in e.actions)),
            ",".join(str(n) for n in e.source_ips) or "*",
            e.decision.value,
        )
        for s, entries in acls.items()
        for e in entries
    ]
    print_table(("SUBJECT", "RESOURCE", "ACTIONS", "SOURCE", "DECISION"), rows)


async def _acl_get(args: argparse.Namespace) -> int:
    ns, admin = _admin(args)
    async with ns:
        _print_acls(args, {args.subject: await admin.acl(args.subject)})
    return EXIT_OK


async def _acl_list(args: argparse.Namespace) -> int:
    ns, admin = _admin(args)
    async with ns:
        _print_acls(args, await admin.acls(args.subject_filter, args.resource_filter))
    return EXIT_OK
