"""Shared pieces of the bridge benchmarks (``bench/bridge_forward.py``,
``bench/bridge_drain.py``): gatewayd with a bridge to mosquitto, and raw asyncio MQTT
clients that publish pre-encoded packets and count what arrives upstream.

Like the main load generator (``bench/loadgen.py``), the clients here never decode with
the project's codec: packets are encoded by hand (``bench/wire.py``) and counted by
walking fixed headers, so the yardstick shares no code with what it measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import wire
from bench.brokers import Gatewayd, Mosquitto, free_port

FORWARD_FILTER = "bench/#"
UPSTREAM_FILTER = "edge/#"


class BridgedGatewayd(Gatewayd):
    """gatewayd with one bridge, ``cloud``, forwarding ``bench/#`` to ``edge/${topic}``
    on ``upstream_port``; its management API on a known port (bridge state)."""

    def __init__(self, upstream_port: int, *, qos: str = "${qos}", proto: str = "v4",
                 max_inflight: int = 32, drain_rate: float = 0.0) -> None:
        super().__init__()
        self.upstream_port = upstream_port
        self.api_port = free_port()
        self.bridge_qos = qos
        self.proto = proto
        self.max_inflight = max_inflight
        self.drain_rate = drain_rate

    def command(self) -> list[str]:
        conf = self.tmp / "gateway.toml"
        qos = f'"{self.bridge_qos}"' if self.bridge_qos.startswith("$") else self.bridge_qos
        conf.write_text(
            "[node]\n"
            'name = "bench@127.0.0.1"\n'
            f'data_dir = "{self.tmp / "data"}"\n'
            "[listeners.tcp.default]\n"
            f'bind = "{self.host}:{self.port}"\n'
            "[mqtt]\nmax_inflight = 64\n"
            f'[api]\nbind = "127.0.0.1:{self.api_port}"\n'
            "[sys_topics]\nsys_msg_interval = 0\nsys_heartbeat_interval = 0\n"
            "[bridges.mqtt.cloud]\n"
            f'server = "127.0.0.1:{self.upstream_port}"\n'
            f'proto_ver = "{self.proto}"\n'
            'clientid = "bench-edge"\n'
            f"max_inflight = {self.max_inflight}\n"
            "[bridges.mqtt.cloud.reconnect]\n"
            'initial = "200ms"\nmax = "1s"\n'
            "[bridges.mqtt.cloud.outbox]\n"
            f"drain_rate = {self.drain_rate}\n"
            "[[bridges.mqtt.cloud.forwards]]\n"
            f'local = "{FORWARD_FILTER}"\n'
            'remote = "edge/${topic}"\n'
            f"qos = {qos}\n"
        )
        return self._gatewayd(conf)

    def bridge(self) -> dict[str, Any]:
        token = (self.tmp / "data" / "api.token").read_text().strip()
        status, body = api(self.api_port, "/api/v5/bridges", token)
        assert status == 200, body
        view: dict[str, Any] = json.loads(body)["bridges"][0]
        return view


class UpstreamMosquitto(Mosquitto):
    """mosquitto on a port chosen before it starts (the bridge's configuration names it),
    with no outgoing window to the counter (it would only add latency)."""

    def __init__(self, port: int | None = None) -> None:
        super().__init__()
        self.fixed_port = port or free_port()
        self.port = self.fixed_port

    def start(self) -> None:
        self.port = self.fixed_port
        self.launch()

    def command(self) -> list[str]:
        cmd = super().command()
        conf = Path(cmd[-1])
        conf.write_text(conf.read_text() + "max_inflight_messages 0\nmax_queued_messages 0\n")
        return cmd


def wait_until(what: str, predicate: Callable[[], bool], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def api(port: int, path: str, token: str | None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


# ------------------------------------------------------------------ raw MQTT clients


class RawClient(asyncio.Protocol):
    """Counts PUBLISH and PUBACK packets by walking fixed headers; answers QoS 1
    deliveries with PUBACK."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.connected = asyncio.get_running_loop().create_future()
        self.subscribed = asyncio.get_running_loop().create_future()
        self.received = 0
        self.acks = 0
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.on_progress: Callable[[], None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        i, n = 0, len(buf)
        acks: list[bytes] = []
        received = 0
        while n - i >= 2:
            first = buf[i]
            length = shift = 0
            j = i + 1
            complete = False
            while j < n and j - i <= 4:
                b = buf[j]
                j += 1
                length |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    complete = True
                    break
            end = j + length
            if not complete or end > n:
                break
            kind = first >> 4
            if kind == wire.T_PUBLISH:
                received += 1
                if (first >> 1) & 3:
                    topic_len = int.from_bytes(buf[j:j + 2], "big")
                    pid = bytes(buf[j + 2 + topic_len:j + 4 + topic_len])
                    acks.append(wire.PUBACK_HEAD + pid)
            elif kind == wire.T_PUBACK:
                self.acks += 1
            elif kind == wire.T_CONNACK and not self.connected.done():
                self.connected.set_result(True)
            elif kind == wire.T_SUBACK and not self.subscribed.done():
                self.subscribed.set_result(True)
            i = end
        del buf[:i]
        if received:
            now = time.monotonic()
            if self.first_at is None:
                self.first_at = now
            self.last_at = now
            self.received += received
        if acks and self.transport is not None:
            self.transport.write(b"".join(acks))
        if self.on_progress is not None:
            self.on_progress()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.connected.done():
            self.connected.set_exception(ConnectionError("closed before CONNACK"))


async def open_client(port: int, client_id: str) -> RawClient:
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(RawClient, "127.0.0.1", port)
    assert client.transport is not None
    client.transport.write(wire.connect(client_id, keepalive=600))
    await asyncio.wait_for(client.connected, 10)
    return client


async def counter(port: int, qos: int) -> RawClient:
    """A subscriber to everything the bridge forwards, on the upstream broker."""
    c = await open_client(port, f"counter-{time.monotonic_ns()}")
    assert c.transport is not None
    c.transport.write(wire.subscribe(1, UPSTREAM_FILTER, qos))
    await asyncio.wait_for(c.subscribed, 10)
    return c


async def publish(port: int, qos: int, total: int, *, window: int,
                  outstanding: Callable[[RawClient, int], int], client_id: str = "pub",
                  deadline: float | None = None, wake: asyncio.Event | None = None
                  ) -> tuple[int, float]:
    """Publish ``total`` messages (a ring of pre-encoded packets on ``bench/<client_id>``)
    while ``outstanding(client, sent) < window``; returns (sent, seconds). ``wake`` is set
    by whatever changes ``outstanding`` besides our own PUBACKs (an upstream counter)."""
    c = await open_client(port, client_id)
    assert c.transport is not None
    ring = wire.publish_ring(f"bench/{client_id}", qos, length=window * 2 if qos else 128)
    wake = wake or asyncio.Event()
    c.on_progress = wake.set
    sent = 0
    t0 = time.monotonic()
    while sent < total and (deadline is None or time.monotonic() < deadline):
        room = min(window - outstanding(c, sent), total - sent, 256)
        if room <= 0:
            wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), 5.0)
            continue
        c.transport.write(b"".join(ring[(sent + k) % len(ring)] for k in range(room)))
        sent += room
        await asyncio.sleep(0)
    if qos:
        while c.acks < sent:
            wake.clear()
            await asyncio.wait_for(wake.wait(), 30.0)
    seconds = time.monotonic() - t0
    c.transport.write(wire.DISCONNECT)
    c.transport.close()
    return sent, seconds


def machine() -> dict[str, str]:
    from bench.run import machine as bench_machine

    info = bench_machine()
    info.pop("amqtt", None)
    return info
