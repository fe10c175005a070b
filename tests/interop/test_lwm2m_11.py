"""LwM2M 1.1 end to end over real UDP: our aiocoap device simulator as a 1.1 client that
has no TLV (SenML CBOR and JSON only, as a 1.1 wakaama build can be) against a real
gatewayd, through paho-mqtt: format negotiation and its fallback, the ``accept``
override, cancel-observe content, the composite operations in SenML CBOR, Send (CBOR and
JSON), and the reason of ``$SYS/.../disconnected``; and libcoap's ``coap-client``
(Debian libcoap3-bin) as a 1.1 device that registers, Sends and deregisters."""

from __future__ import annotations

import asyncio
import json
import queue
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Any

import cbor2
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from protocols.lwm2m import content
from protocols.lwm2m.client import Lwm2mClient
from tests.interop.clients import Lwm2mApp
from tests.interop.conftest import Gateway, free_port
from tests.interop.test_coap_lwm2m import TIMEOUT, lgw  # noqa: F401 (the gatewayd fixture)

CBOR, JSON = content.SENML_CBOR, content.SENML_JSON
COAP_CLIENT = shutil.which("coap-client-openssl") or shutil.which("coap-client")


class SysEvents:
    """``$SYS/brokers/+/gateway/lwm2m/clients/<ep>/disconnected`` of one endpoint (paho)."""

    def __init__(self, gw: Gateway, ep: str) -> None:
        self.q: queue.Queue[dict[str, Any]] = queue.Queue()
        subscribed: queue.Queue[object] = queue.Queue()
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"sys-{ep}")
        self.c.on_message = lambda c, u, m: self.q.put(json.loads(m.payload))
        self.c.on_subscribe = lambda *a: subscribed.put(a)
        self.c.connect(gw.host, gw.tcp)
        self.c.loop_start()
        self.c.subscribe(f"$SYS/brokers/+/gateway/lwm2m/clients/{ep}/disconnected", 0)
        subscribed.get(timeout=TIMEOUT)

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


async def _scenario(port: int, app: Lwm2mApp, ep: str) -> None:
    # a 1.1 device without TLV that lists no formats: asked SenML CBOR, which it lacks
    dev = Lwm2mClient(("127.0.0.1", port), ep, version="1.1", formats=(JSON,),
                      list_formats=False)
    await dev.start()
    nxt = app.next_async
    try:
        await dev.register()
        _, ev = await nxt()
        assert ev["msgType"] == "register" and ev["data"]["lwm2m"] == "1.1"

        roundtrip = app.roundtrip

        d = await roundtrip(1, "read", path="/3/0")
        assert d["code"] == "2.05" and {"path": "/3/0/9", "value": 100} in d["content"]
        assert dev.accepts == [CBOR, JSON]  # 4.06 to CBOR, then JSON
        d = await roundtrip(2, "read", path="/3/0/0")
        assert d["content"] == [{"path": "/3/0/0", "value": "gatewayd simulator"}]
        assert dev.accepts[-1] == JSON  # kept: asked first now
        d = await roundtrip(3, "read", path="/3/0", accept="tlv")
        assert d["code"] == "4.06" and dev.accepts[-1] == content.TLV
        d = await roundtrip(4, "read", path="/3/0/1", accept="text")
        assert d["content"] == [{"path": "/3/0/1", "value": "sim-1"}]
        await dev.deregister()
    finally:
        await dev.close()


def test_negotiation_and_fallback(lgw: tuple[Gateway, int], uid: str) -> None:  # noqa: F811
    gw, port = lgw
    ep = f"nego-{uid}"
    app = Lwm2mApp(gw, ep, timeout=TIMEOUT)
    try:
        asyncio.run(_scenario(port, app, ep))
    finally:
        app.close()


async def _cbor_device(port: int, app: Lwm2mApp, sys: SysEvents, ep: str) -> None:
    # wakaama's 1.1 client lists ct=112 and reads SenML CBOR (and JSON), no TLV here
    dev = Lwm2mClient(("127.0.0.1", port), ep, version="1.1", formats=(CBOR, JSON))
    await dev.start()
    nxt = app.next_async
    try:
        await dev.register()
        await nxt()

        roundtrip = app.roundtrip

        d = await roundtrip(1, "observe", path="/3/0/9")
        assert d["code"] == "2.05" and d["content"] == [{"path": "/3/0/9", "value": 100}]
        assert dev.accepts == [CBOR]
        dev.set("/3/0/9", 41)
        topic, note = await nxt()
        assert topic.endswith("/up/notify") and note["data"]["content"][0]["value"] == 41
        d = await roundtrip(2, "cancel-observe", path="/3/0/9")
        assert d["code"] == "2.05" and d["content"] == [{"path": "/3/0/9", "value": 41}]
        d = await roundtrip(3, "read-composite", paths=["/3/0/0", "/1/0/1"])
        assert d["code"] == "2.05" and d["paths"] == ["/3/0/0", "/1/0/1"]
        assert d["content"] == [{"path": "/1/0/1", "value": 300},
                                {"path": "/3/0/0", "value": "gatewayd simulator"}]
        d = await roundtrip(4, "write-composite", content=[
            {"path": "/3/0/14", "value": "+05:00"}, {"path": "/1/0/1", "value": 77}])
        assert d["code"] == "2.04" and dev.values["/1/0/1"] == 77
        d = await roundtrip(5, "observe-composite", paths=["/3/0/9"])
        assert d["code"] == "2.05" and d["content"] == [{"path": "/3/0/9", "value": 41}]
        dev.set("/3/0/9", 40)
        topic, note = await nxt()
        assert topic.endswith("/up/notify") and note["reqID"] == 5
        assert note["data"]["content"] == [{"path": "/3/0/9", "value": 40}]
        d = await roundtrip(6, "cancel-observe-composite", paths=["/3/0/9"])
        assert d["code"] == "2.05" and d["content"] == [{"path": "/3/0/9", "value": 40}]
        for cbor in (True, False):
            r = await dev.send(["/3/0/9", "/3/0/0"], cbor=cbor)
            assert str(r.code) == "2.04 Changed"
            topic, sent = await nxt()
            assert topic == f"lwm2m/{ep}/up/send" and sent["msgType"] == "send"
            assert sent["data"] == {"reqPath": "/dp", "content": [
                {"path": "/3/0/9", "value": 40},
                {"path": "/3/0/0", "value": "gatewayd simulator"}]}
        await dev.deregister()
        ev = await asyncio.to_thread(sys.q.get, timeout=TIMEOUT)
        assert ev["clientid"] == ep and ev["reason"] == "deregistered"
    finally:
        await dev.close()


def test_cbor_device_composite_send_and_disconnect_reason(
        lgw: tuple[Gateway, int], uid: str) -> None:  # noqa: F811
    gw, port = lgw
    ep = f"cbor-{uid}"
    app = Lwm2mApp(gw, ep, timeout=TIMEOUT)
    sys = SysEvents(gw, ep)
    try:
        asyncio.run(_cbor_device(port, app, sys, ep))
    finally:
        app.close()
        sys.close()


def _libcoap(port: int, local: int, method: str, path: str, *, fmt: int | None = None,
             payload: bytes | None = None, tmp: Path | None = None) -> str:
    """One request of libcoap's coap-client from local port ``local`` (so every request
    comes from the same device address); its output (the response code at -v 6)."""
    assert COAP_CLIENT is not None
    cmd = [COAP_CLIENT, "-m", method, "-p", str(local), "-B", "10", "-v", "6"]
    if fmt is not None:
        cmd += ["-t", str(fmt)]
    if payload is not None:
        assert tmp is not None
        body = tmp / f"body-{local}"
        body.write_bytes(payload)
        cmd += ["-f", str(body)]
    cmd.append(f"coap://127.0.0.1:{port}{path}")
    out = subprocess.run(cmd, capture_output=True, timeout=30, check=False)
    return (out.stdout + out.stderr).decode(errors="replace")


@pytest.mark.skipif(COAP_CLIENT is None, reason="libcoap3-bin not installed")
def test_libcoap_registers_and_sends(lgw: tuple[Gateway, int], uid: str,  # noqa: F811
                                     tmp_path: Path) -> None:
    """A third-party CoAP stack (libcoap) as a 1.1 device: register, Send in SenML CBOR
    and JSON, deregister; the records arrive on up/send, the reason on $SYS."""
    gw, port = lgw
    ep = f"libcoap-{uid}"
    local = free_port(socket.SOCK_DGRAM)
    app = Lwm2mApp(gw, ep, timeout=TIMEOUT)
    sys = SysEvents(gw, ep)
    try:
        links = b'</>;rt="oma.lwm2m";ct="110 112",</3/0>'
        out = _libcoap(port, local, "post", f"/rd?ep={ep}&lt=60&lwm2m=1.1&b=U",
                       fmt=content.LINK_FORMAT, payload=links, tmp=tmp_path)
        assert "2.01" in out, out
        _, ev = app.next()
        assert ev["msgType"] == "register" and ev["data"]["lwm2m"] == "1.1"
        cbor = cbor2.dumps([{-2: "/3/0/", 0: "9", 2: 42}, {0: "0", 3: "libcoap"}])
        out = _libcoap(port, local, "post", "/dp", fmt=CBOR, payload=cbor, tmp=tmp_path)
        assert "2.04" in out, out
        topic, sent = app.next()
        assert topic == f"lwm2m/{ep}/up/send" and sent["data"]["content"] == [
            {"path": "/3/0/9", "value": 42}, {"path": "/3/0/0", "value": "libcoap"}]
        out = _libcoap(port, local, "post", "/dp", fmt=JSON,
                       payload=b'[{"n":"/3/0/9","v":43,"t":1700000000}]', tmp=tmp_path)
        assert "2.04" in out, out
        _, sent = app.next()
        assert sent["data"]["content"] == [{"path": "/3/0/9", "value": 43,
                                            "time": 1700000000}]
        out = _libcoap(port, local, "post", "/dp", fmt=content.TLV, payload=b"\xc1\x09\x2a",
                       tmp=tmp_path)
        assert "4.15" in out, out  # Send is SenML only
        out = _libcoap(port, local, "delete", f"/rd/{ep}")
        assert "2.02" in out, out
        ev = sys.q.get(timeout=TIMEOUT)
        assert ev["reason"] == "deregistered" and ev["protocol"] == "lwm2m"
    finally:
        app.close()
        sys.close()
