"""Cluster authentication without sockets: the signed envelope, the guard's decisions
(unsigned, bad, stale, replayed), the bounded nonce memory, the HA handshake's
signatures, and the nameserver's open-mode rules (``RouteTable.registration_conflict``,
``host_matches_peer``)."""

from __future__ import annotations

import pytest
from fakes import FakeClock

from ha_controller.auth import (
    MAX_SKEW_MS,
    ClusterAuth,
    ReplayCache,
    request_mac,
    requires_signature,
)
from ha_controller.proto import broker_pb2, nameserver_pb2
from ha_controller.protocol import envelope
from ha_controller.protocol.codes import RequestCode
from ha_controller.protocol.errors import (
    Overloaded,
    ReplayedRequest,
    SignatureInvalid,
)
from ha_controller.protocol.framing import FrameDecoder
from ha_controller.rpc import RequestContext, RpcConnection
from nameserver.route_table import BrokerRegistration, RouteTable
from nameserver.service import host_matches_peer

SECRET = "s3cret"
NOW = 1_800_000_000_000
HEARTBEAT = RequestCode.BROKER_HEARTBEAT


class Refusals:
    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def __call__(self, reason: str, method: int) -> None:
        self.seen.append((reason, method))

    @property
    def reasons(self) -> list[str]:
        return [r for r, _ in self.seen]


def heartbeat_body(addr: str = "127.0.0.1:10911") -> bytes:
    return nameserver_pb2.BrokerHeartbeatRequest(
        cluster="c", broker_addr=addr, broker_name="g"
    ).SerializeToString()


def ctx(method: int, auth: envelope.RequestAuth | None) -> RequestContext:
    return RequestContext(RpcConnection(), method, 0.0, 0, auth)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(NOW)


@pytest.fixture
def refusals() -> Refusals:
    return Refusals()


@pytest.fixture
def server(clock: FakeClock, refusals: Refusals) -> ClusterAuth:
    return ClusterAuth(SECRET, clock_ms=clock, on_refused=refusals)


# ---- the envelope carries the signature -------------------------------------------------


def test_signed_request_round_trips_through_the_codec_at_every_split() -> None:
    auth = envelope.RequestAuth(NOW, b"n" * 16, b"s" * 32)
    frame = envelope.encode_request(7, HEARTBEAT, b"body", timeout_ms=100, auth=auth)
    for split in range(len(frame) + 1):
        decoder = FrameDecoder()
        frames = decoder.feed(frame[:split]) + decoder.feed(frame[split:])
        (one,) = frames
        req = envelope.decode(one.serial_no, one.payload)
        assert isinstance(req, envelope.Request)
        assert (req.method, req.body, req.auth) == (HEARTBEAT, b"body", auth)


def test_unsigned_request_has_no_auth() -> None:
    frame = envelope.encode_request(1, HEARTBEAT, b"x")
    (one,) = FrameDecoder().feed(frame)
    req = envelope.decode(one.serial_no, one.payload)
    assert isinstance(req, envelope.Request) and req.auth is None


# ---- signing and the guard ------------------------------------------------------------------


def test_a_member_signs_control_requests_and_its_escape_sends_only(clock: FakeClock) -> None:
    member = ClusterAuth(SECRET, clock_ms=clock)
    assert member.sign(HEARTBEAT, b"x") is not None
    # a broker sends SEND_MESSAGE only to escape: signed, so its escape id counts
    assert member.sign(RequestCode.SEND_MESSAGE, b"x") is not None
    assert member.sign(RequestCode.PULL_MESSAGE, b"x") is None
    assert ClusterAuth(None).sign(HEARTBEAT, b"x") is None


def test_a_good_signature_is_accepted_once(server: ClusterAuth, refusals: Refusals) -> None:
    body = heartbeat_body()
    auth = ClusterAuth(SECRET, clock_ms=FakeClock(NOW - 1000)).sign(HEARTBEAT, body)
    first = ctx(HEARTBEAT, auth)
    server.check(first, body)
    assert first.authenticated
    with pytest.raises(ReplayedRequest):
        server.check(ctx(HEARTBEAT, auth), body)
    assert refusals.reasons == ["replayed"]


