"""What a user's own HIL test looks like with labgrid's pytest plugin:

    pytest -p labgrid --lg-env hil/envs/local.yaml hil/pytest_example

(``-p labgrid`` because this project's pytest configuration turns the plugin off.)

The ``strategy`` fixture is our GatewayStrategy: ``transition("running")`` powers the unit
and waits until it answers; the unit driver (``strategy.unit``) makes faults.
"""

from __future__ import annotations

import queue
import ssl
import tempfile
import threading
import uuid
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

QOS = 1


@pytest.fixture(scope="module")
def unit(strategy: Any) -> Any:
    strategy.prepare(Path(tempfile.mkdtemp(prefix="hil-pytest-")))
    strategy.transition("running")
    yield strategy.unit
    strategy.transition("off")
    strategy.unit.teardown()


def _client(ep: Any, cid: str, clean: bool) -> mqtt.Client:
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid, clean_session=clean)
    c.connect(ep.device_host, ep.ports["mqtt"], 30)
    c.loop_start()
    return c


def test_message_survives_power_cut(unit: Any, strategy: Any) -> None:
    ep = unit.endpoints()
    topic = f"hil/pytest/{uuid.uuid4().hex}"
    sub_id = "pytest-sub-" + topic[-8:]
    got: queue.Queue[bytes] = queue.Queue()
    subscribed = threading.Event()
    sub = _client(ep, sub_id, clean=False)
    sub.on_subscribe = lambda *a: subscribed.set()
    sub.subscribe(topic, QOS)
    assert subscribed.wait(10)
    sub.disconnect()
    sub.loop_stop()
    pub = _client(ep, "pytest-pub", clean=True)
    pub.publish(topic, b"kept", QOS).wait_for_publish(10)  # PUBACK: the unit has it
    pub.disconnect()
    pub.loop_stop()
    strategy.transition("off")  # power cut
    strategy.transition("running")  # cold start
    sub = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=sub_id, clean_session=False)
    sub.on_message = lambda c, u, m: got.put(bytes(m.payload))
    sub.connect(ep.device_host, ep.ports["mqtt"], 30)
    sub.loop_start()
    try:
        assert got.get(timeout=10) == b"kept"
    finally:
        sub.disconnect()
        sub.loop_stop()


def test_tls_listener_answers(unit: Any) -> None:
    ep = unit.endpoints()
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="pytest-tls")
    c.tls_set(ca_certs=str(ep.ca_file), cert_reqs=ssl.CERT_REQUIRED)
    assert c.connect(ep.device_host, ep.ports["mqtts"], 30) == 0
    c.disconnect()
