"""SSL contexts for RPC and HTTP listeners and clients (mutual TLS optional), and the
one-line explanations of a TLS mismatch between a client and a server.

One ``[tls]`` table configures a service's listeners (``server_context``) and its
outgoing connections (``client_context``): a client verifies the server's
certificate against ``ca_file`` (the system's CAs when unset) and, unless told not
to, checks that the certificate names the host it dialled (``check_hostname``: a
DNS name against the DNS subjectAltNames, an IP address against the IP ones).

When one side speaks TLS and the other does not, neither TLS nor our framing can say
so by itself: a TLS listener that reads a plaintext frame just fails the handshake
and closes; a plaintext listener that reads a ClientHello sees a bad token.  So:

* an ``RpcServer`` with TLS peeks at the first bytes of every connection: a TLS
  handshake record (``0x16 0x03``) goes on to the handshake; a frame (the token
  ``0xFF7FF4FE``) is answered, in plaintext, with a ``TlsMismatch`` error response
  for that frame's serial number (:func:`plaintext_to_tls_hint`), then closed;
* a plaintext listener that reads a TLS record header answers with one line of text
  (:data:`NOT_TLS_REPLY`), which the TLS client's handshake reports as
  ``WRONG_VERSION_NUMBER``; :func:`handshake_error` turns that into
  ``TlsMismatch`` (:func:`tls_to_plaintext_hint`);
* a plaintext client that reads a TLS record header (an alert from some other TLS
  server) fails its calls with ``TlsMismatch`` too (:func:`looks_like_tls`).
"""

from __future__ import annotations

import ssl

from ha_controller.protocol.errors import BrokerUnavailable, TlsError, TlsMismatch

__all__ = [
    "NOT_TLS_REPLY",
    "client_context",
    "handshake_error",
    "looks_like_tls",
    "plaintext_to_tls_hint",
    "server_context",
    "session_error",
    "tls_to_plaintext_hint",
]

#: TLS record content types: change_cipher_spec, alert, handshake, application_data
_TLS_RECORD_TYPES = frozenset({0x14, 0x15, 0x16, 0x17})
#: the content type of a ClientHello's record
TLS_HANDSHAKE = 0x16
#: what a plaintext RPC listener writes to a peer that opened with a TLS handshake
NOT_TLS_REPLY = b"HAC-RPC plaintext listener: this port does not speak TLS\r\n"
#: handshake failures that mean "the server answered, and not with TLS"
_NOT_TLS_REASONS = frozenset({"WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "HTTP_REQUEST"})


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
    """A client context: verify the server against ``ca_file`` (the system's CAs when
    None), check its name unless ``check_hostname`` is false, present ``cert_file``
    (mutual TLS) when given.

    Not checking the name still verifies the chain; it is meant for peers dialled by
    an address their certificate does not list (pods by IP) with a private CA, where
    any certificate the CA signed is trusted for any peer.  Without ``ca_file`` that
    would trust any publicly signed certificate, so it is refused."""
    if not check_hostname and not ca_file:
        raise ValueError("check_hostname=False needs a ca_file (a private CA to trust)")
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = check_hostname
    if cert_file and key_file:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def looks_like_tls(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` starts like a TLS record (content type, then major version 3)."""
    return len(data) >= 2 and data[0] in _TLS_RECORD_TYPES and data[1] == 0x03


def plaintext_to_tls_hint(addr: str) -> str:
    """What a plaintext client of the TLS listener at ``addr`` is told."""
    return (
        f"the server at {addr} speaks TLS and this client connected in plaintext: pass "
        "--tls-ca FILE (with mutual TLS also --tls-cert/--tls-key), or set "
        "HAC_TLS_ENABLED=true and HAC_TLS_CA_FILE (SDK: tls=client_context(...))"
    )


def tls_to_plaintext_hint(addr: str) -> str:
    """What a TLS client of the plaintext listener at ``addr`` is told."""
    return (
        f"the server at {addr} does not speak TLS and this client connected with TLS: "
        "turn TLS on there ([tls] enabled = true) or drop --tls-*/HAC_TLS_* here"
    )


def handshake_error(addr: str, exc: BaseException) -> BrokerUnavailable:
    """The typed error for a connect to ``addr`` with TLS that failed with ``exc``:
    ``TlsMismatch`` when the server does not speak TLS, ``TlsError`` for any other TLS
    failure (with a hint when the certificate does not name ``addr``'s host), else
    ``BrokerUnavailable``."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        why = exc.verify_message or str(exc)
        hint = ""
        if "mismatch" in why.lower():
            hint = (
                "; the certificate must name the host as dialled (a subjectAltName "
                "DNS or IP entry), or turn name checks off: tls.verify_hostname = false "
                "(--no-tls-verify-hostname)"
            )
        elif "unable to get local issuer" in why.lower() or "self-signed" in why.lower():
            hint = "; is tls.ca_file (--tls-ca) the CA that signed the server's certificate?"
        return TlsError(f"TLS with {addr}: server certificate rejected: {why}{hint}")
    if isinstance(exc, ssl.SSLError):
        if exc.reason in _NOT_TLS_REASONS:
            return TlsMismatch(tls_to_plaintext_hint(addr))
        return TlsError(f"TLS handshake with {addr} failed: {exc.reason or exc}")
    return BrokerUnavailable(f"cannot connect to {addr}: {exc}")


#: alerts a server sends after the handshake when it refuses the client's certificate
_CLIENT_CERT_ALERTS = {
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "the server requires a client certificate: pass "
    "--tls-cert/--tls-key (HAC_TLS_CERT_FILE/HAC_TLS_KEY_FILE)",
    "TLSV1_ALERT_UNKNOWN_CA": "the server does not trust the CA of this client's certificate",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the server rejected this client's certificate",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "the server rejected this client's certificate as expired",
}


def session_error(addr: str, exc: ssl.SSLError) -> TlsError:
    """The typed error for a TLS failure after the handshake (with TLS 1.3 a server
    refuses a client certificate only then): ``TlsError`` naming what to change."""
    why = _CLIENT_CERT_ALERTS.get(exc.reason or "")
    text = f"TLS with {addr} failed: {why}" if why else f"TLS with {addr} failed: {exc}"
    err = TlsError(text)
    err.__cause__ = exc
    return err
