"""LwM2M against a real gatewayd that is killed: commands queued for a sleeping (queue
mode) device survive ``kill -9`` and reach it at its next update, answered on MQTT (paho);
and the 1.1 Send operation through gatewayd."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import pytest

from protocols.lwm2m.client import Lwm2mClient
from tests.interop.clients import Lwm2mApp
from tests.interop.conftest import Gateway, free_port, start_gateway, stop, wait_lwm2m

TIMEOUT = 15.0
WINDOW = 0.2  # qmode_time_window: the device sleeps this long after each message


def _start(workdir: Path, port: int, **extra: str) -> tuple[Any, Gateway]:
    proc, gw = start_gateway(
        workdir,
        GATEWAY_GATEWAY__LWM2M__LISTENERS__UDP__DEFAULT__BIND=f"127.0.0.1:{port}",
        GATEWAY_GATEWAY__LWM2M__QMODE_TIME_WINDOW=f"{int(WINDOW * 1000)}ms",
        **extra,
    )
    wait_lwm2m(port)
    return proc, gw


@pytest.mark.slow
def test_queued_commands_survive_kill_9(tmp_path: Path) -> None:
    port = free_port(socket.SOCK_DGRAM)
    ep = "sleepy-1"
    procs: list[Any] = []

    async def scenario() -> None:
        proc, gw = _start(tmp_path, port)
        procs.append(proc)
        app = Lwm2mApp(gw, ep, qos=1, timeout=TIMEOUT)
        dev = Lwm2mClient(("127.0.0.1", port), ep, binding="UQ")
        await dev.start()
        try:
            r = await dev.register()
            assert str(r.code) == "2.01 Created"
            _, ev = await asyncio.to_thread(app.next)
            assert ev["msgType"] == "register" and ev["data"]["b"] == "UQ"
            # past the device's listening window (no event marks it: the window runs on
            # the gateway's clock), so the commands wait in the queue
            await asyncio.sleep(WINDOW * 3)
            await asyncio.to_thread(app.command, 1, "write", path="/3/0/14", value="+01:00")
            await asyncio.to_thread(app.command, 2, "read", path="/3/0/14")
            assert dev.values.get("/3/0/14") is None
            await asyncio.to_thread(proc.kill)  # kill -9, and reaped
            app.close()
            proc, gw = await asyncio.to_thread(_start, tmp_path, port)
            procs.append(proc)
            app = Lwm2mApp(gw, ep, qos=1, timeout=TIMEOUT)
            r = await dev.update(TIMEOUT)
            assert str(r.code) == "2.04 Changed"  # the registration survived too
            answers: dict[str, dict[str, Any]] = {}
            while len(answers) < 3:
                _, body = await asyncio.to_thread(app.next)
                answers[body["msgType"]] = body
            assert answers["update"]["data"]["ep"] == ep
            assert answers["write"]["reqID"] == 1 and answers["write"]["data"]["code"] == "2.04"
            assert answers["read"]["data"]["content"] == [{"path": "/3/0/14", "value": "+01:00"}]
            assert dev.values["/3/0/14"] == "+01:00"
            r = await dev.deregister(TIMEOUT)
            assert str(r.code) == "2.02 Deleted"
        finally:
            app.close()
            await dev.close()

    try:
        asyncio.run(scenario())
    finally:
        for p in procs:
            stop(p)
    # restarted after the deregistration: nothing is restored
    proc, gw = _start(tmp_path, port)
    stop(proc)
    assert gw.log.read_text().count("registrations restored") == 1


def test_send_reaches_mqtt(tmp_path: Path) -> None:
    port = free_port(socket.SOCK_DGRAM)
    proc, gw = _start(tmp_path, port)
    ep = "sender-1"
    app = Lwm2mApp(gw, ep, qos=1, timeout=TIMEOUT)

    async def scenario() -> None:
        dev = Lwm2mClient(("127.0.0.1", port), ep, version="1.1")
        await dev.start()
        try:
            await dev.register()
            dev.values["/3/0/9"] = 77
            r = await dev.send(["/3/0/9", "/3/0/0"])
            assert str(r.code) == "2.04 Changed"
            r = await dev.send(["/3/0/9"], cbor=True)
            assert str(r.code) == "2.04 Changed"
        finally:
            await dev.close()

    try:
        asyncio.run(scenario())
        assert app.next()[1]["msgType"] == "register"
        topic, ev = app.next()
        assert topic == f"lwm2m/{ep}/up/send" and ev["msgType"] == "send"
        assert ev["data"]["content"] == [{"path": "/3/0/9", "value": 77},
                                         {"path": "/3/0/0", "value": "gatewayd simulator"}]
        topic, ev = app.next()
        assert ev["data"]["content"] == [{"path": "/3/0/9", "value": 77}]
    finally:
        app.close()
        stop(proc)


def test_bootstrap_then_register(tmp_path: Path) -> None:
    port = free_port(socket.SOCK_DGRAM)
    plan = (
        '{"*" = {writes = ['
        f'{{path = "/0/1", content = [{{path = "0", value = "coap://127.0.0.1:{port}"}}, '
        '{path = "1", value = false}, {path = "2", value = 3}, {path = "10", value = 123}]}, '
        '{path = "/1/1", content = [{path = "0", value = 123}, {path = "1", value = 120}, '
        '{path = "7", value = "U"}]}]}}'
    )
    proc, gw = _start(
        tmp_path, port,
        GATEWAY_GATEWAY__LWM2M__BOOTSTRAP__ENABLE="true",
        GATEWAY_GATEWAY__LWM2M__BOOTSTRAP__ENDPOINTS=plan,
    )
    ep = "fresh-1"
    app = Lwm2mApp(gw, ep, qos=1, timeout=TIMEOUT)

    async def scenario() -> None:
        dev = Lwm2mClient(("127.0.0.1", port), ep)
        await dev.start()
        try:
            r = await dev.bootstrap(TIMEOUT)
            assert str(r.code) == "2.04 Changed"
            assert dev.values["/0/1/0"] == f"coap://127.0.0.1:{port}"
            assert dev.values["/0/1/10"] == 123 and dev.values["/1/1/1"] == 120
            assert "/1/0/1" not in dev.values  # Bootstrap-Delete went first
            dev.lifetime = dev.values["/1/1/1"]
            r = await dev.register()
            assert str(r.code) == "2.01 Created"
            await dev.deregister()
        finally:
            await dev.close()

    try:
        asyncio.run(scenario())
        _, ev = app.next()
        assert ev["msgType"] == "register" and ev["data"]["lt"] == 120
        assert "/1/1" in ev["data"]["objectList"]
    finally:
        app.close()
        stop(proc)
