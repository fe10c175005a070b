"""Authentication and authorization against a real gatewayd over loopback sockets, with
independent clients (paho-mqtt, mosquitto_pub), gatewayctl, a real HTTP service, and our
own codec for SCRAM (paho does not speak it)."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from gateway.security.scram import ScramClient
from protocols.mqtt.packets import (
    MQTT_5,
    Auth,
    ConnAck,
    Connect,
    Properties,
    PubAck,
    Publish,
    SubAck,
    Subscribe,
    Subscription,
)
from tests.gateway.auth.live import TIMEOUT, Gatewayd, RawClient, http_service

FAST = "4096"  # iterations for users the tests add: keeps gatewayctl and CONNECT quick
SCRAM = "SCRAM-SHA-256"


@pytest.fixture
def gatewayd(tmp_path: Path) -> Iterator[Gatewayd]:
    g = Gatewayd(tmp_path).start()
    yield g
    g.stop()


def add_user(g: Gatewayd, user: str, password: str, *extra: str) -> None:
    r = g.ctl("users", "add", user, "--password", password, "--iterations", FAST, *extra)
    assert r.returncode == 0, r.stderr


def paho_connect(
    addr: tuple[str, int], user: str | None, password: str | None, protocol: int = mqtt.MQTTv5
) -> int:
    """CONNACK reason code (MQTT 5) or return code (3.1.1) that paho saw."""
    done = threading.Event()
    got: list[int] = []

    def on_connect(client: Any, userdata: Any, flags: Any, reason_code: Any, props: Any) -> None:
        got.append(reason_code.value if hasattr(reason_code, "value") else int(reason_code))
        done.set()

    def on_disconnect(client: Any, userdata: Any, flags: Any, rc: Any, props: Any) -> None:
        done.set()

    c = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=protocol)
    c.on_connect = on_connect
    c.on_disconnect = on_disconnect
    if user is not None:
        c.username_pw_set(user, password)
    c.connect(*addr)
    c.loop_start()
    try:
        assert done.wait(TIMEOUT), "no CONNACK"
    finally:
        c.disconnect()
        c.loop_stop()
    return got[0]


def raw_v311_connack(addr: tuple[str, int], user: str, password: bytes) -> int:
    with RawClient(addr, level=4) as c:
        c.send(Connect("raw311", protocol_level=4, username=user, password=password))
        ack = c.recv()
    assert isinstance(ack, ConnAck)
    return ack.reason_code


# ------------------------------------------------------------------ built-in database


def test_password_right_and_wrong(gatewayd: Gatewayd) -> None:
    add_user(gatewayd, "alice", "wonderland")
    assert paho_connect(gatewayd.addr, "alice", "wrong") == 0x86
    assert paho_connect(gatewayd.addr, "alice", "wonderland") == 0
    assert raw_v311_connack(gatewayd.addr, "alice", b"wrong") == 4
    assert raw_v311_connack(gatewayd.addr, "alice", b"wonderland") == 0
    assert paho_connect(gatewayd.addr, None, None) == 0x87  # anonymous is off


@pytest.mark.interop
@pytest.mark.skipif(not shutil.which("mosquitto_pub"), reason="mosquitto_pub not installed")
def test_mosquitto_pub_v311(gatewayd: Gatewayd) -> None:
    add_user(gatewayd, "alice", "wonderland")
    base = ["mosquitto_pub", "-h", "127.0.0.1", "-p", str(gatewayd.port), "-V", "mqttv311"]
    base += ["-t", "t", "-m", "x", "-u", "alice"]
    bad = subprocess.run([*base, "-P", "wrong"], capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0
    assert "bad user name or password" in (bad.stdout + bad.stderr).lower()
    good = subprocess.run([*base, "-P", "wonderland"], capture_output=True, text=True, timeout=30)
    assert good.returncode == 0, good.stderr


def test_user_added_while_running_works_without_restart(gatewayd: Gatewayd) -> None:
    assert paho_connect(gatewayd.addr, "late", "pw") == 0x86  # nobody knows "late" yet
    add_user(gatewayd, "late", "pw")
    assert paho_connect(gatewayd.addr, "late", "pw") == 0
    r = gatewayd.ctl("users", "passwd", "late", "--password", "new")
    assert r.returncode == 0, r.stderr
    assert paho_connect(gatewayd.addr, "late", "pw") == 0x86
    assert paho_connect(gatewayd.addr, "late", "new") == 0
    assert gatewayd.ctl("users", "delete", "late").returncode == 0
    assert paho_connect(gatewayd.addr, "late", "new") == 0x86


def test_per_user_rules_and_superuser(tmp_path: Path) -> None:
    g = Gatewayd(
        tmp_path,
        GATEWAY_AUTHORIZATION__RULES='[{permission="deny", action="publish", topics=["locked/#"]}]',
    ).start()
    try:
        add_user(g, "alice", "pw")
        add_user(g, "root", "pw", "--superuser")
        assert g.ctl("users", "deny", "alice", "publish", "alice/private/#").returncode == 0
        assert g.ctl("users", "allow", "alice", "publish", "locked/alice").returncode == 0

        def publish(user: str, topic: str) -> int:
            with RawClient(g.addr) as c:
                c.send(Connect(f"c-{user}", protocol_level=MQTT_5, username=user, password=b"pw"))
                ack = c.recv()
                assert isinstance(ack, ConnAck) and ack.reason_code == 0
                c.send(Publish(topic, b"x", qos=1, packet_id=1))
                puback = c.recv()
                assert isinstance(puback, PubAck)
                return puback.reason_code

        assert publish("alice", "alice/private/x") == 0x87  # her own deny rule
        assert publish("alice", "locked/alice") in (0, 0x10)  # her allow beats the file
        assert publish("alice", "locked/other") == 0x87  # the rules file
        assert publish("root", "locked/other") in (0, 0x10)  # superuser
        assert publish("root", "alice/private/x") in (0, 0x10)
    finally:
        g.stop()


# ------------------------------------------------------------------ HTTP service


async def _answer(body: dict[str, Any]) -> tuple[int, Any]:
    user = body["username"]
    if user == "hang":
        await asyncio.Event().wait()  # never answers: the gateway's timeout decides
    if user == "good" and body["password"] == "pw":
        return 200, {"result": "allow", "is_superuser": False}
    if user == "nobody":
        return 200, {"result": "ignore"}
    if user == "gone":
        return 404, None
    return 200, {"result": "deny"}


@pytest.mark.parametrize("on_error, timeout_code", [("deny", 0x88), ("ignore", 0x86)])
def test_http_backend(tmp_path: Path, on_error: str, timeout_code: int) -> None:
    with http_service(_answer) as (url, received):
        g = Gatewayd(
            tmp_path,
            GATEWAY_AUTHENTICATION__HTTP__ENABLE="true",
            GATEWAY_AUTHENTICATION__HTTP__URL=url,
            GATEWAY_AUTHENTICATION__HTTP__REQUEST_TIMEOUT="500ms",
            GATEWAY_AUTHENTICATION__HTTP__ON_ERROR=on_error,
        ).start()
        try:
            assert paho_connect(g.addr, "good", "pw") == 0
            assert received[-1] == {
                "clientid": received[-1]["clientid"],
                "username": "good",
                "password": "pw",
                "peerhost": "127.0.0.1",
                "protocol": "mqtt",
            }
            assert paho_connect(g.addr, "good", "bad") == 0x86  # deny
            assert paho_connect(g.addr, "nobody", "x") == 0x86  # ignore, then no anonymous
            assert paho_connect(g.addr, "gone", "x") == 0x86  # 404 is ignore
            assert raw_v311_connack(g.addr, "good", b"bad") == 4
            n = len(received)
            assert paho_connect(g.addr, "hang", "x") == timeout_code
            assert len(received) == n + 1
            # the built-in database is asked first: a local user never reaches HTTP
            add_user(g, "local", "pw")
            n = len(received)
            assert paho_connect(g.addr, "local", "pw") == 0
            assert len(received) == n
        finally:
            g.stop()


def test_http_backend_unreachable(tmp_path: Path) -> None:
    from tests.gateway.auth.live import free_port

    g = Gatewayd(
        tmp_path,
        GATEWAY_AUTHENTICATION__HTTP__ENABLE="true",
        GATEWAY_AUTHENTICATION__HTTP__URL=f"http://127.0.0.1:{free_port()}/auth",
        GATEWAY_AUTHENTICATION__HTTP__ON_ERROR="deny",
    ).start()
    try:
        assert paho_connect(g.addr, "someone", "pw") == 0x88
        assert raw_v311_connack(g.addr, "someone", b"pw") == 3  # server unavailable
    finally:
        g.stop()


# ------------------------------------------------------------------ SCRAM-SHA-256


def scram(
    addr: tuple[str, int], user: str, password: str
) -> tuple[ConnAck, ScramClient, RawClient]:
    c = RawClient(addr)
    client = ScramClient(user, password)
    props = Properties(authentication_method=SCRAM, authentication_data=client.first())
    c.send(Connect(f"scram-{user}", protocol_level=MQTT_5, properties=props))
    challenge = c.recv()
    assert isinstance(challenge, Auth) and challenge.reason_code == 0x18
    final = client.final(challenge.properties.authentication_data or b"")
    c.send(Auth(0x18, Properties(authentication_method=SCRAM, authentication_data=final)))
    ack = c.recv()
    assert isinstance(ack, ConnAck)
    return ack, client, c


def test_scram_success_and_failure(gatewayd: Gatewayd) -> None:
    add_user(gatewayd, "alice", "wonderland")
    ack, client, c = scram(gatewayd.addr, "alice", "wonderland")
    with c:
        assert ack.reason_code == 0 and ack.properties.authentication_method == SCRAM
        client.verify(ack.properties.authentication_data or b"")  # mutual: server proven
        c.send(Subscribe(1, (Subscription("t", 0),)))
        assert isinstance(c.recv(), SubAck)
        # re-authentication on the live connection
        again = ScramClient("alice", "wonderland")
        first = again.first()
        c.send(Auth(0x19, Properties(authentication_method=SCRAM, authentication_data=first)))
        challenge = c.recv()
        assert isinstance(challenge, Auth) and challenge.reason_code == 0x18
        final = again.final(challenge.properties.authentication_data or b"")
        c.send(Auth(0x18, Properties(authentication_method=SCRAM, authentication_data=final)))
        done = c.recv()
        assert isinstance(done, Auth) and done.reason_code == 0
        again.verify(done.properties.authentication_data or b"")
    bad, _, c = scram(gatewayd.addr, "alice", "wrong")
    with c:
        assert bad.reason_code == 0x86
        assert c.recv() is None  # closed
    unknown, _, c = scram(gatewayd.addr, "mallory", "x")
    c.close()
    assert unknown.reason_code == 0x86


def test_unsupported_authentication_method(gatewayd: Gatewayd) -> None:
    with RawClient(gatewayd.addr) as c:
        props = Properties(authentication_method="SCRAM-SHA-1", authentication_data=b"n,,n=a,r=b")
        c.send(Connect("m", protocol_level=MQTT_5, properties=props))
        ack = c.recv()
        assert isinstance(ack, ConnAck) and ack.reason_code == 0x8C