@pytest.mark.parametrize(
    ("method", "body", "refused"),
    [
        (HEARTBEAT, heartbeat_body(), True),
        (RequestCode.REGISTER_BROKER, b"", True),
        (RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE, b"", True),
        (RequestCode.EXCHANGE_BROKER_HA_INFO, b"", True),
        (RequestCode.GET_ALL_CONSUMER_OFFSET, b"", True),
        (RequestCode.GET_COMMITLOG_RANGE, b"", True),
        # asked by clients and hactl too: unsigned = a client's read
        (RequestCode.GET_BROKER_MEMBER_GROUP, b"", False),
        (RequestCode.GET_ALL_TOPIC_CONFIG, b"", False),
        (RequestCode.SEND_MESSAGE, b"", False),
        # a peer's lock vote needs a signature, a client's lock does not
        (
            RequestCode.LOCK_BATCH_MQ,
            broker_pb2.LockBatchRequest(only_this_broker=True).SerializeToString(),
            True,
        ),
        (RequestCode.LOCK_BATCH_MQ, broker_pb2.LockBatchRequest().SerializeToString(), False),
        (
            RequestCode.UNLOCK_BATCH_MQ,
            broker_pb2.LockBatchRequest(only_this_broker=True).SerializeToString(),
            True,
        ),
    ],
)
def test_unsigned_requests(
    server: ClusterAuth, refusals: Refusals, method: int, body: bytes, refused: bool
) -> None:
    assert requires_signature(method, body) is refused
    request = ctx(method, None)
    if refused:
        with pytest.raises(SignatureInvalid):
            server.check(request, body)
        assert refusals.seen == [("unsigned", method)]
    else:
        server.check(request, body)
        assert not request.authenticated and not refusals.seen


def test_wrong_secret_and_tampered_body_are_refused(
    server: ClusterAuth, refusals: Refusals, clock: FakeClock
) -> None:
    body = heartbeat_body()
    wrong = ClusterAuth("other", clock_ms=clock).sign(HEARTBEAT, body)
    with pytest.raises(SignatureInvalid) as info:
        server.check(ctx(HEARTBEAT, wrong), body)
    assert not isinstance(info.value, ReplayedRequest)
    good = ClusterAuth(SECRET, clock_ms=clock).sign(HEARTBEAT, body)
    # the signature covers the whole body (the address here) and the method
    with pytest.raises(SignatureInvalid):
        server.check(ctx(HEARTBEAT, good), heartbeat_body("127.0.0.1:1"))
    with pytest.raises(SignatureInvalid):
        server.check(ctx(RequestCode.UNREGISTER_BROKER, good), body)
    assert refusals.reasons == ["bad_signature"] * 3


@pytest.mark.parametrize("off_ms", [MAX_SKEW_MS + 1, -(MAX_SKEW_MS + 1), 600_000])
def test_a_timestamp_outside_the_window_is_refused(
    server: ClusterAuth, refusals: Refusals, off_ms: int
) -> None:
    body = heartbeat_body()
    auth = ClusterAuth(SECRET, clock_ms=FakeClock(NOW - off_ms)).sign(HEARTBEAT, body)
    with pytest.raises(SignatureInvalid, match="clock"):
        server.check(ctx(HEARTBEAT, auth), body)
    assert refusals.reasons == ["stale"]


