"""A wiped master whose slave is away never goes online empty (issue 34, item 2).

Group ``wg`` (master + slave) takes 200 acknowledged messages; the slave is stopped,
the master is killed and its store deleted, and it restarts.  Before, it was online
0.6 s later with none of the messages, took new writes at offset 0 and refused its
slave for good when it came back.  Now it waits in pre-online (``/readyz`` 503, its
status says why) because the nameserver saw the group hold data; the slave comes
back, the master copies from it and goes online with every message.  An operator can
instead let it go online without the data (``hactl accept-data-loss``), loudly logged.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from ha_controller.client.admin import NameserverClient
from ha_controller.client.message import Message
from ha_controller.client.producer import Producer
from ha_controller.client.pull_consumer import PullConsumer
from ha_controller.testing import (
    Cluster,
    _base_env,
    eventually,
    hactl_argv,
    http_get,
    run_cluster,
    stored_messages,
)

pytestmark = pytest.mark.timeout(180)

GROUP = "wg"
TOPIC = "Wiped"
SENT = 200
#: the master stays isolated at least this long with no slave to copy from
WAITS_AT_LEAST_S = 5.0


def status(c: Cluster, bid: int) -> dict[str, object] | None:
    try:
        code, body = http_get(c.broker(GROUP, bid).http, "/api/v1/status")
    except OSError:
        return None
    return json.loads(body) if code == 200 else None


def waiting_for_data(c: Cluster) -> bool:
    """The wiped master stays in pre-online because its group held more than it has."""
    st = status(c, 0)
    return st is not None and "held data up to" in str(st["preOnlineStep"])


async def online_master(ns: NameserverClient, addr: str | None) -> bool:
    groups = {g.broker_name: g for g in await ns.groups()}
    g = groups.get(GROUP)
    return (g.members.get(0) if g is not None else None) == addr


async def wipe_and_restart(c: Cluster, tmp_path: Path) -> None:
    async with NameserverClient([c.namesrv]) as ns:
        await eventually(lambda: online_master(ns, c.broker(GROUP, 0).rpc), timeout=30)
        await ns.create_topic(TOPIC, queues=2)
        async with Producer(c.namesrv, "wiped-p") as p:
            for i in range(SENT):
                await p.send(Message(TOPIC, f"m-{i}".encode()))
        # the slave has it all (its heartbeat tells the nameserver), then goes away
        await asyncio.sleep(1.0)
        c.broker(GROUP, 1).kill()
        c.broker(GROUP, 0).kill()
        shutil.rmtree(tmp_path / "store" / f"{GROUP}-0")
        await asyncio.to_thread(c.restart, GROUP, 0)


async def test_a_wiped_master_waits_for_its_slave_and_comes_back_whole(tmp_path: Path) -> None:
    c = run_cluster((GROUP,), 2, workdir=tmp_path)
    try:
        await wipe_and_restart(c, tmp_path)
        master = c.broker(GROUP, 0)
        # (until the nameserver expires the killed slave, the master tries it first: the
        # step it reports meanwhile is another)
        await eventually(lambda: waiting_for_data(c), timeout=30)
        await asyncio.sleep(WAITS_AT_LEAST_S)
        st = status(c, 0)
        assert st is not None and st["isolated"] is True, st
        assert waiting_for_data(c), st
        code, _ = await asyncio.to_thread(http_get, master.http, "/readyz")
        assert code == 503
        # the slave comes back with the data: the master copies it and goes online
        await asyncio.to_thread(c.restart, GROUP, 1)
        async with NameserverClient([c.namesrv]) as ns:
            await eventually(lambda: online_master(ns, master.rpc), timeout=60)
        async with PullConsumer(c.namesrv, "wiped-check") as pull:
            bodies = {m.body async for m in stored_messages(pull, await pull.queues(TOPIC))}
        missing = {f"m-{i}".encode() for i in range(SENT)} - bodies
        assert not missing, f"{len(missing)} of {SENT} acknowledged messages missing"
        assert "caught up from slave 1" in master.log_path.read_text()
    finally:
        c.stop()


async def test_an_operator_may_let_it_go_online_without_the_data(tmp_path: Path) -> None:
    c = run_cluster((GROUP,), 2, workdir=tmp_path)
    try:
        await wipe_and_restart(c, tmp_path)
        master = c.broker(GROUP, 0)
        await eventually(lambda: waiting_for_data(c), timeout=30)
        done = subprocess.run(
            hactl_argv(
                "accept-data-loss",
                "--store-dir",
                str(tmp_path / "store" / f"{GROUP}-0"),
                "--reason",
                "both volumes lost in the drill",
            ),
            capture_output=True,
            text=True,
            timeout=30,
            env=_base_env(None),
            check=False,
        )
        assert done.returncode == 0, done.stderr
        async with NameserverClient([c.namesrv]) as ns:
            await eventually(lambda: online_master(ns, master.rpc), timeout=20)
        log = master.log_path.read_text()
        assert "OPERATOR OVERRIDE" in log and "are lost" in log
        assert not (tmp_path / "store" / f"{GROUP}-0" / "accept-data-loss").exists()
    finally:
        c.stop()
