"""What every ``hactl`` area shares: the default nameserver, address lists, tables, the
help formatter, argument types that refuse bad values, the TLS options and the ACL
credentials of every command that connects, and running an async command from argparse."""

from __future__ import annotations

import argparse
import os
import textwrap
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import ssl

    from ha_controller.acl import Credentials

__all__ = [
    "DEFAULT_NAMESRV",
    "EXIT_FAILED",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "LOG_LEVELS",
    "HelpFormatter",
    "Handler",
    "add_credential_arguments",
    "add_namesrv_arguments",
    "add_parser",
    "add_tls_arguments",
    "add_tool",
    "client_credentials",
    "client_tls",
    "comma_list",
    "float_above",
    "int_range",
    "log_level",
    "print_table",
    "run_async",
    "service_tls_flags",
]

DEFAULT_NAMESRV = "127.0.0.1:9876"

#: the exit codes the client commands share (2 is argparse's: bad arguments)
EXIT_OK = 0
#: nothing done or found (produce: nothing acknowledged; consume: too few in time)
EXIT_FAILED = 1
#: part done: some sends acknowledged and some failed, some groups not asked
EXIT_PARTIAL = 3

#: a command's coroutine: the parsed arguments to its exit code
Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; ``(default: X)`` after the help of every
    option that has a default worth showing (not None/False, not already said)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if (
            not action.option_strings
            or action.default in (None, False, argparse.SUPPRESS)
            or "default" in text
        ):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def add_parser(sub: Any, name: str, **kwargs: Any) -> argparse.ArgumentParser:
    """``sub.add_parser`` with :class:`HelpFormatter`."""
    kwargs.setdefault("formatter_class", HelpFormatter)
    parser: argparse.ArgumentParser = sub.add_parser(name, **kwargs)
    return parser


def int_range(lo: int, hi: int | None = None, *, unit: str = "") -> Callable[[str], int]:
    """An argparse type: an integer in ``lo..hi`` (no upper bound when ``hi`` is None)."""
    allowed = f"{lo}..{hi}" if hi is not None else f">= {lo}"
    suffix = f" {unit}" if unit else ""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be {allowed}{suffix}, got {value}")
        return value

    parse.__name__ = "integer"
    return parse


def float_above(lo: float = 0.0, *, unit: str = "") -> Callable[[str], float]:
    """An argparse type: a finite number greater than ``lo``."""
    suffix = f" {unit}" if unit else ""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value > lo or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be > {lo:g}{suffix}, got {text}")
        return value

    parse.__name__ = "number"
    return parse


def log_level(text: str) -> str:
    """An argparse type: a logging level name, any case."""
    level = text.upper()
    if level not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(LOG_LEVELS)}, got {text!r}")
    return level


#: how a tool decides on TLS (the TLS group's description in its --help)
TLS_TOOL_RULES = (
    "TLS is on when one of these flags is given, else as HAC_TLS_ENABLED says, else "
    "when HAC_TLS_CA_FILE, HAC_TLS_CERT_FILE or HAC_TLS_KEY_FILE is set; unset flags "
    "come from those variables (and HAC_TLS_VERIFY_HOSTNAME), as the services read them."
)
#: how a service decides on TLS
TLS_SERVICE_RULES = (
    "These override the config's [tls] table (and HAC_TLS_*); one set of files serves "
    "every listener (RPC, HA, admin HTTP, gRPC) and every outgoing connection."
)


