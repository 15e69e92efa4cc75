"""RouteCache derived views (publish / subscribe queues, id-0 addresses)."""

from __future__ import annotations

import pytest

from ha_controller.client import MessageQueue, NameserverClient, RouteCache
from ha_controller.client.routes import (
    OLDER_EPOCH_ACCEPT_S,
    _default_route,
    addr_for_subscribe,
    parse_namesrv_addrs,
    publish_queues_of,
    subscribe_queues_of,
)
from ha_controller.routing import BrokerData, Perm, QueueData, TopicRouteData

RW = Perm.READ | Perm.WRITE


def acting_route() -> TopicRouteData:
    """broker-a has its master; broker-b lost it: the nameserver shows its lowest
    slave (id 1) as id 0 with read-only perm, other slaves keep their ids."""
    return TopicRouteData(
        "T",
        [
            BrokerData("c", "broker-b", {0: "10.0.0.21:10911", 2: "10.0.0.22:10911"}, True),
            BrokerData("c", "broker-a", {0: "10.0.0.10:10911", 1: "10.0.0.11:10911"}, True),
        ],
        [
            QueueData("broker-b", 4, 4, Perm.READ),
            QueueData("broker-a", 4, 4, RW),
        ],
    )


def cache() -> RouteCache:
    # No connection is made until a route is fetched.
    return RouteCache(NameserverClient(["127.0.0.1:1"]))


def qs(broker: str, ids: range) -> list[MessageQueue]:
    return [MessageQueue("T", broker, i) for i in ids]


def test_acting_group_gets_no_publish_queues_but_keeps_subscribe_queues() -> None:
    rc = cache()
    rc.update(acting_route())
    assert rc.publish_queues("T") == qs("broker-a", range(4))
    assert rc.subscribe_queues("T") == qs("broker-a", range(4)) + qs("broker-b", range(4))
    # Clients read, commit and lock through id 0: the acting slave.
    assert rc.broker_addr_for_publish("broker-b") == "10.0.0.21:10911"
    assert rc.broker_addr_for_subscribe("broker-b") == "10.0.0.21:10911"
    assert rc.broker_addr_for_publish("broker-a") == "10.0.0.10:10911"
    assert rc.topic_broker_addrs("T") == sorted(
        ["10.0.0.10:10911", "10.0.0.11:10911", "10.0.0.21:10911", "10.0.0.22:10911"]
    )


def test_group_without_id0_reads_from_lowest_id_and_gets_no_sends() -> None:
    # An old group (no acting master): route keeps raw slave ids, perm stays RW.
    route = TopicRouteData(
        "T",
        [BrokerData("c", "broker-x", {2: "h2:1", 1: "h1:1"}, False)],
        [QueueData("broker-x", 2, 2, RW)],
    )
    assert publish_queues_of(route) == []
    assert subscribe_queues_of(route) == [
        MessageQueue("T", "broker-x", 0),
        MessageQueue("T", "broker-x", 1),
    ]
    assert addr_for_subscribe(route.broker("broker-x")) == "h1:1"
    rc = cache()
    rc.update(route)
    assert rc.broker_addr_for_publish("broker-x") is None
    assert rc.broker_addr_for_subscribe("broker-x") == "h1:1"
    assert rc.broker_addr_for_subscribe("nope") is None


def test_read_and_write_queue_numbers_and_perms_are_respected() -> None:
    route = TopicRouteData(
        "T",
        [
            BrokerData("c", "a", {0: "a:1"}),
            BrokerData("c", "b", {0: "b:1"}),
            BrokerData("c", "c", {0: "c:1"}),
        ],
        [
            QueueData("a", 2, 3, RW),
            QueueData("b", 2, 2, Perm.WRITE),
            QueueData("c", 1, 1, 0),
        ],
    )
    assert publish_queues_of(route) == [
        MessageQueue("T", "a", 0),
        MessageQueue("T", "a", 1),
        MessageQueue("T", "a", 2),
        MessageQueue("T", "b", 0),
        MessageQueue("T", "b", 1),
    ]
    assert subscribe_queues_of(route) == [MessageQueue("T", "a", 0), MessageQueue("T", "a", 1)]


def test_queue_data_without_broker_data_gets_no_sends() -> None:
    route = TopicRouteData("T", [], [QueueData("ghost", 2, 2, RW)])
    assert publish_queues_of(route) == []


def test_unknown_topic_has_no_queues() -> None:
    rc = cache()
    assert rc.publish_queues("nope") == [] and rc.subscribe_queues("nope") == []
    assert rc.cached("nope") is None


