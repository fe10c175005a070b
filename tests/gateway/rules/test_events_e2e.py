"""Event fields end to end (a real gatewayd, paho and raw sockets): why a connection
ended (``client_disconnected.reason`` for each way a connection ends), ``sockname`` and
the MQTT 5 ``*_props`` of CONNECT, DISCONNECT, SUBSCRIBE and PUBACK, as EMQX names them."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties
from paho.mqtt.reasoncodes import ReasonCode as PahoReasonCode

from protocols.mqtt.encoder import encode
from protocols.mqtt.packets import MQTT_5, Connect, Properties, PubAck, Subscribe, Subscription
from tests.gateway.admin.gatewayd import WAIT, Client, Gatewayd
from tests.gateway.rules.conftest import event, event_rules, event_watcher

API = "/api/v5"
pytestmark = pytest.mark.rules

RULES = event_rules(
    dis='SELECT clientid, reason, sockname, peername, disconn_props, conn_props '
        'FROM "$events/client_disconnected"',
    con='SELECT clientid, sockname, conn_props FROM "$events/client_connected"',
    sub='SELECT clientid, topic, sub_props FROM "$events/session_subscribed" '
        "WHERE topic = 'props/t'",
    ack='SELECT clientid, qos, payload, puback_props FROM "$events/message_acked" '
        "WHERE topic = 'acked/t'",
)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gatewayd]:
    g = Gatewayd(tmp_path_factory.mktemp("events"), dict(RULES))
    g.start()
    yield g
    g.stop()


@pytest.fixture()
def watch(gw: Gatewayd) -> Iterator[Client]:
    w = event_watcher(gw, "dis", "con", "sub", "ack")
    yield w
    w.close()


def raw_connect(gw: Gatewayd, cid: str, keepalive: int = 60) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", gw.mqtt_port), timeout=WAIT)
    s.sendall(encode(Connect(cid, keepalive=keepalive), 4))
    assert s.recv(4)[:1] == b"\x20"  # CONNACK
    return s


def test_normal_disconnect_with_props_sockname_and_conn_props(gw: Gatewayd,
                                                              watch: Client) -> None:
    props = PahoProperties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 30
    props.UserProperty = ("site", "north")
    c = Client(gw, "ev-normal", version=5, session_expiry=30)
    watch.wait_for("con/ev-normal")
    # paho's helper sets its own CONNECT properties: reconnect with ours
    c.close()
    watch.wait_for("dis/ev-normal")
    c.connected.clear()
    c.c.connect("127.0.0.1", gw.mqtt_port, keepalive=60, clean_start=True, properties=props)
    c.c.loop_start()
    assert c.connected.wait(WAIT)
    con = event(watch, "con/ev-normal")
    assert con["sockname"] == f"127.0.0.1:{gw.mqtt_port}"
    assert con["conn_props"]["Session-Expiry-Interval"] == 30
    assert con["conn_props"]["User-Property"] == {"site": "north"}
    dprops = PahoProperties(PacketTypes.DISCONNECT)
    dprops.ReasonString = "bye"
    dprops.UserProperty = ("why", "maintenance")
    c.c.disconnect(reasoncode=PahoReasonCode(PacketTypes.DISCONNECT, identifier=0),
                   properties=dprops)
    d = event(watch, "dis/ev-normal")
    assert d["reason"] == "normal"
    assert d["sockname"] == f"127.0.0.1:{gw.mqtt_port}"
    assert d["peername"].startswith("127.0.0.1:")
    assert d["disconn_props"]["Reason-String"] == "bye"
    assert d["disconn_props"]["User-Property"] == {"why": "maintenance"}
    assert d["conn_props"]["User-Property"] == {"site": "north"}
    c.c.loop_stop()


def test_disconnect_with_will_is_named_after_its_code(gw: Gatewayd, watch: Client) -> None:
    c = Client(gw, "ev-will", version=5)
    c.c.disconnect(reasoncode=PahoReasonCode(PacketTypes.DISCONNECT, identifier=4))
    assert event(watch, "dis/ev-will")["reason"] == "disconnect_with_will_message"
    c.c.loop_stop()


def test_socket_closed_by_the_peer(gw: Gatewayd, watch: Client) -> None:
    s = raw_connect(gw, "ev-closed")
    s.close()
    d = event(watch, "dis/ev-closed")
    assert d["reason"] == "tcp_closed" and d["disconn_props"] == {}


def test_keepalive_timeout(gw: Gatewayd, watch: Client) -> None:
    s = raw_connect(gw, "ev-idle", keepalive=1)  # closed after 1.5 s of silence
    try:
        assert event(watch, "dis/ev-idle")["reason"] == "keepalive_timeout"
    finally:
        s.close()


def test_protocol_error(gw: Gatewayd, watch: Client) -> None:
    s = raw_connect(gw, "ev-bad")
    s.sendall(b"\xf0\x00")  # AUTH in MQTT 3.1.1: not a packet of that version
    try:
        reason = event(watch, "dis/ev-bad")["reason"]
    finally:
        s.close()
    assert reason in ("malformed_packet", "protocol_error"), reason


def test_takeover_and_discard(gw: Gatewayd, watch: Client) -> None:
    old = Client(gw, "ev-take", version=5, clean=False, session_expiry=60)
    new = Client(gw, "ev-take", version=5, clean=False, session_expiry=60)
    assert event(watch, "dis/ev-take")["reason"] == "takenover"
    newer = Client(gw, "ev-take", version=5, clean=True)
    assert event(watch, "dis/ev-take")["reason"] == "discarded"
    for c in (old, new, newer):
        c.close()


def test_kicked_through_the_api(gw: Gatewayd, watch: Client) -> None:
    c = Client(gw, "ev-kick")
    status, _, raw = gw.http("DELETE", f"{API}/clients/ev-kick")
    assert status == 200 and json.loads(raw)["result"] == "kicked", raw
    assert event(watch, "dis/ev-kick")["reason"] == "kicked"
    c.close()


def test_sub_props(gw: Gatewayd, watch: Client) -> None:
    c = Client(gw, "ev-sub", version=5)
    props = PahoProperties(PacketTypes.SUBSCRIBE)
    props.SubscriptionIdentifier = 7
    props.UserProperty = ("k", "v")
    c.subscribed.clear()
    c.c.subscribe("props/t", 1, properties=props)
    assert c.subscribed.wait(WAIT)
    s = event(watch, "sub/ev-sub")
    assert s["topic"] == "props/t"
    assert s["sub_props"]["Subscription-Identifier"] == 7
    assert s["sub_props"]["User-Property"] == {"k": "v"}
    c.close()


def _read_publish_id(s: socket.socket) -> int:
    """The packet id of the next PUBLISH (QoS 1) on ``s``, skipping other packets."""
    buf = b""
    while True:
        length = shift = 0
        i = 1
        while True:  # the remaining length (a variable byte integer)
            while len(buf) <= i:
                buf += s.recv(4096)
            length |= (buf[i] & 0x7F) << shift
            shift += 7
            i += 1
            if not buf[i - 1] & 0x80:
                break
        while len(buf) < i + length:
            buf += s.recv(4096)
        first, body, buf = buf[0], buf[i:i + length], buf[i + length:]
        if first >> 4 == 3:
            topic_len = int.from_bytes(body[:2], "big")
            return int.from_bytes(body[2 + topic_len:4 + topic_len], "big")


def test_puback_props(gw: Gatewayd, watch: Client) -> None:
    """A PUBACK's properties are message_acked's puback_props; without any, ``{}``."""
    s = socket.create_connection(("127.0.0.1", gw.mqtt_port), timeout=WAIT)
    s.sendall(encode(Connect("ev-ack", MQTT_5), MQTT_5))
    assert s.recv(64)[:1] == b"\x20"  # CONNACK
    s.sendall(encode(Subscribe(1, (Subscription("acked/t", 1),)), MQTT_5))
    assert s.recv(64)[:1] == b"\x90"  # SUBACK
    pub = Client(gw, "ev-ack-pub")
    pub.publish("acked/t", "one", qos=1)
    props = Properties(reason_string="seen", user_properties=(("k", "v"),))
    s.sendall(encode(PubAck(_read_publish_id(s), 0, props), MQTT_5))
    a = event(watch, "ack/ev-ack")
    assert (a["clientid"], a["qos"], a["payload"]) == ("ev-ack", 1, "one")
    assert a["puback_props"]["Reason-String"] == "seen"
    assert a["puback_props"]["User-Property"] == {"k": "v"}
    pub.publish("acked/t", "two", qos=1)
    s.sendall(encode(PubAck(_read_publish_id(s)), MQTT_5))
    a = event(watch, "ack/ev-ack")
    assert (a["payload"], a["puback_props"]) == ("two", {})
    pub.close()
    s.close()