def add_tls_arguments(parser: argparse.ArgumentParser, *, service: bool = False) -> None:
    """``--tls-ca``, ``--tls-cert``, ``--tls-key`` and ``--[no-]tls-verify-hostname``.

    For a tool they configure its connections (:func:`client_tls`); for a service
    (``service=True``) they override its ``[tls]`` table (:func:`service_tls_flags`)."""
    rules = TLS_SERVICE_RULES if service else TLS_TOOL_RULES
    group = parser.add_argument_group("TLS", textwrap.fill(rules, 78))
    if service:
        group.add_argument(
            "--tls-cert",
            metavar="FILE",
            help="PEM certificate of every listener, and the client certificate of "
            "outgoing connections; turns TLS on (tls.cert_file, HAC_TLS_CERT_FILE)",
        )
        group.add_argument(
            "--tls-key", metavar="FILE", help="PEM private key of --tls-cert (tls.key_file)"
        )
        group.add_argument(
            "--tls-ca",
            metavar="FILE",
            help="PEM CA bundle that verifies peers and, with require_client_cert, clients "
            "(tls.ca_file)",
        )
    else:
        group.add_argument(
            "--tls-ca",
            metavar="FILE",
            help="connect with TLS and verify the servers against this PEM CA bundle "
            "(HAC_TLS_CA_FILE)",
        )
        group.add_argument(
            "--tls-cert",
            metavar="FILE",
            help="client certificate (PEM) for mutual TLS (HAC_TLS_CERT_FILE)",
        )
        group.add_argument(
            "--tls-key", metavar="FILE", help="private key of --tls-cert (HAC_TLS_KEY_FILE)"
        )
    group.add_argument(
        "--tls-verify-hostname",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="check that a server's certificate names the host dialled; --no-... for "
        "peers dialled by an address their certificate does not list (needs a CA) "
        "(default: HAC_TLS_VERIFY_HOSTNAME, else yes)",
    )


def service_tls_flags(args: argparse.Namespace) -> dict[str, object]:
    """The config flags of :func:`add_tls_arguments` for a service's loader (None =
    not given); a certificate given on the command line turns TLS on."""
    return {
        "tls_cert": args.tls_cert,
        "tls_key": args.tls_key,
        "tls_ca": args.tls_ca,
        "tls_verify_hostname": args.tls_verify_hostname,
        "tls_enabled": True if args.tls_cert else None,
    }


_TRUE = frozenset({"true", "1", "yes"})
_FALSE = frozenset({"false", "0", "no"})


def _env_bool(env: Mapping[str, str], name: str) -> bool | None:
    from ha_controller.protocol.errors import ConfigError

    text = env.get(name, "").strip().lower()
    if not text:
        return None
    if text not in _TRUE | _FALSE:
        raise ConfigError(f"{name}: expected true/false, 1/0 or yes/no, got {text!r}")
    return text in _TRUE


def client_tls(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> ssl.SSLContext | None:
    """The TLS context of a tool's connections (None: plaintext), from its
    :func:`add_tls_arguments` flags and, for what they leave unset, the same
    ``HAC_TLS_*`` variables the services read.  A bad setting is a ``ConfigError``
    naming the flag or variable."""
    from ha_controller.protocol.errors import ConfigError
    from ha_controller.rpc.tls import client_context

    env = os.environ if env is None else env
    chosen: dict[str, tuple[str | None, str]] = {}
    for flag, var in (
        ("ca", "HAC_TLS_CA_FILE"),
        ("cert", "HAC_TLS_CERT_FILE"),
        ("key", "HAC_TLS_KEY_FILE"),
    ):
        value = getattr(args, f"tls_{flag}", None)
        if value:
            chosen[flag] = (value, f"--tls-{flag}")
        else:
            chosen[flag] = (env.get(var) or None, var)
    flags_given = any(src.startswith("--") for _, src in chosen.values())
    enabled = True if flags_given else _env_bool(env, "HAC_TLS_ENABLED")
    if enabled is None:
        enabled = any(path for path, _ in chosen.values())
    if not enabled:
        return None
    (ca, ca_src), (cert, cert_src), (key, key_src) = chosen["ca"], chosen["cert"], chosen["key"]
    if (cert is None) != (key is None):
        given, missing = (cert_src, "--tls-key") if cert else (key_src, "--tls-cert")
        raise ConfigError(f"{given}: a client certificate needs both; {missing} is not set")
    for path, src in chosen.values():
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"{src}: no such file: {path!r}")
    verify = args.tls_verify_hostname
    if verify is None:
        verify = _env_bool(env, "HAC_TLS_VERIFY_HOSTNAME")
    if verify is False and ca is None:
        raise ConfigError(
            "--no-tls-verify-hostname needs --tls-ca: without a private CA any publicly "
            "signed certificate would be trusted"
        )
    try:
        return client_context(ca, cert, key, check_hostname=verify is not False)
    except OSError as exc:  # ssl.SSLError too: a file that is not PEM, a key that does not fit
        raise ConfigError(f"TLS files ({ca_src}, {cert_src}): cannot be loaded: {exc}") from exc


