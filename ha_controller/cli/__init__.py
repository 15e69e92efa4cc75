"""``hactl``: the operator's front door.

One module per area, each adding its sub-commands with ``add_commands(sub)``:

- :mod:`.services` — ``nameserver``, ``broker``, ``proxy``: run a service process;
- :mod:`.demo` — ``demo``: a whole failover on loopback, narrated, with a verdict
  (the scenario is :mod:`.demo_scenario`);
- :mod:`.tools` — ``produce``, ``consume``, ``topic create|update|delete|list|describe``,
  ``groups``, ``route``: inspect and exercise a running cluster (``--namesrv
  H:P[,H:P]``, ``--json``);
- :mod:`.drill` — ``drill``, ``analyze``: failover drills and their Spark verdict;
- :mod:`.acl` — ``user``, ``acl``: ACL 2.0 users and policy entries at runtime.

Importing this package is cheap: each command imports what it needs (the services, the
client SDK, the drill runner, pyspark, grpc, rich) when it runs, so ``hactl --help`` is
fast.  Exit codes: the command's own (see each command's ``--help``), 2 for bad
arguments or a configuration error, 1 for any other failure, which is one line on
stderr (an :class:`~ha_controller.protocol.errors.HaError`, a port in use, a file that
cannot be read), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from ha_controller.cli import acl, demo, drill, groups, message, produce, services, topics
from ha_controller.cli.common import HelpFormatter
from ha_controller.protocol.errors import ConfigError, HaError, TlsClosedEarly, TlsError

__all__ = ["build_parser", "describe_os_error", "main", "package_version"]

_EPILOG = """\
exit status: 0 success; 1 failure (one line on stderr); 2 bad arguments or
configuration; 3 produce: some sends failed; 130 interrupted.  Each command's --help
says more."""


def package_version() -> str:
    """The installed distribution's version (``unknown`` when not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ha-controller")
    except PackageNotFoundError:
        return "unknown (not installed)"


class _VersionAction(argparse.Action):
    """``--version``: read from the package metadata only when asked."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        kwargs.setdefault("help", "print the version and exit")
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        print(f"hactl {package_version()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hactl",
        description="ha-controller: RocketMQ RIP-32 slave-acting-master broker cluster.",
        epilog=_EPILOG,
        formatter_class=HelpFormatter,
    )
    p.add_argument("--version", action=_VersionAction)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    services.add_commands(sub)  # nameserver, broker, proxy
    demo.add_commands(sub)
    produce.add_commands(sub)  # produce, consume
    topics.add_commands(sub)  # topic, route
    groups.add_commands(sub)  # group, groups
    message.add_commands(sub)  # message query
    drill.add_commands(sub)  # drill, analyze
    acl.add_commands(sub)  # user, acl
    return p


def describe_os_error(exc: OSError) -> str:
    """One line for an OSError: which address could not be listened on and why, or the
    file and what is wrong with it."""
    text = str(exc)
    m = re.search(r"\('([^']*)', (\d+)\)", text)
    addr = f"{m[1]}:{m[2]}" if m else None
    if exc.errno == errno.EADDRINUSE:
        addr = addr or (str(exc.filename) if exc.filename else None)
        where = f" on {addr}" if addr else ""
        return (
            f"cannot listen{where}: address already in use (another process holds it; "
            "choose another port, 0 = any free one)"
        )
    if exc.errno in (errno.EACCES, errno.EADDRNOTAVAIL) and addr is not None:
        reason = os.strerror(exc.errno).lower()
        return f"cannot listen on {addr}: {reason}"
    if exc.filename is not None and exc.strerror:
        return f"{exc.strerror}: {exc.filename}"
    return text


def _single(exc: BaseException) -> BaseException:
    """The one error inside (nested) exception groups of one member each."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def _tls_cause(exc: BaseException) -> HaError | None:
    """The TLS error ``exc`` is or was caused by (a nameserver list that failed because
    of TLS), if any."""
    seen: BaseException | None = exc
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, TlsError | TlsClosedEarly):
            return seen
        seen = seen.__cause__
    return None


def _report(exc: Exception, prog: str) -> int:
    """Print ``exc`` as one line; its exit code.  Re-raises what is not ours to report."""
    error = _single(exc)
    if isinstance(error, ConfigError):
        print(f"hactl: config error: {error}", file=sys.stderr)
        return 2
    if isinstance(error, HaError):
        tls = _tls_cause(error)
        if tls is not None:  # the fix is a TLS setting, not "is it running?"
            print(f"{prog}: {type(tls).__name__}: {tls}", file=sys.stderr)
        elif type(error).__name__ == "NameserverUnavailable":
            print(f"{prog}: {error}; is a nameserver running there? (--namesrv)", file=sys.stderr)
        else:
            print(f"{prog}: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    if isinstance(error, BrokenPipeError):  # stdout closed early (| head): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    if isinstance(error, OSError):
        print(f"{prog}: {describe_os_error(error)}", file=sys.stderr)
        return 1
    raise exc


def main(argv: Sequence[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    prog = " ".join(["hactl", args.command, *filter(None, [getattr(args, "topic_command", None)])])
    try:
        code = args.func(args)
    except KeyboardInterrupt:
        code = 130
    except (HaError, OSError, ExceptionGroup) as exc:
        code = _report(exc, prog)
    sys.exit(code)
