"""The RPC envelope inside a frame: varint-delimited protobuf messages.

request:  RpcConnHeader{flag}, RequestHeader{serviceType, protocolVer},
          RequestBody{method, timeout, request, authInfo?}
response: RpcConnHeader{flag=1}, ResponseHeader{status},
          RspResponseBody{method, data} | RspExceptionBody{exceptionName, stackTrace}

Sans-IO; every malformed input raises ``BadEnvelope``.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf.message import DecodeError, Message

from ha_controller.proto import rpc_pb2
from ha_controller.protocol.errors import BadEnvelope, HaError, from_wire
from ha_controller.protocol.framing import DEFAULT_MAX_BLOCK_BYTES, encode_frame

FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2
SERVICE_TYPE = 1
PROTOCOL_VERSION = 3

STATUS_SUCCESS = rpc_pb2.ResponseHeader.SUCCESS
STATUS_ERROR = rpc_pb2.ResponseHeader.ERROR
STATUS_FATAL = rpc_pb2.ResponseHeader.FATAL


@dataclass(frozen=True, slots=True)
class RequestAuth:
    """``RequestBody.authInfo``: a cluster member's signature of one request (made and
    checked by :mod:`ha_controller.auth`), or with ``access_key`` a client's, signed as
    that ACL user (:mod:`ha_controller.acl`); the codec only carries it."""

    timestamp_ms: int
    nonce: bytes
    signature: bytes
    access_key: str = ""
    #: a gateway's request for a client: the user it verified and the client's address
    #: (signed with the cluster key over these too; ``ha_controller.auth``)
    on_behalf_of: str = ""
    source_ip: str = ""


@dataclass(frozen=True, slots=True)
class Request:
    serial_no: int
    method: int
    body: bytes
    timeout_ms: int
    oneway: bool
    auth: RequestAuth | None = None


@dataclass(frozen=True, slots=True)
class Response:
    serial_no: int
    status: int
    method: int
    data: bytes
    exception_name: str = ""
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.status == STATUS_SUCCESS

    def error(self) -> HaError:
        """The typed error this response carries (only for a non-success status)."""
        return from_wire(self.exception_name, self.message)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def _delimited(*messages: Message) -> bytes:
    parts: list[bytes] = []
    for msg in messages:
        data = msg.SerializeToString()
        parts.append(_varint(len(data)))
        parts.append(data)
    return b"".join(parts)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise BadEnvelope("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 64:
            raise BadEnvelope("varint too long")


def _read_messages(payload: bytes, count: int) -> list[bytes]:
    out: list[bytes] = []
    pos = 0
    for _ in range(count):
        length, pos = _read_varint(payload, pos)
        end = pos + length
        if end > len(payload):
            raise BadEnvelope("delimited message runs past the end of the frame")
        out.append(payload[pos:end])
        pos = end
    if pos != len(payload):
        raise BadEnvelope(f"{len(payload) - pos} trailing bytes after the envelope")
    return out


def _parse(cls: type[Message], data: bytes) -> Message:
    msg = cls()
    try:
        msg.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise BadEnvelope(f"undecodable {cls.__name__}: {exc}") from exc
    if not msg.IsInitialized():
        raise BadEnvelope(f"{cls.__name__} lacks required fields")
    return msg


def encode_request(
    serial_no: int,
    method: int,
    body: bytes,
    *,
    timeout_ms: int = 0,
    oneway: bool = False,
    max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES,
    auth: RequestAuth | None = None,
) -> bytes:
    conn = rpc_pb2.RpcConnHeader(flag=FLAG_ONEWAY if oneway else 0)
    header = rpc_pb2.RequestHeader(serviceType=SERVICE_TYPE, protocolVer=PROTOCOL_VERSION)
    req = rpc_pb2.RequestBody(method=method, timeout=timeout_ms, request=body)
    if auth is not None:
        req.authInfo.timestamp = auth.timestamp_ms
        req.authInfo.nonce = auth.nonce
        req.authInfo.signature = auth.signature
        if auth.access_key:
            req.authInfo.accessKey = auth.access_key
        if auth.on_behalf_of:
            req.authInfo.onBehalfOf = auth.on_behalf_of
            req.authInfo.sourceIp = auth.source_ip
    return encode_frame(serial_no, _delimited(conn, header, req), max_block_bytes)


def encode_response(
    serial_no: int, method: int, data: bytes, max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES
) -> bytes:
    conn = rpc_pb2.RpcConnHeader(flag=FLAG_RESPONSE)
    header = rpc_pb2.ResponseHeader(status=STATUS_SUCCESS, protocolVer=PROTOCOL_VERSION)
    body = rpc_pb2.RspResponseBody(method=method, data=data)
    return encode_frame(serial_no, _delimited(conn, header, body), max_block_bytes)


def encode_error(
    serial_no: int,
    exc: HaError,
    *,
    status: int = STATUS_ERROR,
    max_block_bytes: int = DEFAULT_MAX_BLOCK_BYTES,
) -> bytes:
    conn = rpc_pb2.RpcConnHeader(flag=FLAG_RESPONSE)
    header = rpc_pb2.ResponseHeader(status=status, protocolVer=PROTOCOL_VERSION)  # type: ignore[arg-type]
    body = rpc_pb2.RspExceptionBody(exceptionName=exc.wire_name(), stackTrace=str(exc))
    return encode_frame(serial_no, _delimited(conn, header, body), max_block_bytes)


def decode(serial_no: int, payload: bytes) -> Request | Response:
    """Decode one frame's payload into a Request or a Response."""
    parts = _read_messages(payload, 3)
    conn = _parse(rpc_pb2.RpcConnHeader, parts[0])
    assert isinstance(conn, rpc_pb2.RpcConnHeader)
    if conn.flag & FLAG_RESPONSE:
        header = _parse(rpc_pb2.ResponseHeader, parts[1])
        assert isinstance(header, rpc_pb2.ResponseHeader)
        if header.status == STATUS_SUCCESS:
            body = _parse(rpc_pb2.RspResponseBody, parts[2])
            assert isinstance(body, rpc_pb2.RspResponseBody)
            return Response(serial_no, header.status, body.method, body.data)
        exc = _parse(rpc_pb2.RspExceptionBody, parts[2])
        assert isinstance(exc, rpc_pb2.RspExceptionBody)
        return Response(serial_no, header.status, 0, b"", exc.exceptionName, exc.stackTrace)
    _parse(rpc_pb2.RequestHeader, parts[1])
    req = _parse(rpc_pb2.RequestBody, parts[2])
    assert isinstance(req, rpc_pb2.RequestBody)
    auth = None
    if req.HasField("authInfo"):
        info = req.authInfo
        auth = RequestAuth(
            info.timestamp,
            info.nonce,
            info.signature,
            info.accessKey,
            info.onBehalfOf,
            info.sourceIp,
        )
    return Request(
        serial_no,
        req.method,
        req.request,
        max(0, req.timeout),
        bool(conn.flag & FLAG_ONEWAY),
        auth,
    )
