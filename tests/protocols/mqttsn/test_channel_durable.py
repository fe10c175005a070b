"""The MQTT-SN channel's QoS 2 across ``kill -9``, with a real gatewayd and its SQLite
file: the PUBLISH, its copy for an offline persistent MQTT subscriber and the
awaiting-PUBREL record commit together before the PUBREC leaves, so the same PUBLISH sent
again (DUP, same message id) after the restart is answered PUBREC and not delivered again;
the PUBREL then completes it. (The same pattern as the MQTT channel,
tests/hil/simulators/test_paho_async.py.)"""

from __future__ import annotations

import asyncio
import socket
import threading
from dataclasses import replace
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from protocols.mqttsn.client import MqttSnClient
from protocols.mqttsn.packets import PubComp, Publish, PubRec, PubRel
from tests.gateway.admin.gatewayd import Gatewayd
from tests.harness.gatewayd import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

WAIT = 15.0


def collector(gw: Gatewayd, got: list[bytes], end: threading.Event,
              subscribe: bool) -> mqtt.Client:
    up, subbed = threading.Event(), threading.Event()
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="collector", protocol=mqtt.MQTTv5)
    c.on_connect = lambda *a: up.set()
    c.on_subscribe = lambda *a: subbed.set()

    def on_message(c: mqtt.Client, u: object, m: mqtt.MQTTMessage) -> None:
        got.append(bytes(m.payload))
        if m.payload == b"end":
            end.set()
    c.on_message = on_message
    props = Properties(PacketTypes.CONNECT)
    props.SessionExpiryInterval = 3600
    c.connect("127.0.0.1", gw.mqtt_port, 30, clean_start=False, properties=props)
    c.loop_start()
    assert up.wait(WAIT), "collector: no CONNACK"
    if subscribe:
        c.subscribe("sn/#", 2)
        assert subbed.wait(WAIT), "collector: no SUBACK"
    return c


async def device(port: int) -> tuple[MqttSnClient, int]:
    d = MqttSnClient("127.0.0.1", port, "sn-dev", timeout=2.0)
    await d.start()
    await d.connect(duration=60, clean_session=False)
    return d, await d.register("sn/dev")


def test_qos2_publish_resent_after_kill_is_not_delivered_again(tmp_path: Path) -> None:
    sn_port = free_port(socket.SOCK_DGRAM)
    gw = Gatewayd(tmp_path / "gw", extra_env={
        "GATEWAY_GATEWAY__MQTTSN__LISTENERS__UDP__DEFAULT__BIND": f"127.0.0.1:{sn_port}",
    }).start()
    got: list[bytes] = []
    end = threading.Event()
    try:
        c = collector(gw, got, end, subscribe=True)
        c.disconnect()  # offline, persistent: its copy waits in the store's queue
        c.loop_stop()

        async def before() -> Publish:
            d, tid = await device(sn_port)
            p = Publish(tid, b"m1", 2, 77)
            rec = await d.request(p, lambda a: isinstance(a, PubRec) and a.msg_id == 77)
            assert isinstance(rec, PubRec)  # committed: PUBREC leaves after the commit
            d.close()
            return p

        p = asyncio.run(before())
        assert gw.proc is not None
        gw.proc.kill()
        gw.proc.wait()
        gw.start()
        c = collector(gw, got, end, subscribe=False)

        async def after() -> None:
            d, tid = await device(sn_port)
            again = replace(p, topic=tid, dup=True)
            rec = await d.request(again, lambda a: isinstance(a, PubRec) and a.msg_id == 77)
            assert isinstance(rec, PubRec)
            await d.request(PubRel(77), lambda a: isinstance(a, PubComp) and a.msg_id == 77)
            await d.publish("sn/dev", b"end", 2)
            d.close()

        asyncio.run(after())
        assert end.wait(WAIT), f"collector: no end mark, got {got}"
        c.disconnect()
        c.loop_stop()
        assert got == [b"m1", b"end"], got
    finally:
        gw.stop()
