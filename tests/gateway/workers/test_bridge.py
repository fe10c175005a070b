"""A bridge on a 2-worker node: every worker forwards its own clients' publishes
upstream (each message once), and what arrives from upstream comes in through worker 0
only and reaches subscribers on both workers once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.gateway.bridge.support import Mosquitto, needs_mosquitto
from tests.gateway.cluster.harness import Client, wait_until
from tests.gateway.workers.harness import WorkerNode

pytestmark = [needs_mosquitto, pytest.mark.slow]

BRIDGE = """
[bridges.mqtt.cloud]
server = "127.0.0.1:{port}"
proto_ver = "v5"
clientid = "edge-1"
[bridges.mqtt.cloud.reconnect]
initial = "100ms"
max = "500ms"
[[bridges.mqtt.cloud.forwards]]
local = "up/#"
remote = "edge/${{topic}}"
[[bridges.mqtt.cloud.subscriptions]]
remote = "down/#"
local = "cloud/${{topic}}"
qos = 1
"""


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[Mosquitto]:
    m = Mosquitto(tmp_path / "mosquitto").start()
    yield m
    m.stop()


def test_bridge_on_two_workers(tmp_path: Path, upstream: Mosquitto) -> None:
    node = WorkerNode(tmp_path, config=BRIDGE.format(port=upstream.port))
    try:
        node.start()
        cloud = Client(SimpleNamespace(mqtt_port=upstream.port), "cloud-side")  # type: ignore[arg-type]
        cloud.subscribe("edge/#", 1)
        # both workers' bridges are connected upstream (worker 1's with clientid edge-1-w1)
        wait_until(lambda: all(node.get(i, "/api/v5/bridges")["bridges"][0]["status"]
                               == "connected" for i in (0, 1)), what="both bridges up")
        subs = [node.client_on(i, f"local-sub{i}").subscribe("cloud/#", 1) for i in (0, 1)]
        wait_until(lambda: node.routes_of(0, 1) >= 1 and node.routes_of(1, 0) >= 1,
                   what="routes on both workers")
        pubs = [node.client_on(i, f"local-pub{i}") for i in (0, 1)]
        for i, pub in enumerate(pubs):
            pub.publish(f"up/w{i}", f"from{i}", qos=1)
        got = sorted((m.topic, m.payload) for m in cloud.collect(2))
        assert got == [("edge/up/w0", b"from0"), ("edge/up/w1", b"from1")]
        cloud.publish("down/cmd", "go", qos=1)
        for sub in subs:
            m = sub.next_message()
            assert (m.topic, m.payload) == ("cloud/down/cmd", b"go")
        for c in (*subs, *pubs):
            assert c.drain() == []
        assert cloud.drain() == []
        for c in (*subs, *pubs, cloud):
            c.close()
    finally:
        code = node.stop()
    assert code == 0, node.log()[-4000:]
