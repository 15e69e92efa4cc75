"""Network faults between two real namespaces, measured with UDP datagrams.

A one-way partition must drop exactly one direction: ``in`` on host B drops what A
sends to B and lets B's datagrams reach A; ``out`` the reverse.  Blackouts drop some,
not all.  Skipped with the reason when ``ip netns add`` is not permitted here.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest

from ha_controller.drills.netns import Host, Network

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("needs_netns")]

#: sends ``count`` datagrams to HOST:PORT from inside a namespace, paced by ``gap`` s
SENDER = """
import socket, sys, time
host, port, count, gap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for i in range(count):
    s.sendto(str(i).encode(), (host, port))
    time.sleep(gap)
"""
#: counts the datagrams that arrive within ``wait`` s and prints the number
RECEIVER = """
import socket, sys, time
port, wait = int(sys.argv[1]), float(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", port))
s.settimeout(0.2)
n, deadline = 0, time.monotonic() + wait
print("ready", flush=True)
while time.monotonic() < deadline:
    try:
        s.recv(64)
        n += 1
    except TimeoutError:
        pass
print(n, flush=True)
"""


@pytest.fixture
def net() -> Iterator[Network]:
    with Network() as network:
        network.add_host("a")
        network.add_host("b")
        yield network


def datagrams(src: Host, dst: Host, *, count: int = 20, gap: float = 0.02) -> int:
    """How many of ``count`` datagrams from ``src`` reach ``dst``."""
    port = "45123"
    wait = str(count * gap + 1.0)
    receiver = subprocess.Popen(
        [*dst.exec_prefix(), sys.executable, "-c", RECEIVER, port, wait],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert receiver.stdout is not None
        assert receiver.stdout.readline().strip() == "ready"
        subprocess.run(
            [*src.exec_prefix(), sys.executable, "-c", SENDER, dst.ip, port, str(count), str(gap)],
            check=True,
            timeout=30,
        )
        out, _ = receiver.communicate(timeout=30)
    finally:
        receiver.kill()
        receiver.wait()
    return int(out.strip().splitlines()[-1])


def test_partitions_full_and_one_way(net: Network) -> None:
    a, b = net.hosts["a"], net.hosts["b"]
    # the first datagrams may wait for ARP; warm the neighbour tables both ways
    datagrams(a, b, count=3)
    datagrams(b, a, count=3)
    assert datagrams(a, b) == 20 and datagrams(b, a) == 20
    net.partition("b", "in")  # b hears nothing; what it sends still arrives
    assert datagrams(a, b) == 0
    assert datagrams(b, a) == 20
    net.heal_partition("b")
    net.partition("b", "out")  # b sends nothing; it still hears
    assert datagrams(b, a) == 0
    assert datagrams(a, b) == 20
    net.heal_partition("b")
    net.partition("b")  # both ways
    assert datagrams(a, b) == 0 and datagrams(b, a) == 0
    net.heal_partition("b")
    assert datagrams(a, b) == 20 and datagrams(b, a) == 20


def test_blackouts_drop_some_packets(net: Network) -> None:
    a, b = net.hosts["a"], net.hosts["b"]
    datagrams(a, b, count=3)
    net.start_blackouts("b", 40, period_ms=500)
    try:
        got = datagrams(a, b, count=100, gap=0.02)  # 2 s: four blackouts of 0.2 s
    finally:
        net.clear_loss("b")
    assert 20 <= got <= 90, got
    assert datagrams(a, b) == 20  # cleared: nothing dropped any more
