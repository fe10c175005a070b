"""``client_connected`` / ``client_disconnected`` of the datagram front-ends end to end (a
real gatewayd, our MQTT-SN client, aiocoap): EMQX's ``reason`` for each way such a
session ends, and ``sockname`` (the listener's ``host:port``)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from aiocoap import DELETE, POST, Context
from aiocoap import Message as CoapMessage
from aiocoap.numbers.codes import Code

from protocols.mqttsn.client import MqttSnClient
from tests.gateway.admin.gatewayd import Client, Gatewayd
from tests.gateway.rules.conftest import event, event_rules, event_watcher
from tests.harness.gatewayd import free_port

pytestmark = pytest.mark.rules

SN_PORT = free_port(socket.SOCK_DGRAM)
COAP_PORT = free_port(socket.SOCK_DGRAM)
CONFIG = {
    "GATEWAY_GATEWAY__MQTTSN__LISTENERS__UDP__DEFAULT__BIND": f"127.0.0.1:{SN_PORT}",
    "GATEWAY_GATEWAY__COAP__LISTENERS__UDP__DEFAULT__BIND": f"127.0.0.1:{COAP_PORT}",
    "GATEWAY_GATEWAY__COAP__HEARTBEAT": "1s",
    **event_rules(
        dis='SELECT clientid, reason, sockname, proto_name FROM "$events/client_disconnected"',
        con='SELECT clientid, sockname FROM "$events/client_connected"'),
}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gatewayd]:
    g = Gatewayd(tmp_path_factory.mktemp("dgram-events"), dict(CONFIG))
    g.start()
    yield g
    g.stop()


@pytest.fixture()
def watch(gw: Gatewayd) -> Iterator[Client]:
    w = event_watcher(gw, "dis", "con")
    yield w
    w.close()


def sn(cid: str) -> MqttSnClient:
    return MqttSnClient("127.0.0.1", SN_PORT, cid, timeout=2.0)


def test_mqttsn_normal_disconnect_and_sockname(watch: Client) -> None:
    async def run() -> None:
        async with sn("sn-normal") as c:
            await c.connect(duration=60)
            await c.disconnect()

    asyncio.run(run())
    assert event(watch, "con/sn-normal")["sockname"] == f"127.0.0.1:{SN_PORT}"
    d = event(watch, "dis/sn-normal")
    assert (d["reason"], d["sockname"], d["proto_name"]) == (
        "normal", f"127.0.0.1:{SN_PORT}", "MQTT-SN")


def test_mqttsn_keepalive_timeout(watch: Client) -> None:
    async def run() -> None:
        async with sn("sn-ka") as c:
            await c.connect(duration=1)  # then silence: lost after 1.5 s

    asyncio.run(run())
    assert event(watch, "dis/sn-ka")["reason"] == "keepalive_timeout"


def test_mqttsn_sleeping_client_lost(watch: Client) -> None:
    async def run() -> None:
        async with sn("sn-sleep") as c:
            await c.connect(duration=60)
            await c.sleep(1)  # and never wakes up

    asyncio.run(run())
    assert event(watch, "dis/sn-sleep")["reason"] == "asleep_timeout"


def test_mqttsn_takeover_from_another_address(watch: Client) -> None:
    async def run() -> None:
        async with sn("sn-twice") as first:
            await first.connect(duration=60)
            watch.wait_for("con/sn-twice")
            async with sn("sn-twice") as second:
                await second.connect(duration=60, clean_session=True)
                await second.disconnect()

    asyncio.run(run())
    assert event(watch, "dis/sn-twice")["reason"] == "discarded"
    assert event(watch, "dis/sn-twice")["reason"] == "normal"


def _coap(*requests: tuple[Any, str]) -> list[Any]:
    """The responses to ``(code, path)`` requests, in order, from one client endpoint
    (a CoAP connection is bound to the peer's address); ``{token}`` in a path is the
    payload of the first response."""

    async def run() -> list[Any]:
        ctx = await Context.create_client_context()
        out: list[Any] = []
        try:
            for code, path in requests:
                if out:
                    path = path.replace("{token}", out[0].payload.decode())
                out.append(await asyncio.wait_for(ctx.request(CoapMessage(
                    code=code, uri=f"coap://127.0.0.1:{COAP_PORT}{path}")).response, 10))
        finally:
            await ctx.shutdown()
        return out

    return asyncio.run(run())


def test_coap_heartbeat_missed_and_connection_deleted(watch: Client) -> None:
    base = "/mqtt/connection"
    (r,) = _coap((POST, f"{base}?clientid=coap-ka&username=u&password=p"))
    assert r.code == Code.CREATED
    assert event(watch, "con/coap-ka")["sockname"] == f"127.0.0.1:{COAP_PORT}"
    d = event(watch, "dis/coap-ka")  # no PUT within 1.5 x heartbeat
    assert (d["reason"], d["sockname"], d["proto_name"]) == (
        "keepalive_timeout", f"127.0.0.1:{COAP_PORT}", "CoAP")
    _, r = _coap((POST, f"{base}?clientid=coap-del&username=u&password=p"),
                 (DELETE, base + "?clientid=coap-del&token={token}"))
    assert r.code == Code.DELETED
    assert event(watch, "dis/coap-del")["reason"] == "normal"
