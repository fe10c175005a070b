"""Mixed protocol versions on one broker, with paho-mqtt and the mosquitto command-line
clients as independent implementations (``interop`` marks those that need the CLIs).
"""

from __future__ import annotations

import signal

import pytest
from paho.mqtt.packettypes import PacketTypes

from . import raw
from .clients import MosquittoSub, MQTTv5, MQTTv311, PahoClient, mosquitto_pub, v5_properties
from .raw import V5, V31, V311, RawClient

VERSIONS = [(V31, "3.1"), (V311, "3.1.1"), (V5, "5.0")]
PAIRS = [(a, b) for a in VERSIONS for b in VERSIONS if a != b]


@pytest.mark.parametrize(
    ("pub_v", "sub_v"), [(a[0], b[0]) for a, b in PAIRS], ids=[f"{a[1]}->{b[1]}" for a, b in PAIRS]
)
@pytest.mark.parametrize("qos", [1, 2])
def test_raw_cross_version_delivery(broker, uid, pub_v, sub_v, qos):
    """Each subscriber gets a PUBLISH encoded for its own version (checked byte-exact for
    3.x: no properties leak into a 3.1.1 packet)."""
    topic = f"{uid}/x"
    with RawClient(broker, pub_v) as pub, RawClient(broker, sub_v) as sub:
        sub.connect(f"s-{uid}")
        sub.subscribe(topic, qos)
        pub.connect(f"p-{uid}")
        props = [(raw.USER_PROPERTY, ("k", "v")), (raw.CONTENT_TYPE, "text/plain")]
        pub.publish(topic, b"cross", qos=qos, properties=props if pub_v == V5 else ())
        got = sub.expect_publish(topic, b"cross", qos=qos)
        if sub_v != V5:
            assert got.raw == raw.publish(topic, b"cross", qos=qos, mid=got.mid), got
        elif pub_v == V5:
            assert got.props.user == [("k", "v")]
            assert got.props.get(raw.CONTENT_TYPE) == "text/plain"
        sub.ack(got)
        sub.disconnect()
        pub.disconnect()


def test_v311_retained_seen_by_v5_and_back(broker, uid):
    t1, t2 = f"{uid}/r311", f"{uid}/r5"
    with RawClient(broker, V311) as a, RawClient(broker, V5) as b:
        a.connect(f"a-{uid}")
        b.connect(f"b-{uid}")
        a.publish(t1, b"from311", qos=1, retain=True)
        b.publish(t2, b"from5", qos=1, retain=True, properties=[(raw.USER_PROPERTY, ("x", "y"))])
        b.subscribe(t1, 1)
        b.receive(t1, b"from311", retain=True)
        a.subscribe(t2, 1)
        got = a.receive(t2, b"from5", retain=True)
        assert got.raw == raw.publish(t2, b"from5", qos=1, mid=got.mid, retain=True)
        a.publish(t1, b"", qos=1, retain=True)
        b.receive(t1, b"", retain=False)
        b.publish(t2, b"", qos=1, retain=True)
        a.receive(t2, b"", retain=False)
        a.disconnect()
        b.disconnect()


def test_shared_group_with_mixed_versions(broker, uid):
    topic = f"{uid}/mix"
    members = [RawClient(broker, V311), RawClient(broker, V5)]
    for i, m in enumerate(members):
        m.connect(f"m{i}-{uid}")
        m.subscribe(f"$share/mixed/{topic}", 1)
    with RawClient(broker) as pub:
        pub.connect(f"p-{uid}")
        for i in range(6):
            pub.publish(topic, str(i).encode(), qos=1)
        got = raw.collect(members, 6)
        assert sorted(p.payload for _, p in got) == [str(i).encode() for i in range(6)]
        pub.disconnect()
    for m in members:
        m.disconnect()


