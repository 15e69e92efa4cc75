"""The ``[tls]`` and ``[acl]`` tables, and ``[limits]`` (:class:`RpcLimits`) as loaded.

The nameserver, the broker and the gateway each hold one of every table; a key of a
table is ``tls.cert_file`` in messages, ``HAC_TLS_CERT_FILE`` in the environment and
``--tls-cert-file`` as a flag.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ha_controller.config import checks
from ha_controller.config.base import Problem, Validated
from ha_controller.config.schema import setting
from ha_controller.protocol.errors import ConfigError
from ha_controller.rpc.limits import RpcLimits
from ha_controller.rpc.tls import client_context, server_context

__all__ = ["TWINS", "AclConfig", "RpcLimits", "TlsConfig"]


@dataclass(frozen=True, kw_only=True)
class TlsConfig(Validated):
    """TLS for every RPC and HTTP listener and outgoing connection.

    Listeners (RPC, HA, admin HTTP, the gateway's gRPC) serve ``cert_file``;
    ``require_client_cert`` turns on mutual TLS: they verify client certificates
    against ``ca_file``.  Outgoing connections (to nameservers, brokers, the HA
    master) verify the server against ``ca_file`` (the system's CAs when unset),
    check that its certificate names the host dialled unless ``verify_hostname`` is
    false, and present ``cert_file`` as the client certificate.
    """

    enabled: bool = setting(
        False,
        doc=(
            "TLS on every listener of the process (RPC, HA, admin HTTP, the gateway's gRPC) and "
            "on its outgoing connections (nameservers, brokers, the HA master)."
        ),
    )
    cert_file: str | None = setting(
        None,
        check=checks.NOT_EMPTY,
        flag="tls_cert",
        doc="PEM certificate (chain) of this process.",
    )
    key_file: str | None = setting(
        None,
        check=checks.NOT_EMPTY,
        flag="tls_key",
        doc="PEM private key of `cert_file`.",
    )
    ca_file: str | None = setting(
        None,
        check=checks.NOT_EMPTY,
        flag="tls_ca",
        doc=(
            "PEM CA bundle to verify peers with (and, with `require_client_cert`, client "
            "certificates); unset = the system's CAs."
        ),
    )
    require_client_cert: bool = setting(
        False,
        doc="Mutual TLS: listeners demand a client certificate signed by `ca_file`.",
    )
    verify_hostname: bool = setting(
        True,
        doc=(
            "Outgoing connections check that the server's certificate names the host dialled (a "
            "DNS or IP subjectAltName matching the advertised address, `broker_ip1` or "
            "`namesrv_addrs`). Turn off for peers dialled by addresses their certificate does not "
            "list (pods by IP): the chain is still verified against `ca_file`, but any "
            "certificate that CA signed is then trusted for every peer."
        ),
    )

    def _rules(self) -> Iterator[Problem]:
        if (self.cert_file is None) != (self.key_file is None):
            given, missing = (
                ("cert_file", "key_file")
                if self.cert_file is not None
                else ("key_file", "cert_file")
            )
            yield (
                (given, missing),
                f"a certificate needs both cert_file and key_file; {missing} is not set",
            )
        if self.enabled and self.cert_file is None:
            yield (
                ("enabled", "cert_file", "key_file"),
                "TLS is enabled but cert_file and key_file are not set",
            )
        if self.require_client_cert and not (self.enabled and self.ca_file):
            yield (
                ("require_client_cert", "enabled", "ca_file"),
                "mutual TLS needs enabled = true and a ca_file to verify client certificates",
            )
        if self.enabled and not self.verify_hostname and not self.ca_file:
            yield (
                ("verify_hostname", "ca_file"),
                "verify_hostname = false needs a ca_file: without a private CA, any "
                "publicly signed certificate would be trusted for every peer",
            )
        if self.enabled:
            for key in ("cert_file", "key_file", "ca_file"):
                path = getattr(self, key)
                if path is not None and not Path(path).is_file():
                    yield (key,), f"no such file: {path!r}"

    def server_context(self) -> ssl.SSLContext | None:
        """The context every listener of a service uses; None when TLS is off."""
        if not self.enabled:
            return None
        assert self.cert_file and self.key_file  # checked by _rules
        return server_context(self.cert_file, self.key_file, self.ca_file, self.require_client_cert)

    def client_context(self) -> ssl.SSLContext | None:
        """The context of every outgoing connection of a service (nameservers,
        brokers, the HA master, the gateway's brokers); None when TLS is off.

        It presents ``cert_file`` (which must then allow client authentication for
        mutual TLS) and verifies the server as the class says."""
        if not self.enabled:
            return None
        return client_context(
            self.ca_file, self.cert_file, self.key_file, check_hostname=self.verify_hostname
        )


@dataclass(frozen=True, kw_only=True)
class AclConfig(Validated):
    """The client ACL (docs/security.md): users with an access key and a secret key and
    their permissions, read from ``file``; the same table on every nameserver, broker
    and gateway of a cluster."""

    enabled: bool = setting(
        False,
        doc="Check clients' signatures and permissions (RocketMQ aclEnable).",
    )
    allow_anonymous: bool = setting(
        True,
        doc=(
            "Serve unsigned requests as without an ACL (the demo profile); false = every client "
            "request must be signed by a user of the file."
        ),
    )
    file: str | None = setting(
        None,
        check=checks.NOT_EMPTY,
        doc=(
            "The users a node starts with: a TOML file of [[users]] tables (access_key, "
            "secret_key, admin, default_topic_perm, default_group_perm, topic_perms, "
            "group_perms), like RocketMQ's plain_acl.yml; mount it from a secret, it holds the "
            "secret keys. Users and ACLs changed at runtime (hactl user, hactl acl) replace it."
        ),
    )
    audit_allowed: bool = setting(
        False,
        doc=(
            "Write an audit line for every allowed request too (logger ha_controller.acl.audit); "
            "refusals are always written."
        ),
    )

    def _rules(self) -> Iterator[Problem]:
        if self.enabled and self.file is None:
            yield (("enabled", "file"), "the ACL is enabled but no users file is set")
        if not self.allow_anonymous and not self.enabled:
            yield (
                ("allow_anonymous", "enabled"),
                "allow_anonymous = false has no effect without enabled = true",
            )
        if self.enabled and self.file is not None:
            if not Path(self.file).is_file():
                yield ("file",), f"no such file: {self.file!r}"
                return
            from ha_controller.acl import load_acl_file  # the users file's own checks

            try:
                load_acl_file(self.file)
            except ConfigError as exc:
                yield ("file",), str(exc)


@dataclass(frozen=True, kw_only=True)
class _RpcLimitsTable(Validated, RpcLimits):
    """:class:`RpcLimits` as the loaders check it: every problem names its key's source.

    Built only by the loader, which returns a plain ``RpcLimits`` (equal to one made
    directly).  ``Validated`` comes first so that its ``__post_init__`` reports; the
    cross-field rules are RpcLimits' own.
    """

    _rules = RpcLimits._rules


#: Tables defined outside this package (so that their users need not import it) -> the
#: ``Validated`` twin that the loader builds them with.
TWINS: dict[type, type[Validated]] = {RpcLimits: _RpcLimitsTable}
