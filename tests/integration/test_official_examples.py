"""apache/rocketmq-clients' own examples for priority and lite messages, run unchanged
against ``hactl proxy`` but for their endpoint (issue 35): python/example's
priority_producer_example.py, lite_producer_example.py and
lite_push_consumer_example.py, and nodejs/examples' ProducerPriorityMessageExample.ts,
LiteProducerExample.ts and LitePushConsumerExample.ts.

No registry package ships the examples (docs/grpc.md, "The official examples"), so the
tests are opt-in: ``ROCKETMQ_PYTHON_EXAMPLES`` names a checkout's python/example,
``ROCKETMQ_NODE_EXAMPLES`` its nodejs/examples; each test skips, saying why, without.
A Python example's endpoint, the constant "foobar.com:8080", is replaced in a copy; a
Node.js example takes its endpoint from ``ROCKETMQ_NODEJS_CLIENT_ENDPOINTS``
(ProducerSingleton.ts): the copies are compiled with TypeScript's ``tsc`` (installed
with the SDK by tools/install-node-sdk.sh) beside a ``src`` that is the installed
rocketmq-client-nodejs 1.0.8 (the examples import ``'../src'``).  What arrived is
read back with our own SimpleConsumer; push consumers, which never exit, run until
what they printed says they got what was sent, and are killed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gateway_helpers import lite_subscriptions, wait_routed

from ha_controller.testing import (
    Cluster,
    ProcessHandle,
    create_typed_topics,
    eventually_sync,
    run_cluster,
)

ROOT = Path(__file__).resolve().parents[2]
PY_EXAMPLES = Path(os.environ.get("ROCKETMQ_PYTHON_EXAMPLES", "") or "/nonexistent")
NODE_EXAMPLES = Path(os.environ.get("ROCKETMQ_NODE_EXAMPLES", "") or "/nonexistent")
NODE_SDK_DIR = Path(os.environ.get("HAC_NODE_SDK_DIR", ROOT / ".venv" / "sdk-node"))
NODE_MODULES = NODE_SDK_DIR / "node_modules"
TSC = NODE_MODULES / "typescript" / "bin" / "tsc"

#: the topics the examples name (their parent topics LITE, the priority ones PRIORITY)
LITE_TOPICS = {"parent-topic": "LITE", "topic": "LITE"}
NODE_LITE_TOPICS = {"yourParentTopic": "LITE", "your-parent-topic": "LITE"}
PRIORITY_TOPICS = {"priority-topic": "PRIORITY", "yourPriorityTopic": "PRIORITY"}
#: a PRIORITY topic's queues are its levels: 0..9 (docs/grpc.md "Priority messages")
LEVELS = 10


def _why_no_python() -> str | None:
    if not (PY_EXAMPLES / "priority_producer_example.py").is_file():
        return (
            "ROCKETMQ_PYTHON_EXAMPLES (a checkout's apache/rocketmq-clients python/example) "
            "is not set; no registry package ships the examples (docs/grpc.md)"
        )
    if importlib.util.find_spec("rocketmq") is None:
        return "rocketmq-python-client is not installed (pip install rocketmq-python-client==5.1.2)"
    return None


def _why_no_node() -> str | None:
    if not (NODE_EXAMPLES / "ProducerPriorityMessageExample.ts").is_file():
        return (
            "ROCKETMQ_NODE_EXAMPLES (a checkout's apache/rocketmq-clients nodejs/examples) "
            "is not set; no registry package ships the examples (docs/grpc.md)"
        )
    if shutil.which("node") is None:
        return "node is not installed"
    if not (NODE_MODULES / "rocketmq-client-nodejs" / "dist").is_dir() or not TSC.is_file():
        return f"rocketmq-client-nodejs and typescript are not in {NODE_SDK_DIR}: run `make tools`"
    return None


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cluster, ProcessHandle]]:
    """One group (a master and a slave: one broker orders every pop of a PRIORITY
    topic) and ``hactl proxy`` with its default bounds."""
    c = run_cluster(("examples",), 2, workdir=tmp_path_factory.mktemp("examples"))
    proxy = None
    try:
        # a master registers after its pre-online: a topic asked for before is lost
        eventually_sync(
            lambda: (
                create_typed_topics(c.namesrv, {**LITE_TOPICS, **NODE_LITE_TOPICS}) == ["examples"]
            ),
            timeout=20,
            interval=0.5,
        )
        create_typed_topics(c.namesrv, PRIORITY_TOPICS, queues=LEVELS)
        proxy = c.run_proxy()
        wait_routed(proxy, *LITE_TOPICS, *NODE_LITE_TOPICS, *PRIORITY_TOPICS)
        yield c, proxy
    finally:
        if proxy is not None:
            proxy.stop()
        c.stop()


def _received(c: Cluster, topic: str, group: str, n: int) -> list[tuple[int | None, str | None]]:
    """(priority, tag) of the first ``n`` messages a new group of our SimpleConsumer
    pops from ``topic``, one pop at a time (each pop's own pick), acked."""
    from ha_controller.client.simple_consumer import SimpleConsumer
    from ha_controller.testing import eventually

    async def run() -> list[tuple[int | None, str | None]]:
        got: list[tuple[int | None, str | None]] = []
        async with SimpleConsumer(c.namesrv, group, [topic]) as consumer:

            async def step() -> bool:
                for m in await consumer.receive(1, wait_s=0.5):
                    got.append((m.priority, m.tags))
                    await consumer.ack(m)
                return len(got) >= n

            await eventually(step, timeout=20, interval=0.01)
            assert await consumer.receive(1, wait_s=0.5) == []  # and no more
        return got

    return asyncio.run(run())


class _Output:
    """What a long-running child prints, read on a thread, for waiting on lines."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        self.proc = proc
        self.lines: list[str] = []
        self._lock = threading.Lock()
        stdout = proc.stdout

        def read() -> None:
            for line in stdout:
                with self._lock:
                    self.lines.append(line)

        threading.Thread(target=read, daemon=True).start()

    def text(self) -> str:
        with self._lock:
            return "".join(self.lines)

    def wait_for(self, what: str, count: int, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while self.text().count(what) < count and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                time.sleep(0.2)  # the reader's last lines
                break
            time.sleep(0.1)
        return self.text()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


# --------------------------------------------------------------------------------------
# python/example
# --------------------------------------------------------------------------------------


def _python_example(name: str, proxy: ProcessHandle, tmp_path: Path) -> Path:
    """A copy of python/example's ``name`` whose endpoint is the gateway's."""
    text = (PY_EXAMPLES / name).read_text()
    assert text.count('"foobar.com:8080"') == 1, f"{name}: its endpoint is not where it was"
    script = tmp_path / name
    script.write_text(text.replace('"foobar.com:8080"', json.dumps(proxy.rpc)))
    return script


def _run_python(script: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert "raise exception" not in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(_why_no_python() is not None, reason=_why_no_python() or "")
def test_the_python_priority_producer_example(gateway: Any, tmp_path: Path) -> None:
    """priority_producer_example.py sends one message to "priority-topic" with priority
    0, 1, ... 9 (tag "tag"); a consumer then gets them highest first, each with its
    priority (RocketMQ 5.4: a POP of a PRIORITY topic serves the highest level first)."""
    c, proxy = gateway
    out = _run_python(_python_example("priority_producer_example.py", proxy, tmp_path))
    assert out.count("send message success") == 10, out[-2000:]
    got = _received(c, "priority-topic", "g-examples-priority", 10)
    assert got == [(p, "tag") for p in range(LEVELS - 1, -1, -1)], got


@pytest.mark.skipif(
    _why_no_python() is not None or not (PY_EXAMPLES / "lite_push_consumer_example.py").is_file(),
    reason=_why_no_python() or "python/example has no lite_push_consumer_example.py",
)
def test_the_python_lite_examples(gateway: Any, tmp_path: Path) -> None:
    """lite_producer_example.py sends lite-test-0..9 to "parent-topic";
    lite_push_consumer_example.py subscribes lite-test-0..9 of "topic": both must work,
    and the producer's messages, sent to "topic" (a copy with that topic), reach the
    consumer.  The SDK's subscribe_lite sends the characters of each name (docs/grpc.md,
    "Python SDK"): the consumer's real ten arrive with its resync, 30 s on."""
    _, proxy = gateway
    producer = _python_example("lite_producer_example.py", proxy, tmp_path)
    consumer_script = _python_example("lite_push_consumer_example.py", proxy, tmp_path)
    before = lite_subscriptions(proxy)
    consumer = _Output(
        subprocess.Popen(
            [sys.executable, str(consumer_script)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
    )
    try:
        out = _run_python(producer)
        assert out.count("send message success") == 10, out[-2000:]
        # its ten subscriptions are in before anything is sent to "topic"
        eventually_sync(lambda: lite_subscriptions(proxy) == before + 10, timeout=45, interval=0.2)
        to_topic = tmp_path / "send_to_topic.py"
        to_topic.write_text(
            producer.read_text().replace('topic = "parent-topic"', 'topic = "topic"')
        )
        out = _run_python(to_topic)
        assert out.count("send message success") == 10, out[-2000:]
        text = consumer.wait_for("consume message", 10, 20)
        assert text.count("consume message") == 10, text[-3000:]
        assert "raise exception" not in text, text[-3000:]
    finally:
        consumer.stop()


# --------------------------------------------------------------------------------------
# nodejs/examples
# --------------------------------------------------------------------------------------

NODE_FILES = (
    "ProducerSingleton.ts",
    "ProducerPriorityMessageExample.ts",
    "LiteProducerExample.ts",
    "LitePushConsumerExample.ts",
)


@pytest.fixture(scope="module")
def node_examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The examples, copied as they are into ``examples/`` beside a ``src`` that is the
    installed SDK's build (what ``'../src'`` means in the checkout), compiled in place
    with ``tsc`` (type-checked against the SDK's declarations)."""
    why = _why_no_node()
    if why is not None:
        pytest.skip(why)
    root = tmp_path_factory.mktemp("node-examples")
    (root / "examples").mkdir()
    for name in NODE_FILES:
        shutil.copyfile(NODE_EXAMPLES / name, root / "examples" / name)
    (root / "src").symlink_to(NODE_MODULES / "rocketmq-client-nodejs" / "dist")
    sources = [str(root / "examples" / n) for n in NODE_FILES[1:]]
    argv = ["node", str(TSC), "--module", "commonjs", "--target", "es2022"]
    argv += ["--moduleResolution", "node", "--skipLibCheck", "--types", "node"]
    argv += ["--typeRoots", str(NODE_MODULES / "@types"), *sources]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return root / "examples"


def _node_env(proxy: ProcessHandle, home: Path, **more: str) -> dict[str, str]:
    # the endpoint, as ProducerSingleton.ts reads it; HOME: the SDK's log file
    # (~/logs/rocketmq) goes to the test's directory
    env = {**os.environ, "ROCKETMQ_NODEJS_CLIENT_ENDPOINTS": proxy.rpc, "HOME": str(home)}
    return {**env, **more}


def _run_node(script: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        ["node", str(script)], capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


@pytest.mark.skipif(_why_no_node() is not None, reason=_why_no_node() or "")
def test_the_node_priority_producer_example(
    gateway: Any, node_examples: Path, tmp_path: Path
) -> None:
    """ProducerPriorityMessageExample.ts sends priorities 1, 5, 10 and 100 to
    "yourPriorityTopic" and sees the SDK refuse three wrong mixes; a consumer then gets
    them highest first: 10 and 100 share the highest of the topic's 10 levels, so they
    come in the order sent."""
    c, proxy = gateway
    out = _run_node(node_examples / "ProducerPriorityMessageExample.js", _node_env(proxy, tmp_path))
    assert out.count("priority message sent:") == 4, out[-3000:]
    assert out.count("✓ Correctly rejected") == 3, out[-3000:]
    assert "All validation checks passed!" in out, out[-3000:]
    got = _received(c, "yourPriorityTopic", "g-examples-node-priority", 4)
    assert got == [
        (10, "high-priority"),
        (100, "critical-priority"),
        (5, "medium-priority"),
        (1, "low-priority"),
    ], got


@pytest.mark.skipif(_why_no_node() is not None, reason=_why_no_node() or "")
def test_the_node_lite_examples(gateway: Any, node_examples: Path, tmp_path: Path) -> None:
    """LitePushConsumerExample.ts binds "your-parent-topic" and subscribes lite-topic-1,
    lite-topic-2 (MIN_OFFSET) and lite-topic-3 (ofTailN(100)); LiteProducerExample.ts
    sends lite-topic-1..5 to its parent topic, "yourParentTopic" — and, run again with
    ProducerSingleton's ROCKETMQ_NODEJS_LITE_PARENT_TOPIC set to the consumer's topic,
    to "your-parent-topic": the consumer prints lite-topic-1..3, once each, and no
    other."""
    _, proxy = gateway
    env = _node_env(proxy, tmp_path)
    consumer = _Output(
        subprocess.Popen(
            ["node", str(node_examples / "LitePushConsumerExample.js")],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
    )
    try:
        text = consumer.wait_for("Consumer is running", 1, 30)
        assert "Consumer is running" in text, text[-3000:]
        out = _run_node(node_examples / "LiteProducerExample.js", env)
        assert out.count("sent successfully") == 5, out[-3000:]
        assert "Topic: yourParentTopic" in out, out[-3000:]
        env_topic = {**env, "ROCKETMQ_NODEJS_LITE_PARENT_TOPIC": "your-parent-topic"}
        out = _run_node(node_examples / "LiteProducerExample.js", env_topic)
        assert out.count("sent successfully") == 5, out[-3000:]
        text = consumer.wait_for("Received message:", 3, 20)
        time.sleep(1.0)  # nothing more may come
        text = consumer.text()
        assert text.count("Received message:") == 3, text[-3000:]
        for i in (1, 2, 3):
            assert text.count(f"liteTopic: 'lite-topic-{i}'") == 1, text[-3000:]
        assert text.count("topic: 'your-parent-topic'") == 3, text[-3000:]
        assert "Error during consumption" not in text, text[-3000:]
    finally:
        consumer.stop()