def test_on_change_fires_only_on_changes_and_can_be_removed() -> None:
    rc = cache()
    seen: list[tuple[str, TopicRouteData]] = []
    remove = rc.on_change(lambda topic, route: seen.append((topic, route)))
    route = acting_route()
    assert rc.update(route) is True
    assert rc.update(acting_route()) is False  # equal route: no event
    master_back = TopicRouteData(
        "T",
        [
            BrokerData("c", "broker-b", {0: "10.0.0.20:10911", 1: "10.0.0.21:10911"}, True),
            BrokerData("c", "broker-a", {0: "10.0.0.10:10911"}, True),
        ],
        [QueueData("broker-b", 4, 4, RW), QueueData("broker-a", 4, 4, RW)],
    )
    assert rc.update(master_back) is True
    assert [t for t, _ in seen] == ["T", "T"]
    assert len(rc.publish_queues("T")) == 8
    assert rc.broker_addr_for_publish("broker-b") == "10.0.0.20:10911"
    remove()
    remove()  # idempotent
    rc.update(route)
    assert len(seen) == 2


def test_a_failing_listener_does_not_stop_others() -> None:
    rc = cache()
    seen: list[str] = []

    def bad(topic: str, route: TopicRouteData) -> None:
        raise RuntimeError("boom")

    rc.on_change(bad)
    rc.on_change(lambda topic, route: seen.append(topic))
    rc.update(acting_route())
    assert seen == ["T"]


def test_stand_in_route_never_replaces_a_real_one() -> None:
    rc = cache()
    template = TopicRouteData(
        "TBW102",
        [BrokerData("c", "a", {0: "a:1"}), BrokerData("c", "b", {0: "b:1"})],
        [QueueData("a", 8, 8, RW | Perm.INHERIT), QueueData("b", 8, 8, Perm.READ)],
    )
    stand_in = _default_route("NEW", template)
    assert stand_in.topic == "NEW"
    assert [q.broker_name for q in stand_in.queue_datas] == ["a"]
    assert stand_in.queue_datas[0].write_queue_nums == 4
    assert rc.update(stand_in, default=True)
    assert rc.is_default_route("NEW")
    real = TopicRouteData("NEW", [BrokerData("c", "b", {0: "b:1"})], [QueueData("b", 2, 2, RW)])
    assert rc.update(real)
    assert not rc.is_default_route("NEW")
    assert rc.update(stand_in, default=True) is False
    assert rc.cached("NEW") == real


def test_parse_namesrv_addrs() -> None:
    assert parse_namesrv_addrs("a:1;b:2") == ["a:1", "b:2"]
    assert parse_namesrv_addrs("a:1, b:2") == ["a:1", "b:2"]
    assert parse_namesrv_addrs(["a:1", "b:2;c:3"]) == ["a:1", "b:2", "c:3"]
    with pytest.raises(ValueError):
        parse_namesrv_addrs(" ; ")


async def test_aclose_is_idempotent_and_closes_watches() -> None:
    rc = cache()
    rc.watch("T")  # the nameserver is unreachable: the watch keeps retrying
    await rc.aclose()
    await rc.aclose()
    with pytest.raises(RuntimeError):
        rc.watch("T")


def controlled(epoch: int, master: str, topic: str = "T") -> TopicRouteData:
    return TopicRouteData(
        topic,
        [BrokerData("c", "broker-a", {0: master, 1: "10.0.0.12:10911"}, True, epoch)],
        [QueueData("broker-a", 4, 4, RW)],
    )


def test_a_route_from_an_older_epoch_never_replaces_a_newer_one() -> None:
    # controller mode: epoch 3 moved the master to .11; a nameserver that has not heard
    # yet still shows epoch 2 (master .10): writes must not go back there
    rc = cache()
    assert rc.update(controlled(3, "10.0.0.11:10911"))
    rc.update(controlled(2, "10.0.0.10:10911"))
    assert rc.broker_addr_for_publish("broker-a") == "10.0.0.11:10911"
    # the newer group is kept for every topic, also one first seen from the stale nameserver
    rc.update(controlled(2, "10.0.0.10:10911", topic="U"))
    cached = rc.cached("U")
    assert cached is not None
    assert cached.broker_datas[0].broker_addrs[0] == "10.0.0.11:10911"
    # a newer epoch is taken at once
    assert rc.update(controlled(4, "10.0.0.12:10911"))
    assert rc.broker_addr_for_publish("broker-a") == "10.0.0.12:10911"
    # an older epoch shown on end for a minute (the controller's state was reset) is taken
    rc.update(controlled(1, "10.0.0.10:10911"))
    assert rc.broker_addr_for_publish("broker-a") == "10.0.0.12:10911"
    rc._older_since["broker-a"] -= OLDER_EPOCH_ACCEPT_S
    rc.update(controlled(1, "10.0.0.10:10911"))
    assert rc.broker_addr_for_publish("broker-a") == "10.0.0.10:10911"


def test_groups_without_an_epoch_are_taken_as_shown() -> None:
    rc = cache()
    rc.update(acting_route())
    rc.update(controlled(5, "10.0.0.11:10911"))
    assert rc.broker_addr_for_publish("broker-a") == "10.0.0.11:10911"
