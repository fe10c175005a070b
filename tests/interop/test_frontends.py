"""Messages cross every pair of front-ends both ways, at every QoS, with real clients.

Front-ends: MQTT over TCP (paho), MQTT over WebSocket (paho ``transport="websockets"``,
3.1.1 and 5.0; secure WebSocket too), MQTT-SN 1.2 (our client; the PyPI ``mqtt-sn-12``
command-line tools), and MQTT.js (npm ``mqtt@5``) over ws and wss. The subscriber always
asks for QoS 2, so the QoS delivered is the QoS published: it must be preserved.
"""

from __future__ import annotations

import itertools
import queue
import subprocess
import threading
from collections.abc import Callable, Iterator

import paho.mqtt.client as mqtt
import pytest

from tests.interop.clients import MqttJs, PahoEnd, SnEnd, path_of, run_cli
from tests.interop.conftest import PREDEFINED, Gateway, have_mqttjs

pytestmark = [pytest.mark.interop, pytest.mark.slow]

End = PahoEnd | SnEnd
MAKERS: dict[str, Callable[[Gateway, str], End]] = {
    "tcp": lambda gw, cid: PahoEnd(gw, "tcp", cid),
    "ws": lambda gw, cid: PahoEnd(gw, "ws", cid),
    "ws5": lambda gw, cid: PahoEnd(gw, "ws", cid, mqtt.MQTTv5),
    "wss": lambda gw, cid: PahoEnd(gw, "wss", cid, mqtt.MQTTv5),
    "mqttsn": lambda gw, cid: SnEnd(gw, cid),
}
PAIRS = [
    (a, b)
    for a, b in itertools.product(["tcp", "ws", "mqttsn"], repeat=2)
    if a != b
] + [("ws5", "mqttsn"), ("mqttsn", "wss"), ("wss", "tcp")]


@pytest.fixture
def ends(gateway: Gateway) -> Iterator[Callable[[str, str], End]]:
    made: list[End] = []

    def make(kind: str, cid: str) -> End:
        end = MAKERS[kind](gateway, cid)
        made.append(end)
        return end

    yield make
    for end in made:
        end.close()


@pytest.mark.parametrize(("src", "dst"), PAIRS, ids=[f"{a}->{b}" for a, b in PAIRS])
def test_every_pair_every_qos(
    ends: Callable[[str, str], End], uid: str, src: str, dst: str
) -> None:
    sub = ends(dst, f"sub-{uid}")
    pub = ends(src, f"pub-{uid}")
    topic = f"cross/{uid}/{src}"
    sub.subscribe(topic, 2)
    for qos in (0, 1, 2):
        payload = f"{src}->{dst} q{qos}".encode()
        pub.publish(topic, payload, qos)
        assert sub.next_message() == (topic, payload, qos)


def test_mqttsn_short_and_predefined_topics_reach_mqtt(
    ends: Callable[[str, str], End], uid: str
) -> None:
    sub = ends("tcp", f"sub-{uid}")
    sub.subscribe("predef/#", 1)
    sub.subscribe("z9", 1)
    sn = ends("mqttsn", f"sn-{uid}")
    assert isinstance(sn, SnEnd)
    sn._call(sn.client.publish(1, b"by id", 1))
    assert sub.next_message() == (PREDEFINED[1], b"by id", 1)
    sn._call(sn.client.publish("z9", b"short", 1))
    assert sub.next_message() == ("z9", b"short", 1)


def test_sleeping_mqttsn_client_gets_messages_from_websocket(
    ends: Callable[[str, str], End], uid: str
) -> None:
    sn = ends("mqttsn", f"sleepy-{uid}")
    assert isinstance(sn, SnEnd)
    topic = f"sleep/{uid}"
    sn.subscribe(topic, 1)
    sn._call(sn.client.sleep(60))
    ws = ends("ws", f"ws-{uid}")
    for i in range(3):
        ws.publish(topic, b"%d" % i, 1)
    woke = sn._call(sn.client.wake())
    assert [(m.topic, m.payload) for m in woke] == [(topic, b"0"), (topic, b"1"), (topic, b"2")]


# ------------------------------------------------------------------ mqtt-sn-12 (PyPI)

needs_sn_tools = pytest.mark.skipif(
    path_of("mqtt_sn_pub") is None, reason="mqtt-sn-12 (mqtt_sn_pub/mqtt_sn_sub) not installed"
)


