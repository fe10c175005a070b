"""LwM2M end to end: our aiocoap device simulator (``protocols/lwm2m/client.py``) against a
real gatewayd, commands and answers through paho-mqtt. Every command round-trips."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator

import pytest

from protocols.lwm2m.client import Lwm2mClient
from tests.interop.clients import Lwm2mApp
from tests.interop.conftest import Gateway, free_port, start_gateway, stop, wait_lwm2m

TIMEOUT = 10.0


@pytest.fixture(scope="module")
def lgw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gateway, int]]:
    port = free_port(socket.SOCK_DGRAM)
    proc, gw = start_gateway(
        tmp_path_factory.mktemp("gatewayd-lwm2m"),
        GATEWAY_GATEWAY__LWM2M__LISTENERS__UDP__DEFAULT__BIND=f"127.0.0.1:{port}",
        GATEWAY_GATEWAY__LWM2M__QMODE_TIME_WINDOW="2s",
    )
    wait_lwm2m(port)
    try:
        yield gw, port
    finally:
        stop(proc)


async def _scenario(gw: Gateway, port: int, app: Lwm2mApp, ep: str, senml: bool) -> None:
    dev = Lwm2mClient(("127.0.0.1", port), ep, senml=senml)
    await dev.start()
    nxt = app.next_async
    try:
        r = await dev.register()
        assert str(r.code) == "2.01 Created" and dev.location == ("rd", ep)
        topic, ev = await nxt()
        assert topic == f"lwm2m/{ep}/up/resp" and ev["msgType"] == "register"
        assert "/3/0" in ev["data"]["objectList"]

        roundtrip = app.roundtrip

        d = await roundtrip(1, "read", path="/3/0/0")
        assert d["code"] == "2.05"
        assert d["content"] == [{"path": "/3/0/0", "value": "gatewayd simulator"}]
        d = await roundtrip(2, "read", path="/3/0")
        assert {"path": "/3/0/9", "value": 100} in d["content"]
        assert {"path": "/3/0/7/1", "value": 5000} in d["content"]
        d = await roundtrip(3, "discover", path="/3/0")
        assert "</3/0/9>" in d["content"]
        d = await roundtrip(4, "write", path="/3/0/14", type="String", value="+02:00")
        assert d["code"] == "2.04" and dev.values["/3/0/14"] == "+02:00"
        d = await roundtrip(5, "write", basePath="/1/0",
                            content=[{"path": "1", "value": 600}, {"path": "7", "value": "UQ"}])
        assert d["code"] == "2.04" and dev.values["/1/0/1"] == 600
        d = await roundtrip(6, "write-attr", path="/3/0/9", pmin=1, pmax=30)
        assert d["code"] == "2.04"
        d = await roundtrip(7, "execute", path="/3/0/4", args="now")
        assert d["code"] == "2.04" and dev.executed == [("/3/0/4", b"now")]
        d = await roundtrip(8, "create", basePath="/5",
                            content=[{"path": "/5/0/1", "value": "coap://fw"}])
        assert d["code"] == "2.01" and dev.values["/5/0/1"] == "coap://fw"
        d = await roundtrip(9, "delete", path="/5/0")
        assert d["code"] == "2.02" and "/5/0/1" not in dev.values
        d = await roundtrip(10, "observe", path="/3/0/9")
        assert d["code"] == "2.05" and d["content"] == [{"path": "/3/0/9", "value": 100}]
        dev.set("/3/0/9", 42)
        topic, note = await nxt()
        assert topic == f"lwm2m/{ep}/up/notify" and note["msgType"] == "notify"
        assert note["reqID"] == 10 and isinstance(note["seqNum"], int)
        assert note["data"]["content"] == [{"path": "/3/0/9", "value": 42}]
        d = await roundtrip(11, "cancel-observe", path="/3/0/9")
        assert d["code"].startswith("2.")
        d = await roundtrip(12, "read", path="/4/0")
        assert d["code"] == "4.04"
        r = await dev.update()
        assert str(r.code) == "2.04 Changed"
        topic, ev = await nxt()
        assert topic == f"lwm2m/{ep}/up/update"
        r = await dev.deregister()
        assert str(r.code) == "2.02 Deleted"
    finally:
        await dev.close()


@pytest.mark.parametrize("senml", [False, True], ids=["tlv", "senml-json"])
def test_device_every_command(lgw: tuple[Gateway, int], uid: str, senml: bool) -> None:
    gw, port = lgw
    ep = f"dev-{uid}"
    app = Lwm2mApp(gw, ep, timeout=TIMEOUT)
    try:
        asyncio.run(_scenario(gw, port, app, ep, senml))
    finally:
        app.close()


async def _composite(port: int, app: Lwm2mApp, ep: str) -> None:
    dev = Lwm2mClient(("127.0.0.1", port), ep, version="1.1", senml=True)
    await dev.start()
    nxt = app.next_async
    try:
        await dev.register()
        topic, ev = await nxt()
        assert ev["data"]["lwm2m"] == "1.1"

        roundtrip = app.roundtrip

        d = await roundtrip(1, "read-composite", paths=["/3/0/0", "/1/0/1"])
        assert d["code"] == "2.05" and d["content"] == [
            {"path": "/1/0/1", "value": 300}, {"path": "/3/0/0", "value": "gatewayd simulator"}]
        d = await roundtrip(2, "write-composite", content=[
            {"path": "/3/0/14", "value": "+03:00"}, {"path": "/1/0/1", "value": 120}])
        assert d["code"] == "2.04" and dev.values["/3/0/14"] == "+03:00"
        assert dev.values["/1/0/1"] == 120
        d = await roundtrip(3, "write", basePath="/1/0", content=[{"path": "1", "value": 90}])
        assert d["code"] == "2.04" and dev.values["/1/0/1"] == 90  # sent as SenML JSON
        d = await roundtrip(4, "create", basePath="/5",
                            content=[{"path": "/5/0/1", "value": "coap://fw"}])
        assert d["code"] == "2.01" and dev.values["/5/0/1"] == "coap://fw"
        d = await roundtrip(5, "observe-composite", paths=["/3/0/9", "/1/0/1"])
        assert d["code"] == "2.05" and {"path": "/3/0/9", "value": 100} in d["content"]
        dev.set("/3/0/9", 55)
        topic, note = await nxt()
        assert topic == f"lwm2m/{ep}/up/notify" and note["reqID"] == 5
        assert {"path": "/3/0/9", "value": 55} in note["data"]["content"]
        d = await roundtrip(6, "cancel-observe-composite", paths=["/3/0/9", "/1/0/1"])
        assert d["code"].startswith("2.")
        await dev.deregister()
    finally:
        await dev.close()


def test_device_11_composite(lgw: tuple[Gateway, int], uid: str) -> None:
    gw, port = lgw
    ep = f"dev11-{uid}"
    app = Lwm2mApp(gw, ep, timeout=TIMEOUT)
    try:
        asyncio.run(_composite(port, app, ep))
    finally:
        app.close()


async def _large_notification(port: int, app: Lwm2mApp, ep: str) -> None:
    dev = Lwm2mClient(("127.0.0.1", port), ep)
    dev.values["/3/0/2"] = "s" * 3000  # serial number: larger than a block
    await dev.start()
    nxt = app.next_async
    try:
        await dev.register()
        await nxt()
        app.command(1, "observe", path="/3/0/2")
        topic, resp = await nxt()
        assert resp["data"]["content"] == [{"path": "/3/0/2", "value": "s" * 3000}]
        dev.set("/3/0/2", "t" * 2900)
        topic, note = await nxt()
        assert topic == f"lwm2m/{ep}/up/notify" and note["reqID"] == 1
        assert note["data"]["content"] == [{"path": "/3/0/2", "value": "t" * 2900}]
        await dev.deregister()
    finally:
        await dev.close()


def test_large_notification_published_whole(lgw: tuple[Gateway, int], uid: str) -> None:
    gw, port = lgw
    ep = f"big-{uid}"
    app = Lwm2mApp(gw, ep, timeout=TIMEOUT)
    try:
        asyncio.run(_large_notification(port, app, ep))
    finally:
        app.close()
