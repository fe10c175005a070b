"""The extensions are the core's, so they hold for every front-end that maps to MQTT:
a paho client over WebSocket is auto-subscribed and gets a delayed message; an MQTT-SN
client (our client over UDP) is auto-subscribed, its delayed and rewritten publishes
arrive, its exclusive subscription is refused; a CoAP client (aiocoap) publishes through
``$delayed/`` and a rewrite rule."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Iterator

import pytest
from aiocoap import POST, Context
from aiocoap import Message as CoapMessage

from protocols.mqttsn.client import MqttSnClient, Refused
from tests.conformance.clients import MosquittoSub, mosquitto_pub
from tests.gateway.admin.gatewayd import WAIT, Client, q
from tests.gateway.ext.conftest import ExtGatewayd, make
from tests.harness.gatewayd import free_port

pytestmark = pytest.mark.ext


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ExtGatewayd]:
    coap = free_port(socket.SOCK_DGRAM)
    ws = free_port()
    g = make(tmp_path_factory.mktemp("ext-fe"),
             {"GATEWAY_GATEWAY__COAP__LISTENERS__UDP__DEFAULT__BIND": f"127.0.0.1:{coap}",
              "GATEWAY_LISTENERS__WS__DEFAULT__BIND": f"127.0.0.1:{ws}"})
    g.coap_port = coap  # type: ignore[attr-defined]
    g.ws_port = ws  # type: ignore[attr-defined]
    g.start()
    yield g
    g.stop()


def test_mqttsn_client_gets_auto_subscribe_delayed_rewrite_and_exclusive(
    gw: ExtGatewayd,
) -> None:
    holder = Client(gw, "sn-holder", version=5).subscribe("$exclusive/sn/excl", 0)
    sub = MosquittoSub(("127.0.0.1", gw.mqtt_port), "sn/#", qos=1).start()

    async def run() -> None:
        async with MqttSnClient("127.0.0.1", gw.mqttsn_port, "sn-dev", timeout=3) as c:
            await c.connect(duration=60)
            # subscribed by the broker: cmd/${clientid}
            subs = gw.get(f"/api/v5/clients/{q('sn-dev')}/subscriptions")
            assert "cmd/sn-dev" in {s["topic"] for s in subs}
            await asyncio.to_thread(
                mosquitto_pub, ("127.0.0.1", gw.mqtt_port), "cmd/sn-dev", "reboot", qos=1)
            m = await c.next_message(WAIT)
            assert (m.topic, m.payload) == ("cmd/sn-dev", b"reboot")
            # delayed publish from MQTT-SN
            t0 = time.monotonic()
            await c.publish("$delayed/1/sn/later", b"d", 1)
            got = await asyncio.to_thread(sub.get, WAIT)
            assert (got.topic, got.payload) == ("sn/later", "d")
            assert time.monotonic() - t0 >= 0.9
            # rewrite from MQTT-SN: x/# -> y/#
            await c.subscribe("y/sn", 1)
            await c.publish("x/sn", b"r", 1)
            m = await c.next_message(WAIT)
            assert (m.topic, m.payload) == ("y/sn", b"r")
            # exclusive: held by the MQTT client, refused to MQTT-SN
            with pytest.raises(Refused):
                await c.subscribe("$exclusive/sn/excl", 0)
            await c.disconnect()

    try:
        asyncio.run(run())
    finally:
        sub.stop()
        holder.close()


def test_coap_publish_through_delayed_and_rewrite(gw: ExtGatewayd) -> None:
    port = gw.coap_port  # type: ignore[attr-defined]
    watcher = Client(gw, "coap-watch", version=5).subscribe("y/coap/#", 1)

    async def run() -> None:
        ctx = await Context.create_client_context()
        try:
            base = f"coap://127.0.0.1:{port}/ps"
            r = await ctx.request(CoapMessage(
                code=POST, uri=f"{base}/$delayed/1/x/coap/late?clientid=coap-1&qos=1",
                payload=b"later")).response
            assert r.code.is_successful(), r
            r = await ctx.request(CoapMessage(
                code=POST, uri=f"{base}/x/coap/now?clientid=coap-1&qos=1",
                payload=b"now")).response
            assert r.code.is_successful(), r
        finally:
            await ctx.shutdown()

    try:
        t0 = time.monotonic()
        asyncio.run(run())
        first = watcher.next_message()
        assert (first.topic, first.payload) == ("y/coap/now", b"now")
        second = watcher.next_message()
        assert (second.topic, second.payload) == ("y/coap/late", b"later")
        assert time.monotonic() - t0 >= 0.9
    finally:
        watcher.close()



def test_websocket_client_is_auto_subscribed_and_gets_a_delayed_message(gw: ExtGatewayd) -> None:
    import queue
    import threading

    import paho.mqtt.client as mqtt
    from paho.mqtt.enums import CallbackAPIVersion

    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="ws-dev", protocol=mqtt.MQTTv5,
                    transport="websockets")
    c.ws_set_options(path="/mqtt")
    got: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
    connected = threading.Event()
    c.on_connect = lambda cl, u, f, rc, p: connected.set()
    c.on_message = lambda cl, u, m: got.put(m)
    c.connect("127.0.0.1", gw.ws_port)  # type: ignore[attr-defined]
    c.loop_start()
    try:
        assert connected.wait(WAIT)
        subs = gw.get(f"/api/v5/clients/{q('ws-dev')}/subscriptions")
        assert "cmd/ws-dev" in {s["topic"] for s in subs}
        mosquitto_pub(("127.0.0.1", gw.mqtt_port), "$delayed/1/cmd/ws-dev", "w", qos=1)
        m = got.get(timeout=WAIT)
        assert (m.topic, m.payload) == ("cmd/ws-dev", b"w")
    finally:
        c.disconnect()
        c.loop_stop()
