"""A simulated broker that speaks the nameserver protocol (register,
heartbeat, QUERY_DATA_VERSION, min-id notifications) without a store.

With a ``secret`` its requests are signed as a real broker's are
(:class:`ha_controller.auth.ClusterAuth`); ``register(secret=...)`` signs one
registration with another secret ("" = unsigned).

Used by nameserver tests and by ``bench/nameserver.py`` to stand in for
many brokers; real brokers live in ``broker_agent``.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from ha_controller import auth
from ha_controller.dataversion import DataVersion
from ha_controller.proto import common_pb2, nameserver_pb2
from ha_controller.protocol.codes import RequestCode
from ha_controller.routing import Perm, TopicConfig
from ha_controller.rpc import Dispatcher, RequestContext, RpcConnection, RpcServer, connect
from ha_controller.wire import data_version_to_pb, topic_config_to_pb


@dataclass
class Notification:
    min_broker_id: int
    min_broker_addr: str
    offline_broker_addr: str
    ha_broker_addr: str
    broker_name: str
    received_at: float


@dataclass
class SimulatedBroker:
    namesrv: str
    cluster: str
    broker_name: str
    broker_id: int
    enable_acting_master: bool | None = True
    heartbeat_timeout_ms: int | None = 10_000
    topics: dict[str, TopicConfig] = field(default_factory=dict)
    secret: str | None = None
    data_version: DataVersion = field(default_factory=DataVersion)
    pre_online_done: bool = True
    #: what registrations and heartbeats report (None: not reported, an old broker)
    max_offset: int | None = None
    store_writable: bool | None = None
    notifications: list[Notification] = field(default_factory=list)
    listen_server: bool = True
    _server: RpcServer | None = None
    _conn: RpcConnection | None = None
    _notified: asyncio.Event = field(default_factory=asyncio.Event)
    addr: str = ""
    ha_addr: str = ""

    @staticmethod
    def topic(name: str, queues: int = 8, perm: int = Perm.READ | Perm.WRITE) -> TopicConfig:
        return TopicConfig(name, queues, queues, perm)

    async def start(self) -> SimulatedBroker:
        if self.listen_server:
            d = Dispatcher()
            d.add(
                RequestCode.NOTIFY_MIN_BROKER_ID_CHANGE,
                nameserver_pb2.NotifyMinBrokerIdChangeRequest,
                self._on_notify,
            )
            self._server = RpcServer(d, name=f"sim-{self.broker_name}-{self.broker_id}")
            host, port = await self._server.start("127.0.0.1", 0)
            self.addr = f"{host}:{port}"
        else:
            self.addr = self.addr or f"127.0.0.1:{20000 + self.broker_id}"
        self.ha_addr = self.ha_addr or f"{self.addr}-ha"
        await self.connect()
        return self

    async def connect(self) -> None:
        self._conn = await connect(self.namesrv)

    async def _on_notify(
        self, ctx: RequestContext, req: nameserver_pb2.NotifyMinBrokerIdChangeRequest
    ) -> common_pb2.Empty:
        self.notifications.append(
            Notification(
                req.min_broker_id,
                req.min_broker_addr,
                req.offline_broker_addr,
                req.ha_broker_addr,
                req.broker_name,
                time.monotonic(),
            )
        )
        self._notified.set()
        return common_pb2.Empty()

    @property
    def conn(self) -> RpcConnection:
        assert self._conn is not None, "not connected"
        return self._conn

    def register_request(self, secret: str | None = None) -> nameserver_pb2.RegisterBrokerRequest:
        ts = int(time.time() * 1000)
        req = nameserver_pb2.RegisterBrokerRequest(
            cluster=self.cluster,
            broker_addr=self.addr,
            broker_name=self.broker_name,
            broker_id=self.broker_id,
            ha_addr=self.ha_addr,
            topic_configs=[topic_config_to_pb(t) for t in self.topics.values()],
            data_version=data_version_to_pb(self.data_version),
            timestamp_ms=ts,
            pre_online_done=self.pre_online_done,
        )
        if self.heartbeat_timeout_ms is not None:
            req.heartbeat_timeout_ms = self.heartbeat_timeout_ms
        if self.enable_acting_master is not None:
            req.enable_acting_master = self.enable_acting_master
        if self.max_offset is not None:
            req.max_offset = self.max_offset
        if self.store_writable is not None:
            req.store_writable = self.store_writable
        secret = secret if secret is not None else self.secret
        if secret:
            req.signature = auth.sign(
                secret,
                auth.canonical(
                    "register", self.cluster, self.addr, self.broker_name, self.broker_id, ts
                ),
            )
        return req

    def _sign_with(self, secret: str | None) -> None:
        """Sign what goes out on our connection with ``secret`` (None: ours)."""
        secret = secret if secret is not None else self.secret
        self.conn.signer = auth.ClusterAuth(secret).sign if secret else None

    async def register(self, secret: str | None = None) -> nameserver_pb2.RegisterBrokerResponse:
        if self._conn is None or self._conn.closed:
            await self.connect()
        self._sign_with(secret)
        return await self.conn.call_pb(
            RequestCode.REGISTER_BROKER,
            self.register_request(secret),
            nameserver_pb2.RegisterBrokerResponse,
        )

    def heartbeat(self) -> None:
        req = nameserver_pb2.BrokerHeartbeatRequest(
            cluster=self.cluster, broker_addr=self.addr, broker_name=self.broker_name
        )
        if self.max_offset is not None:
            req.max_offset = self.max_offset
        if self.store_writable is not None:
            req.store_writable = self.store_writable
        self._sign_with(None)
        self.conn.oneway(RequestCode.BROKER_HEARTBEAT, req.SerializeToString())

    async def query_data_version(self) -> nameserver_pb2.QueryDataVersionResponse:
        self._sign_with(None)
        return await self.conn.call_pb(
            RequestCode.QUERY_DATA_VERSION,
            nameserver_pb2.QueryDataVersionRequest(
                cluster=self.cluster,
                broker_addr=self.addr,
                broker_name=self.broker_name,
                broker_id=self.broker_id,
                data_version=data_version_to_pb(self.data_version),
            ),
            nameserver_pb2.QueryDataVersionResponse,
        )

    async def wait_notification(self, timeout: float = 5.0) -> Notification:
        async with asyncio.timeout(timeout):
            while not self.notifications:
                self._notified.clear()
                await self._notified.wait()
        return self.notifications[-1]

    async def drop_connection(self) -> None:
        if self._conn is not None:
            await self._conn.aclose()

    async def aclose(self) -> None:
        await self.drop_connection()
        if self._server is not None:
            await self._server.aclose(grace_s=0.5)