def test_a_nonce_is_remembered_for_the_whole_window(server: ClusterAuth, clock: FakeClock) -> None:
    body = heartbeat_body()
    auth = ClusterAuth(SECRET, clock_ms=FakeClock(NOW)).sign(HEARTBEAT, body)
    server.check(ctx(HEARTBEAT, auth), body)
    clock.now = NOW + MAX_SKEW_MS  # still inside: still a replay
    with pytest.raises(ReplayedRequest):
        server.check(ctx(HEARTBEAT, auth), body)
    clock.now = NOW + MAX_SKEW_MS + 1  # outside: stale, and the nonce may go
    with pytest.raises(SignatureInvalid, match="clock"):
        server.check(ctx(HEARTBEAT, auth), body)
    fresh = ClusterAuth(SECRET, clock_ms=clock).sign(HEARTBEAT, body)
    server.check(ctx(HEARTBEAT, fresh), body)
    assert len(server.nonces) == 1


def test_open_mode_checks_nothing() -> None:
    open_mode = ClusterAuth(None)
    request = ctx(HEARTBEAT, None)
    open_mode.check(request, heartbeat_body())
    forged = envelope.RequestAuth(NOW, b"n", b"garbage")
    open_mode.check(ctx(HEARTBEAT, forged), heartbeat_body())
    assert not open_mode.enabled and not request.authenticated


def test_request_mac_depends_on_every_field() -> None:
    key = b"k" * 32
    base = request_mac(key, 1, 2, b"n", b"b")
    assert base != request_mac(key, 2, 2, b"n", b"b")
    assert base != request_mac(key, 1, 3, b"n", b"b")
    assert base != request_mac(key, 1, 2, b"m", b"b")
    assert base != request_mac(key, 1, 2, b"n", b"c")
    # the nonce's length is covered: moving a byte from nonce to body changes it
    assert base != request_mac(key, 1, 2, b"", b"nb")


# ---- the nonce memory is bounded ------------------------------------------------------------


def test_replay_cache_forgets_expired_nonces_and_refuses_when_full() -> None:
    cache = ReplayCache(capacity=2)
    assert cache.add(b"a", 100, 0)
    assert cache.add(b"b", 200, 0)
    assert not cache.add(b"a", 100, 50)
    with pytest.raises(Overloaded):
        cache.add(b"c", 300, 50)  # both still inside their window: nothing forgotten early
    assert cache.add(b"c", 300, 101)  # "a" expired
    assert len(cache) == 2


def test_a_full_cache_refuses_signed_requests(clock: FakeClock, refusals: Refusals) -> None:
    server = ClusterAuth(SECRET, clock_ms=clock, on_refused=refusals, max_nonces=1)
    member = ClusterAuth(SECRET, clock_ms=clock)
    body = heartbeat_body()
    server.check(ctx(HEARTBEAT, member.sign(HEARTBEAT, body)), body)
    with pytest.raises(Overloaded):
        server.check(ctx(HEARTBEAT, member.sign(HEARTBEAT, body)), body)
    assert refusals.reasons == ["replay_cache_full"]


# ---- the HA handshake -----------------------------------------------------------------------


def test_ha_handshake_signatures() -> None:
    master = ClusterAuth(SECRET)
    slave = ClusterAuth(SECRET)
    stranger = ClusterAuth("guess")
    challenge, nonce = master.ha_challenge(), slave.ha_nonce()
    assert challenge != master.ha_challenge()
    proof = master.ha_master_proof(nonce, challenge, "g1")
    assert slave.ha_proof_ok(proof, nonce, challenge, "g1")
    assert not slave.ha_proof_ok(proof, slave.ha_nonce(), challenge, "g1")
    assert not slave.ha_proof_ok(
        stranger.ha_master_proof(nonce, challenge, "g1"), nonce, challenge, "g1"
    )
    answer = slave.ha_slave_signature(challenge, "g1", 1, "10.0.0.2:10911")
    assert master.ha_signature_ok(answer, challenge, "g1", 1, "10.0.0.2:10911")
    for fields in [
        (master.ha_challenge(), "g1", 1, "10.0.0.2:10911"),
        (challenge, "g2", 1, "10.0.0.2:10911"),
        (challenge, "g1", 2, "10.0.0.2:10911"),
        (challenge, "g1", 1, "10.0.0.3:10911"),
    ]:
        assert not master.ha_signature_ok(answer, *fields)
    # a request signature is never an HA answer (keys are derived per use)
    assert answer != request_mac(b"", 0, 0, b"", b"")