@pytest.mark.parametrize(
    ("pub_proto", "sub_proto"),
    [(MQTTv311, MQTTv5), (MQTTv5, MQTTv311)],
    ids=["paho311->paho5", "paho5->paho311"],
)
def test_paho_cross_version(broker, uid, pub_proto, sub_proto):
    topic = f"{uid}/paho"
    with (
        PahoClient(broker, protocol=sub_proto, client_id=f"s-{uid}") as sub,
        PahoClient(broker, protocol=pub_proto, client_id=f"p-{uid}") as pub,
    ):
        sub.connect()
        pub.connect()
        sub.subscribe(topic, 2)
        props = None
        if pub_proto == MQTTv5:
            props = v5_properties(PacketTypes.PUBLISH, UserProperty=[("k", "v")])
        pub.publish(topic, b"mixed", qos=2, properties=props)
        msg = sub.get()
        assert (msg.topic, msg.payload, msg.qos) == (topic, b"mixed", 2)
        if sub_proto == MQTTv5:
            assert not getattr(msg.properties, "UserProperty", None)


@pytest.mark.interop
@pytest.mark.parametrize("version", ["mqttv31", "mqttv311", "mqttv5"])
@pytest.mark.parametrize("paho_proto", [MQTTv311, MQTTv5], ids=["paho311", "paho5"])
def test_mosquitto_pub_to_paho(broker, uid, version, paho_proto):
    topic = f"{uid}/cli"
    with PahoClient(broker, protocol=paho_proto, client_id=f"s-{uid}") as sub:
        sub.connect()
        sub.subscribe(topic, 1)
        extra = ["-D", "publish", "user-property", "origin", "cli"] if version == "mqttv5" else []
        mosquitto_pub(broker, topic, "from-cli", version=version, qos=1, extra=extra)
        msg = sub.get()
        assert (msg.topic, msg.payload, msg.qos) == (topic, b"from-cli", 1)
        if paho_proto == MQTTv5 and version == "mqttv5":
            assert getattr(msg.properties, "UserProperty", None) == [("origin", "cli")]


@pytest.mark.interop
@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
@pytest.mark.parametrize("paho_proto", [MQTTv311, MQTTv5], ids=["paho311", "paho5"])
def test_paho_to_mosquitto_sub(broker, uid, version, paho_proto):
    topic = f"{uid}/cli"
    with (
        MosquittoSub(broker, topic, version=version, qos=2) as sub,
        PahoClient(broker, protocol=paho_proto, client_id=f"p-{uid}") as pub,
    ):
        pub.connect()
        props = None
        if paho_proto == MQTTv5:
            props = v5_properties(PacketTypes.PUBLISH, UserProperty=[("who", "paho")])
        pub.publish(topic, b"to-cli", qos=2, properties=props)
        msg = sub.get()
        assert (msg.topic, msg.payload, msg.qos, msg.retain) == (topic, "to-cli", 2, False)
        if version == "mqttv5" and paho_proto == MQTTv5:
            assert msg.user_property == "who:paho"


@pytest.mark.interop
def test_mosquitto_cli_retained_across_versions(broker, uid):
    topic = f"{uid}/cliret"
    mosquitto_pub(broker, topic, "kept", version="mqttv31", qos=1, retain=True)
    with MosquittoSub(broker, topic, version="mqttv5", qos=1) as sub:
        msg = sub.get()
        assert (msg.payload, msg.retain) == ("kept", True)
    mosquitto_pub(broker, topic, None, version="mqttv5", qos=1, retain=True)


@pytest.mark.interop
@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_will_of_killed_mosquitto_sub(broker, uid, version):
    """A real client killed with SIGKILL: its will reaches a subscriber of the other version."""
    will_topic = f"{uid}/will"
    watcher_proto = V5 if version == "mqttv311" else V311
    with RawClient(broker, watcher_proto) as watcher:
        watcher.connect(f"w-{uid}")
        watcher.subscribe(will_topic, 1)
        sub = MosquittoSub(
            broker,
            f"{uid}/ignored",
            version=version,
            extra=["--will-topic", will_topic, "--will-payload", "died", "--will-qos", "1"],
        ).start()
        assert sub.proc is not None
        sub.proc.send_signal(signal.SIGKILL)
        sub.proc.wait(timeout=5)
        watcher.receive(will_topic, b"died", qos=1)
        watcher.disconnect()
