"""Throw-away TLS material for tests: a CA, server and client certificates made with openssl."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import (
    Sequence,
)
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import ssl


@dataclass(frozen=True)
class TlsFiles:
    """A throwaway CA and the certificates of a TLS test cluster (:func:`make_tls_files`).

    ``cert``/``key`` is the one certificate every service process serves and presents
    as a client (as one Kubernetes TLS Secret would be); ``client_cert``/``client_key``
    is a tool's (hactl, the SDK).  Both are signed by ``ca`` and name the test hosts
    (127.0.0.1, localhost).
    """

    ca: Path
    cert: Path
    key: Path
    client_cert: Path
    client_key: Path
    #: services demand client certificates (mutual TLS)
    mutual: bool = True

    def service_env(self) -> dict[str, str]:
        """``HAC_TLS_*`` that turn TLS on in a service process (every listener and every
        outgoing connection)."""
        return {
            "HAC_TLS_ENABLED": "true",
            "HAC_TLS_CERT_FILE": str(self.cert),
            "HAC_TLS_KEY_FILE": str(self.key),
            "HAC_TLS_CA_FILE": str(self.ca),
            "HAC_TLS_REQUIRE_CLIENT_CERT": "true" if self.mutual else "false",
        }

    def client_env(self) -> dict[str, str]:
        """``HAC_TLS_*`` for a tool (hactl) instead of its ``--tls-*`` flags."""
        return {
            "HAC_TLS_CA_FILE": str(self.ca),
            "HAC_TLS_CERT_FILE": str(self.client_cert),
            "HAC_TLS_KEY_FILE": str(self.client_key),
        }

    def hactl_args(self) -> list[str]:
        """hactl's ``--tls-ca``, ``--tls-cert`` and ``--tls-key``."""
        return [
            "--tls-ca",
            str(self.ca),
            "--tls-cert",
            str(self.client_cert),
            "--tls-key",
            str(self.client_key),
        ]

    def client_context(self) -> ssl.SSLContext:
        """What the SDK takes as ``tls=``: verify against ``ca``, present the client
        certificate."""
        from ha_controller.rpc.tls import client_context

        return client_context(str(self.ca), str(self.client_cert), str(self.client_key))


def openssl_missing() -> str | None:
    """Why :func:`make_tls_files` cannot run here, or None."""
    return None if shutil.which("openssl") else "the openssl CLI is not installed"


def make_tls_files(
    directory: Path,
    *,
    hosts: Sequence[str] = ("127.0.0.1", "localhost"),
    mutual: bool = True,
) -> TlsFiles:
    """Make a CA and two certificates it signs (``node`` for the services, ``client``
    for tools) whose subjectAltNames list ``hosts`` (IP addresses as IP entries), with
    the openssl CLI; P-256 keys, valid for two days."""
    import ipaddress

    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    openssl("req", "-x509", *ec, "-days", "2", "-keyout", "ca.key", "-out", "ca.pem",
            "-subj", "/CN=hac-test-ca")  # fmt: skip
    sans = []
    for host in hosts:
        try:
            ipaddress.ip_address(host)
            sans.append(f"IP:{host}")
        except ValueError:
            sans.append(f"DNS:{host}")
    for name in ("node", "client"):
        (directory / f"{name}.ext").write_text(f"subjectAltName={','.join(sans)}\n")
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN=hac-{name}")  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-out", f"{name}.pem",
                "-extfile", f"{name}.ext")  # fmt: skip
    return TlsFiles(
        ca=directory / "ca.pem",
        cert=directory / "node.pem",
        key=directory / "node.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        mutual=mutual,
    )