_CREDENTIAL_RULES = (
    "With the cluster's client ACL on, requests are signed as this user (HMAC over the "
    "whole request and a timestamp); without, they go anonymous. Prefer HAC_SECRET_KEY "
    "to --secret-key: a command line is visible to every user of the machine."
)


def add_credential_arguments(parser: argparse.ArgumentParser) -> None:
    """``--access-key`` and ``--secret-key`` (or ``HAC_ACCESS_KEY``/``HAC_SECRET_KEY``):
    the ACL user a tool's requests are signed as (:func:`client_credentials`)."""
    group = parser.add_argument_group("ACL credentials", textwrap.fill(_CREDENTIAL_RULES, 78))
    group.add_argument(
        "--access-key", metavar="KEY", help="the ACL user's access key (HAC_ACCESS_KEY)"
    )
    group.add_argument(
        "--secret-key",
        metavar="SECRET",
        help="the ACL user's secret key (HAC_SECRET_KEY; safer than this flag)",
    )


def client_credentials(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> Credentials | None:
    """The ACL user of a tool (None: anonymous), from ``--access-key``/``--secret-key``
    and, for what they leave unset, ``HAC_ACCESS_KEY``/``HAC_SECRET_KEY``.  One without
    the other is a ``ConfigError`` naming both (never the secret's value)."""
    from ha_controller.acl import Credentials
    from ha_controller.protocol.errors import ConfigError

    env = os.environ if env is None else env
    ak = getattr(args, "access_key", None) or env.get("HAC_ACCESS_KEY") or None
    sk = getattr(args, "secret_key", None) or env.get("HAC_SECRET_KEY") or None
    try:
        return Credentials.maybe(ak, sk)
    except ValueError as exc:
        raise ConfigError(
            f"--access-key/--secret-key (HAC_ACCESS_KEY/HAC_SECRET_KEY): {exc}"
        ) from None


def comma_list(text: str) -> list[str]:
    """``"h1:p1, h2:p2"`` -> ``["h1:p1", "h2:p2"]`` (blanks dropped): addresses, groups."""
    return [a.strip() for a in text.split(",") if a.strip()]


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """Left-aligned columns under a dashed header line."""
    cells = [[str(h) for h in headers], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def add_namesrv_arguments(parser: argparse.ArgumentParser) -> None:
    """``--namesrv`` with the TLS options and the ACL credentials: what every command
    that asks the cluster takes."""
    parser.add_argument(
        "--namesrv", default=DEFAULT_NAMESRV, metavar="H:P", help="nameserver(s) H:P[,H:P]"
    )
    add_tls_arguments(parser)
    add_credential_arguments(parser)


def add_tool(
    sub: Any, name: str, help_text: str, fn: Handler, **kwargs: Any
) -> argparse.ArgumentParser:
    """A command that asks the cluster (:func:`add_namesrv_arguments`), takes ``--json``
    and runs the coroutine ``fn``."""
    parser = add_parser(sub, name, help=help_text, description=help_text, **kwargs)
    add_namesrv_arguments(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run_async(fn))
    return parser


def run_async(fn: Handler) -> Callable[[argparse.Namespace], int]:
    """An argparse handler that runs the coroutine handler ``fn`` to its exit code."""

    def run(args: argparse.Namespace) -> int:
        from ha_controller.process import run as run_on_loop  # uvloop when installed

        return int(run_on_loop(fn(args)))

    return run
