"""One error root, typed subclasses, one code table.

Every error that crosses the wire carries a numeric ``code`` and a
``retriable`` flag.  On the wire an error travels as TubeMQ's
``RspExceptionBody{exceptionName, stackTrace}`` where ``exceptionName`` is
``"<code>:<ClassName>"`` and ``stackTrace`` is the message; ``from_wire``
turns it back into the same class.
"""

from __future__ import annotations

from typing import ClassVar


class HaError(Exception):
    """Root of every ha-controller error."""

    code: ClassVar[int] = 1
    retriable: ClassVar[bool] = False
    #: the broker group a failed client call went to last, when the client knows it
    broker_name: str | None = None

    def wire_name(self) -> str:
        return f"{self.code}:{type(self).__name__}"


# --- codec / framing -------------------------------------------------------


class ProtocolError(HaError, ValueError):
    """Bytes that are not a valid frame or envelope; the connection is closed."""

    code = 100


class BadToken(ProtocolError):
    code = 101


class FrameTooLarge(ProtocolError):
    code = 102


class BadEnvelope(ProtocolError):
    code = 103


class FrameTimeout(ProtocolError, TimeoutError):
    """A frame's bytes did not all arrive within the frame deadline (slowloris)."""

    code = 104


# --- RPC -------------------------------------------------------------------


class RpcError(HaError):
    code = 200


class UnknownMethod(RpcError, LookupError):
    code = 201


class RequestTimeout(RpcError, TimeoutError):
    code = 202
    retriable = True


class ConnectionClosed(RpcError, ConnectionError):
    """The peer went away (or we closed) while a call was pending."""

    code = 203
    retriable = True


class BrokerUnavailable(RpcError, ConnectionError):
    """No connection to the peer could be made."""

    code = 204
    retriable = True


class Overloaded(RpcError):
    """Too many requests in flight; try later or elsewhere."""

    code = 205
    retriable = True


class RemoteError(RpcError):
    """An error the peer raised that has no class here."""

    code = 206


class ServiceStopping(RpcError):
    code = 207
    retriable = True


class BadRequest(RpcError, ValueError):
    code = 208


class Unauthorized(RpcError, PermissionError):
    code = 209


class TlsError(BrokerUnavailable):
    """TLS could not be set up with the peer: a failed handshake or certificate check.

    Not retriable: another attempt with the same settings fails the same way."""

    code = 210
    retriable = False


class TlsClosedEarly(ConnectionClosed):
    """A TLS server closed the connection right after the handshake, before any answer:
    with TLS 1.3 that is all a client sees of a refused client certificate (or of a
    server that died just then, hence retriable).  Local only."""


class TlsMismatch(TlsError):
    """One side speaks TLS and the other does not; the message says which and what to
    pass.  A TLS listener answers a plaintext request with this error, in plaintext."""

    code = 211


class MessageTooLarge(BadRequest):
    """A message (or batch) larger than the limit: refused by the client before anything
    is sent, and by a broker before anything is stored.  Not retriable."""

    code = 212


class AccessDenied(Unauthorized):
    """The client ACL refused a request: no (valid) credentials, or a user without the
    permission the request needs; the message names it.  Nothing was changed."""

    code = 213


class ReceiptHandleExpired(BadRequest):
    """An ack (or change of invisible time) of a POP receipt handle whose invisible time
    is over: the message may already be on its way to a consumer again, so the ack is
    refused rather than answered as if it had taken (RocketMQ's "receipt handle is
    expired").  Nothing was changed; the message comes again."""

    code = 214


# --- what a message or a consumer may carry (ha_controller.protocol.validation) ------
# RocketMQ's proxy answers each of these with its own v2 status code; the gateway maps
# the class to it (ha_controller.proxy.convert.code_for).  Nothing was stored or changed.


class IllegalTopic(BadRequest):
    """A topic name a client may not use (RocketMQ's ILLEGAL_TOPIC)."""

    code = 215


class IllegalConsumerGroup(BadRequest):
    """A consumer group name a client may not use: malformed, or one of the groups
    RocketMQ reserves for itself (ILLEGAL_CONSUMER_GROUP)."""

    code = 216


