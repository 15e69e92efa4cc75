"""SSL contexts for RPC and HTTP listeners and clients (mutual TLS optional)."""

from __future__ import annotations

import ssl


def server_context(
    cert_file: str, key_file: str, ca_file: str | None = None, require_client_cert: bool = False
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    if ca_file:
        ctx.load_verify_locations(ca_file)
    if require_client_cert:
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def client_context(
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    check_hostname: bool = True,
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = check_hostname
    if cert_file and key_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx
