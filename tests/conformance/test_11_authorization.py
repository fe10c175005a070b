"""Authorization rules from configuration: denied SUBSCRIBE -> 0x80 (3.1.1) / 0x87 (5.0).

One broker for the module, started with the rules below through the environment (the same
TOML inline array a config file would hold). Under mosquitto the conftest translates them
for the dynamic-security plugin (its plain ACL file cannot refuse a SUBSCRIBE).
"""

from __future__ import annotations

import pytest

from . import raw
from .clients import MQTTv5, MQTTv311, PahoClient
from .raw import V5, V311, RawClient

RULES = (
    '[{permission="deny", action="subscribe", topics=["test/nosubscribe"]},'
    ' {permission="deny", action="publish", topics=["ro/#"]},'
    ' {permission="allow", action="subscribe", topics=["users/${clientid}/#"]},'
    ' {permission="deny", action="subscribe", topics=["users/#"]}]'
)


@pytest.fixture(scope="module")
def authz_broker(module_broker_factory):
    return module_broker_factory(GATEWAY_AUTHORIZATION__RULES=RULES)


def test_denied_subscribe_v311_gets_0x80(authz_broker, uid):
    with RawClient(authz_broker, V311) as c:
        c.connect(f"c-{uid}")
        c.send(raw.subscribe(5, "test/nosubscribe", 1))
        c.expect_bytes("SUBACK", raw.suback(5, 0x80))
        c.ping()  # the connection stays usable
        c.disconnect()


def test_denied_subscribe_v5_gets_0x87(authz_broker, uid):
    with RawClient(authz_broker, V5) as c:
        c.connect(f"c-{uid}")
        c.send(raw.subscribe(6, "test/nosubscribe", 1, proto=V5))
        ack = c.expect("SUBACK")
        assert ack.mid == 6 and ack.codes == [0x87], ack
        c.ping()
        c.disconnect()


@pytest.mark.parametrize("proto", [V311, V5], ids=["3.1.1", "5.0"])
def test_mixed_subscribe_grants_the_rest(authz_broker, uid, proto):
    denied = 0x87 if proto == V5 else 0x80
    with RawClient(authz_broker, proto) as c:
        c.connect(f"c-{uid}")
        c.subscribe(
            [(f"{uid}/a", 1), ("test/nosubscribe", 2), (f"{uid}/b", 2)], codes=[1, denied, 2]
        )
        c.publish(f"{uid}/b", b"ok", qos=2)
        c.receive(f"{uid}/b", b"ok", qos=2)
        c.disconnect()


def test_denied_subscription_receives_nothing(authz_broker, uid):
    with RawClient(authz_broker, V311) as c, RawClient(authz_broker) as pub:
        c.connect(f"c-{uid}")
        c.subscribe([("test/nosubscribe", 1), (f"{uid}/control", 1)], codes=[0x80, 1])
        pub.connect(f"p-{uid}")
        pub.publish("test/nosubscribe", b"secret", qos=1)
        pub.publish(f"{uid}/control", b"control", qos=1)
        got = c.receive()
        assert got.topic == f"{uid}/control", f"denied subscription delivered {got!r}"
        c.disconnect()
        pub.disconnect()


@pytest.mark.parametrize(
    ("protocol", "denied"), [(MQTTv311, 0x80), (MQTTv5, 0x87)], ids=["3.1.1", "5.0"]
)
def test_paho_sees_refusal(authz_broker, uid, protocol, denied):
    with PahoClient(authz_broker, protocol=protocol, client_id=f"p-{uid}") as c:
        c.connect()
        (code,) = c.subscribe("test/nosubscribe", 1)
        assert code == denied, code  # paho's ReasonCode compares equal to its value


def test_publish_to_subscribe_denied_topic_allowed(authz_broker, uid):
    with RawClient(authz_broker, V5) as c:
        c.connect(f"c-{uid}")
        c.send(raw.publish("test/nosubscribe", b"x", qos=1, mid=1, proto=V5))
        ack = c.expect("PUBACK")
        assert ack.reason in (0x00, 0x10), ack
        c.disconnect()


def test_denied_publish_v5_gets_0x87_and_is_dropped(authz_broker, uid):
    with RawClient(authz_broker, V5) as c, RawClient(authz_broker, V311) as legacy:
        c.connect(f"c-{uid}")
        c.subscribe([("ro/#", 1), (f"{uid}/control", 1)], codes=[1, 1])
        c.send(raw.publish("ro/x", b"nope", qos=1, mid=3, proto=V5))
        ack = c.expect("PUBACK")
        assert ack.mid == 3 and ack.reason == 0x87, ack
        legacy.connect(f"l-{uid}")
        legacy.send(raw.publish("ro/y", b"nope", qos=1, mid=4))
        legacy.expect_bytes("PUBACK", raw.puback(4))  # 3.1.1 cannot say no: acked, dropped
        legacy.publish(f"{uid}/control", b"control", qos=1)
        got = c.receive()
        assert got.topic == f"{uid}/control", f"denied publish delivered {got!r}"
        c.disconnect()
        legacy.disconnect()


# mosquitto's dynamic-security plugin (2.0.11) does not expand %c in subscribe patterns.
@pytest.mark.gateway_only
def test_clientid_placeholder_rules(authz_broker, uid):
    cid = f"dev-{uid}"
    with RawClient(authz_broker, V5) as c:
        c.connect(cid)
        c.subscribe([(f"users/{cid}/#", 1), (f"users/other-{uid}/#", 1)], codes=[1, 0x87])
        c.disconnect()