class IllegalMessageTag(BadRequest):
    """A tag that is empty or blank, contains ``|`` or a control character
    (ILLEGAL_MESSAGE_TAG)."""

    code = 217


class IllegalMessageKey(BadRequest):
    """A message key that is blank or contains a control character (ILLEGAL_MESSAGE_KEY)."""

    code = 218


class IllegalMessageGroup(BadRequest):
    """A FIFO message group that is blank, too long or contains a control character
    (ILLEGAL_MESSAGE_GROUP)."""

    code = 219


class IllegalPropertyKey(BadRequest):
    """A user property named like a system property, or a user property (key or value)
    with a control character (ILLEGAL_MESSAGE_PROPERTY_KEY)."""

    code = 220


class PropertiesTooLarge(BadRequest):
    """More user properties than allowed, or user properties, tag and keys over their
    size limit together (MESSAGE_PROPERTIES_TOO_LARGE)."""

    code = 221


class MessageBodyEmpty(BadRequest):
    """A message without a body (MESSAGE_BODY_EMPTY)."""

    code = 222


class IllegalDeliveryTime(BadRequest):
    """A delivery time further ahead than the delay limit (ILLEGAL_DELIVERY_TIME)."""

    code = 223


class IllegalInvisibleTime(BadRequest):
    """An invisible time outside the allowed range (ILLEGAL_INVISIBLE_TIME)."""

    code = 224


class IllegalFilterExpression(BadRequest):
    """A subscription filter that cannot be served: an SQL92 expression that does not
    parse, or a filter of an unknown type (RocketMQ's broker: SUBSCRIPTION_PARSE_FAILED,
    23; its gRPC proxy: ILLEGAL_FILTER_EXPRESSION)."""

    code = 225


class FilterSyntaxError(IllegalFilterExpression):
    """An SQL92 filter expression that does not parse; nothing was subscribed
    (RocketMQ's broker answers SUBSCRIPTION_PARSE_FAILED, its gRPC proxy
    ILLEGAL_FILTER_EXPRESSION).  Defined here, with every other wire error, so that a
    process that never imported the parser still knows the code it answers with."""

    code = 228


class MessageTypeConflict(BadRequest):
    """A message whose type the topic does not take, e.g. a FIFO message to a NORMAL
    topic (RocketMQ's MESSAGE_PROPERTY_CONFLICT_WITH_TYPE)."""

    code = 226


class IllegalMessageId(BadRequest):
    """A v2 message without a message id (ILLEGAL_MESSAGE_ID)."""

    code = 227


class IllegalLiteTopic(BadRequest):
    """A lite topic name that is blank, longer than the gateway takes, or has characters
    outside ``[a-zA-Z0-9_-]`` (RocketMQ's ILLEGAL_LITE_TOPIC)."""

    code = 229


class LiteSubscriptionQuotaExceeded(BadRequest):
    """A lite subscription beyond a bound: the client's lite subscription quota or the
    gateway's total (RocketMQ's LITE_SUBSCRIPTION_QUOTA_EXCEEDED); nothing of the
    request was applied."""

    code = 230


# --- cluster semantics -----------------------------------------------------


class NotMaster(HaError):
    """A slave was asked for a master-only write (TubeMQ's StandbyException idea)."""

    code = 300
    retriable = True


class TopicNotFound(HaError, LookupError):
    code = 301


class InSyncReplicasNotEnough(HaError):
    code = 302
    retriable = True


class BrokerIsolated(HaError):
    """The broker is in pre-online and serves no client request yet."""

    code = 303
    retriable = True


class SlaveAckTimeout(HaError):
    """Stored on the master but not confirmed by enough slaves in time (RocketMQ's
    FLUSH_SLAVE_TIMEOUT). Not retriable: the message is stored and will be delivered,
    so a retry elsewhere would duplicate it; the outcome is "unknown" to the caller."""

    code = 306


class SignatureInvalid(Unauthorized):
    """A control-plane request between cluster members (or an HA handshake) is
    unsigned, wrongly signed, or its timestamp is outside the replay window, while the
    cluster has a secret.  Nothing was changed."""

    code = 304


