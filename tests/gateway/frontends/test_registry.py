"""The front-end registry: what each front-end declares, and a new front-end added with
one module and one registry line (the worked example of docs/adding-a-frontend.md, in
tests/gateway/frontends/lines.py), run in a real gateway over real sockets."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from gateway import app
from gateway.app import Gateway
from gateway.config import load_config
from gateway.config.schema import TcpListener
from gateway.frontends import FRONTENDS, ListenerSpec
from protocols.mqtt.connection import Connection, Role
from protocols.mqtt.packets import ConnAck, Connect, Publish, SubAck, Subscribe, Subscription
from tests.gateway.frontends import lines
from tests.harness.gatewayd import free_port

ROOT = Path(__file__).resolve().parents[3]
TIMEOUT = 10.0


def test_every_frontend_declares_its_listeners() -> None:
    config = load_config(None, {
        "GATEWAY_LISTENERS__WS__W__BIND": "127.0.0.1:0",
        "GATEWAY_GATEWAY__MQTTSN__ENABLE": "true",
        "GATEWAY_GATEWAY__COAP__ENABLE": "true",
        "GATEWAY_GATEWAY__LWM2M__ENABLE": "true",
    })
    seen: dict[str, str] = {}
    for frontend in FRONTENDS:
        for spec in frontend.listeners(config):
            assert spec.kind in frontend.kinds, (frontend.protocol, spec)
            assert spec.id not in seen, f"{spec.id} declared by {seen.get(spec.id)} too"
            seen[spec.id] = frontend.protocol
            assert spec.config.enable
            assert spec.secure == (spec.kind in ("ssl", "wss", "dtls"))
    assert {"tcp:default", "ws:w", "mqttsn:udp:default", "coap:udp:default",
            "lwm2m:udp:default"} <= set(seen), seen
    assert [f.protocol for f in FRONTENDS] == ["mqtt", "mqtt", "mqttsn", "coap", "lwm2m"]


def test_a_disabled_section_declares_no_listener() -> None:
    config = load_config(None, {"GATEWAY_LISTENERS__TCP__DEFAULT__ENABLE": "false"})
    mqtt = FRONTENDS[0]
    assert mqtt.listeners(config) == []


async def _mqtt_subscriber(
    port: int, topic: str
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Connection]:
    """Connected and subscribed (keep the writer: dropping it closes the connection)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = Connection(Role.CLIENT)
    writer.write(conn.send(Connect("watcher")))
    writer.write(conn.send(Subscribe(1, (Subscription(topic),))))
    await writer.drain()
    got: list[object] = []
    while not any(isinstance(p, SubAck) for p in got):
        data = await asyncio.wait_for(reader.read(4096), TIMEOUT)
        assert data, f"the gateway closed the subscriber's connection after {got}"
        conn.receive_data(data)
        while (p := conn.next_event()) is not None:
            got.append(p)
    assert isinstance(got[0], ConnAck) and got[0].reason_code == 0, got
    return reader, writer, conn


async def _next_publish(reader: asyncio.StreamReader, conn: Connection) -> Publish:
    while True:
        p = conn.next_event()
        if isinstance(p, Publish):
            return p
        if p is None:
            data = await asyncio.wait_for(reader.read(4096), TIMEOUT)
            assert data, "the gateway closed the subscriber's connection"
            conn.receive_data(data)


def test_a_new_frontend_is_one_module_and_one_registry_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mqtt_port, lines_port = free_port(), free_port()
    config = load_config(None, {
        "GATEWAY_NODE__DATA_DIR": str(tmp_path),
        "GATEWAY_API__ENABLE": "false",
        "GATEWAY_DURABILITY__ENABLE": "false",
        "GATEWAY_LISTENERS__TCP__DEFAULT__BIND": f"127.0.0.1:{mqtt_port}",
    })
    monkeypatch.setattr(app, "FRONTENDS", (*FRONTENDS, lines.FRONTEND))  # the one line
    monkeypatch.setattr(lines, "LISTENERS", [ListenerSpec(
        "tcp", "default", "lines:tcp:default", "gateway.lines.listeners.tcp.default",
        TcpListener(bind=f"127.0.0.1:{lines_port}"),
    )])

    async def scenario() -> None:
        gateway = Gateway(config)
        await gateway.start()
        try:
            entry = gateway.listeners["lines:tcp:default"]
            assert (entry.type, entry.protocol) == ("tcp", "lines")
            assert entry.addresses == [f"127.0.0.1:{lines_port}"]
            reader, watcher, conn = await _mqtt_subscriber(mqtt_port, "plant/#")
            _, device = await asyncio.open_connection("127.0.0.1", lines_port)
            device.write(b"plant/t1 21.5\nplant/t2 ")
            await device.drain()
            first = await _next_publish(reader, conn)
            assert (first.topic, first.payload) == ("plant/t1", b"21.5")
            device.write(b"19.0\n")  # the rest of the second line
            second = await _next_publish(reader, conn)
            assert (second.topic, second.payload) == ("plant/t2", b"19.0")
            assert entry.current_connections == 1
            device.close()
            watcher.close()
        finally:
            await gateway.stop()

    asyncio.run(scenario())


def test_the_doc_shows_the_example_as_it_is() -> None:
    """Every code block of docs/adding-a-frontend.md marked as a part of lines.py is in
    that file, line for line, so the worked example cannot drift from the tested one."""
    doc = (ROOT / "docs" / "adding-a-frontend.md").read_text()
    source = (ROOT / "tests" / "gateway" / "frontends" / "lines.py").read_text()
    blocks = re.findall(r"```python\n# lines\.py\n(.*?)```", doc, re.S)
    assert len(blocks) >= 2, "the doc quotes lines.py in blocks starting '# lines.py'"
    for block in blocks:
        assert block in source, block[:200]