# ---- open mode at the nameserver ------------------------------------------------------------


def reg(addr: str, broker_id: int, name: str = "g") -> BrokerRegistration:
    return BrokerRegistration("c", addr, name, broker_id, enable_acting_master=True)


def test_a_live_registration_belongs_to_its_connection() -> None:
    table = RouteTable()
    table.register_broker(reg("10.0.0.1:1", 0), conn_id="conn-a")
    table.register_broker(reg("10.0.0.2:1", 1), conn_id="conn-b")
    conflict = table.registration_conflict
    # the owner may do anything; another connection may not touch the address
    assert conflict("c", "10.0.0.1:1", "conn-a", broker_name="g", broker_id=0) is None
    assert conflict("c", "10.0.0.1:1", "conn-x") is not None
    assert conflict("c", "10.0.0.1:1", "conn-x", broker_name="g", broker_id=0) is not None
    # nor take an id a live broker holds through another connection
    assert "held by 10.0.0.1:1" in (
        conflict("c", "10.0.0.9:1", "conn-x", broker_name="g", broker_id=0) or ""
    )
    # a free id, an unknown address: fine
    assert conflict("c", "10.0.0.9:1", "conn-x", broker_name="g", broker_id=2) is None
    assert conflict("c", "10.0.0.9:1", "conn-x") is None
    # once the holder is gone (here: its connection closed), the id is free again
    table.on_connection_closed("conn-a")
    assert conflict("c", "10.0.0.9:1", "conn-x", broker_name="g", broker_id=0) is None
    assert conflict("c", "10.0.0.1:1", "conn-x") is None


def test_brokers_registered_without_a_connection_bind_nothing() -> None:
    table = RouteTable()
    table.register_broker(reg("10.0.0.1:1", 0))
    assert table.registration_conflict("c", "10.0.0.1:1", "conn-x") is None


@pytest.mark.parametrize(
    ("host", "peer", "ok"),
    [
        ("10.1.2.3", "10.1.2.3", True),
        ("10.1.2.3", "::ffff:10.1.2.3", True),
        ("10.1.2.4", "10.1.2.3", False),
        ("127.0.0.1", "127.0.0.1", True),
        # a process on this machine may advertise any address of this machine
        ("127.0.0.2", "127.0.0.1", True),
        ("localhost", "127.0.0.1", True),
        ("10.255.255.254", "127.0.0.1", False),
        ("no-such-host.invalid", "10.1.2.3", False),
    ],
)
async def test_host_matches_peer(host: str, peer: str, ok: bool) -> None:
    assert await host_matches_peer(host, peer) is ok


def test_every_table_a_broker_pulls_from_a_peer_is_signed() -> None:
    """A new versioned table (pre-online and forward sync pull it with ``fetch_table``,
    or a ``TableSync`` naming its code) must not travel unsigned: its request code
    belongs in SIGNED_CODES, and in REQUIRED_CODES unless clients ask it too."""
    import re
    from pathlib import Path

    from ha_controller.auth import REQUIRED_CODES, SIGNED_CODES
    from ha_controller.protocol.codes import RequestCode

    root = Path(__file__).resolve().parents[2] / "broker_agent"
    pulled = set()
    for path in root.rglob("*.py"):
        text = path.read_text()
        pulls = r"(?:fetch_table\(\s*\w+,\s*\w+,|TableSync\(\s*\"[^\"]*\",)\s*RequestCode\.(\w+)"
        for m in re.finditer(pulls, text):
            pulled.add(RequestCode[m.group(1)])
    assert len(pulled) >= 6, pulled  # the regex still finds the pulls
    assert pulled <= SIGNED_CODES, sorted(c.name for c in pulled - SIGNED_CODES)
    client_readable = {RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG}
    missing = pulled - REQUIRED_CODES - client_readable
    assert not missing, sorted(c.name for c in missing)