@needs_sn_tools
@pytest.mark.parametrize("qos", [-1, 0, 1, 2])
def test_mqtt_sn_pub_to_paho(
    gateway: Gateway, ends: Callable[[str, str], End], uid: str, qos: int
) -> None:
    sub = ends("tcp", f"sub-{uid}")
    pub_tool = str(path_of("mqtt_sn_pub"))
    args = [pub_tool, "-h", gateway.host, "-p", str(gateway.mqttsn), "-q", str(qos)]
    if qos == -1:  # QoS -1 needs a predefined (or short) topic and no connection
        sub.subscribe(PREDEFINED[2], 2)
        args += ["-T", "2", "-m", f"tool q{qos} {uid}"]
        expected_topic, expected_qos = PREDEFINED[2], 0
    else:
        expected_topic, expected_qos = f"snpy/{uid}", qos
        sub.subscribe(expected_topic, 2)
        args += ["-t", expected_topic, "-m", f"tool q{qos} {uid}", "-i", f"tool-{uid}"]
    r = run_cli(args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sub.next_message() == (expected_topic, f"tool q{qos} {uid}".encode(), expected_qos)


@needs_sn_tools
@pytest.mark.parametrize("qos", [0, 1])
def test_mqtt_sn_sub_from_paho(
    gateway: Gateway, ends: Callable[[str, str], End], uid: str, qos: int
) -> None:
    topic = f"snpy/{uid}"
    sub_tool = str(path_of("mqtt_sn_sub"))
    proc = subprocess.Popen(
        [sub_tool, "-h", gateway.host, "-p", str(gateway.mqttsn), "-t", topic, "-q", str(qos),
         "-i", f"toolsub-{uid}", "-d"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=read, daemon=True).start()
    try:
        while "SUBACK return code" not in (line := lines.get(timeout=30)):  # -d logs packets
            assert line, "mqtt_sn_sub exited before its SUBACK"
        pub = ends("tcp", f"pub-{uid}")
        pub.publish(topic, f"to tool {uid}".encode(), qos)
        while f"to tool {uid}" not in (line := lines.get(timeout=30)):
            assert line, "mqtt_sn_sub exited without the message"
    finally:
        proc.kill()
        proc.wait(timeout=10)


# ------------------------------------------------------------------ MQTT.js (npm mqtt@5)

needs_mqttjs = pytest.mark.skipif(
    not have_mqttjs(), reason="MQTT.js not installed (scripts/test runs npm install)"
)


@needs_mqttjs
@pytest.mark.parametrize("secure", [False, True], ids=["ws", "wss"])
@pytest.mark.parametrize("version", [4, 5], ids=["3.1.1", "5.0"])
def test_mqttjs_both_ways(
    gateway: Gateway, ends: Callable[[str, str], End], uid: str, secure: bool, version: int
) -> None:
    js = MqttJs(gateway, secure, version)
    # MQTT.js subscribes, paho (TCP) and MQTT-SN publish at every QoS
    topic = f"js/{uid}/in"
    sub = js.subscriber(f"jssub-{uid}", topic, 2, count=6)
    try:
        tcp = ends("tcp", f"tcp-{uid}")
        sn = ends("mqttsn", f"sn-{uid}")
        for qos in (0, 1, 2):
            tcp.publish(topic, f"tcp q{qos}".encode(), qos)
            assert sub.next_message() == (topic, f"tcp q{qos}".encode(), qos)
            sn.publish(topic, f"sn q{qos}".encode(), qos)
            assert sub.next_message() == (topic, f"sn q{qos}".encode(), qos)
    finally:
        sub.close()
    # MQTT.js publishes at every QoS, paho (TCP) and MQTT-SN receive
    out_topic = f"js/{uid}/out"
    tcp_sub = ends("tcp", f"tcpsub-{uid}")
    tcp_sub.subscribe(out_topic, 2)
    sn_sub = ends("mqttsn", f"snsub-{uid}")
    sn_sub.subscribe(out_topic, 2)
    for qos in (0, 1, 2):
        js.publish(f"jspub-{uid}-{qos}", out_topic, f"js q{qos}", qos)
        for end in (tcp_sub, sn_sub):
            try:
                got = end.next_message()
            except (queue.Empty, TimeoutError):
                raise AssertionError(f"{end.name}: nothing from MQTT.js at QoS {qos}") from None
            assert got == (out_topic, f"js q{qos}".encode(), qos)