class ReplayedRequest(SignatureInvalid):
    """A correctly signed request whose nonce was already seen within the replay
    window: a copy of an earlier request.  Nothing was changed."""

    code = 310


class RegistrationConflict(Unauthorized):
    """Open mode (no cluster secret): a registration change for a broker address, or
    for a broker id, that a live broker holds through another connection.  Refused
    until that broker unregisters, its connection closes or its registration
    expires."""

    code = 311


class AddressMismatch(Unauthorized):
    """Open mode (no cluster secret): a broker registered an address whose host is
    not the host its connection comes from (``open_mode_check_peer_host``)."""

    code = 312


class NotRegistered(HaError):
    """A heartbeat from a broker the nameserver does not list (it was expired)."""

    code = 307


class PreOnlineRequired(HaError):
    """A master may not take id 0 back from an acting slave before its pre-online."""

    code = 308
    retriable = True


class StaleRegistration(HaError):
    code = 305


class NotWritable(HaError):
    """The broker takes no writes right now (its store is full or turned read-only)
    and stored nothing of this request: send to another group.  It still serves reads,
    and it takes writes again by itself once space returns."""

    code = 309
    retriable = True


class StoreError(HaError, OSError):
    code = 400


class StoreFull(StoreError):
    code = 401


class StoreReadOnly(StoreError):
    code = 402


class CorruptRecord(StoreError):
    code = 403


class OffsetOutOfRange(HaError, IndexError):
    code = 404


class RecordUnderRepair(HaError):
    """A record the broker found damaged in its own commit log (CRC, length, a short
    read): it is served by no one until it was copied back from a replica.  Retriable:
    readers wait at that offset, never skip it."""

    code = 405
    retriable = True


class LockNotHeld(HaError):
    code = 500


class QuorumNotReached(HaError):
    code = 501
    retriable = True


class EscapeFailed(HaError):
    code = 600
    retriable = True


class NotRecallable(HaError, LookupError):
    """A recall of a message that is not (or no longer) waiting for its delivery
    time on this group: unknown, already delivered, or due now."""

    code = 601


class EscapesUnresolved(HaError):
    """An acting slave still hands special work on, or does not know yet whether an
    escape arrived; its returning master asks again before taking its tables."""

    code = 602
    retriable = True


class ConfigError(HaError, ValueError):
    """A bad configuration value; the message names the key."""

    code = 700


# --- controller mode (an etcd-backed master switch) -----------------------------


class EtcdUnavailable(HaError, ConnectionError):
    """No etcd endpoint answered, or etcd refused the request."""

    code = 800
    retriable = True


class StaleEpoch(HaError):
    """A request from (or for) a master of an epoch that is not the group's current
    one: a master that was replaced must not acknowledge anything more."""

    code = 801
    retriable = True


def _all_subclasses(cls: type[HaError]) -> list[type[HaError]]:
    out: list[type[HaError]] = []
    for sub in cls.__subclasses__():
        out.append(sub)
        out.extend(_all_subclasses(sub))
    return out


def error_table() -> dict[int, type[HaError]]:
    """code -> class, for every error class (built lazily so late subclasses count)."""
    table: dict[int, type[HaError]] = {HaError.code: HaError}
    for sub in _all_subclasses(HaError):
        if "code" not in vars(sub):
            continue  # a local-only subclass that travels as its parent's code
        other = table.get(sub.code)
        if other is not None and other is not sub:
            raise RuntimeError(f"error code {sub.code} used by {other.__name__} and {sub.__name__}")
        table[sub.code] = sub
    return table


def from_wire(exception_name: str, message: str) -> HaError:
    """Rebuild a typed error from ``RspExceptionBody`` fields."""
    code_text, _, name = exception_name.partition(":")
    try:
        code = int(code_text)
    except ValueError:
        return RemoteError(f"{exception_name}: {message}")
    cls = error_table().get(code)
    if cls is None or cls.__name__ != name:
        return RemoteError(f"{exception_name}: {message}")
    return cls(message)
