"""Independent clients of every front-end behind one small interface (an "end"):
``subscribe(topic, qos)``, ``publish(topic, payload, qos)``, ``next_message()`` ->
``(topic, payload, qos)``.

- :class:`PahoEnd`: paho-mqtt over TCP, WebSocket (``transport="websockets"``,
  ``ws_set_options(path="/mqtt")``) or secure WebSocket, MQTT 3.1.1 or 5.0.
- :class:`SnEnd`: our MQTT-SN client, on an asyncio loop in a thread of its own.
- :class:`MqttJs`: MQTT.js (``node``) subscriber and publisher processes.

Every wait is on a queue, an event, a future or a process, with a timeout.
"""

from __future__ import annotations

import asyncio
import json
import queue
import ssl
import subprocess
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from protocols.mqttsn.client import MqttSnClient
from tests.interop.conftest import NODE_DIR, PREDEFINED, Gateway

TIMEOUT = 10.0
T = TypeVar("T")
Msg = tuple[str, bytes, int]


class PahoEnd:
    def __init__(
        self, gw: Gateway, transport: str, client_id: str, version: int = mqtt.MQTTv311
    ) -> None:
        self.name = f"paho-{transport}-v{5 if version == mqtt.MQTTv5 else 4}"
        ws = transport in ("ws", "wss")
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=version,
            transport="websockets" if ws else "tcp",
        )
        if ws:
            self.client.ws_set_options(path="/mqtt")
        if transport == "wss":
            self.client.tls_set(ca_certs=str(gw.certs.ca), cert_reqs=ssl.CERT_REQUIRED)
        port = {"tcp": gw.tcp, "ws": gw.ws, "wss": gw.wss}[transport]
        self.messages: queue.Queue[Msg] = queue.Queue()
        self.acks: queue.Queue[Any] = queue.Queue()
        connected = threading.Event()
        self.client.on_connect = lambda c, u, f, rc, p=None: connected.set()
        self.client.on_message = lambda c, u, m: self.messages.put((m.topic, m.payload, m.qos))
        self.client.on_subscribe = lambda c, u, mid, rcs, p=None: self.acks.put(rcs)
        self.client.on_publish = lambda c, u, mid, rc=None, p=None: self.acks.put(mid)
        self.client.connect(gw.host, port, keepalive=30)
        self.client.loop_start()
        if not connected.wait(TIMEOUT):
            raise TimeoutError(f"{self.name}: no CONNACK")

    def subscribe(self, topic: str, qos: int) -> None:
        self.client.subscribe(topic, qos)
        self.acks.get(timeout=TIMEOUT)

    def publish(self, topic: str, payload: bytes, qos: int) -> None:
        info = self.client.publish(topic, payload, qos)
        info.wait_for_publish(TIMEOUT)

    def next_message(self) -> Msg:
        return self.messages.get(timeout=TIMEOUT)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


class SnEnd:
    """Our MQTT-SN client on its own event loop thread (paho's callbacks are threads)."""

    def __init__(self, gw: Gateway, client_id: str) -> None:
        self.name = "mqtt-sn"
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.client = MqttSnClient(gw.host, gw.mqttsn, client_id, timeout=3, predefined=PREDEFINED)
        self._call(self.client.start())
        self._call(self.client.connect(duration=60))

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(TIMEOUT * 2)

    def subscribe(self, topic: str, qos: int) -> None:
        self._call(self.client.subscribe(topic, qos))

    def publish(self, topic: str, payload: bytes, qos: int) -> None:
        self._call(self.client.publish(topic, payload, qos))

    def next_message(self) -> Msg:
        m = self._call(self.client.next_message(TIMEOUT))
        return m.topic, m.payload, m.qos

    def close(self) -> None:
        try:
            self._call(self.client.disconnect())
        finally:
            self.client.close()
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(TIMEOUT)
            self.loop.close()


class MqttJs:
    """MQTT.js processes over ws/wss (``node`` and ``tests/interop/node/node_modules``)."""

    script = NODE_DIR / "mqttjs.js"

    def __init__(self, gw: Gateway, secure: bool, version: int) -> None:
        scheme, port = ("wss", gw.wss) if secure else ("ws", gw.ws)
        self.base = {
            "url": f"{scheme}://{'localhost' if secure else gw.host}:{port}/mqtt",
            "protocolVersion": version,
        }
        if secure:
            self.base["ca"] = str(gw.certs.ca)

    def _args(self, **kw: object) -> list[str]:
        return ["node", str(self.script), json.dumps({**self.base, **kw})]

    def subscriber(self, client_id: str, topic: str, qos: int, count: int) -> MqttJsSub:
        return MqttJsSub(
            self._args(clientId=client_id, action="sub", topic=topic, qos=qos, count=count)
        )

    def publish(self, client_id: str, topic: str, message: str, qos: int) -> None:
        r = subprocess.run(
            self._args(clientId=client_id, action="pub", topic=topic, message=message, qos=qos),
            capture_output=True, text=True, timeout=60, check=False, cwd=NODE_DIR,
        )
        assert r.returncode == 0, r.stderr


class MqttJsSub:
    def __init__(self, args: list[str]) -> None:
        self.proc = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=NODE_DIR
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        ready = self.lines.get(timeout=30)
        assert ready.startswith("READY"), ready

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put("EOF")

    def next_message(self) -> Msg:
        line = self.lines.get(timeout=30)
        if line == "EOF":
            assert self.proc.stderr is not None
            raise AssertionError(f"MQTT.js exited: {self.proc.stderr.read()}")
        m = json.loads(line)
        return m["topic"], m["payload"].encode(), m["qos"]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=10)


def run_cli(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)


def path_of(tool: str) -> Path | None:
    import shutil
    import sys

    found = shutil.which(tool) or (Path(sys.executable).parent / tool)
    p = Path(found)
    return p if p.exists() else None


class Lwm2mApp:
    """The MQTT application of an LwM2M device (paho): subscribes to its ``up/#``, sends
    commands on ``dn``; at QoS 1 a command returns once gatewayd acknowledged it (for a
    queue-mode device: once it is on disk)."""

    def __init__(self, gw: Gateway, ep: str, *, qos: int = 0, timeout: float = 10.0) -> None:
        self.ep = ep
        self.qos = qos
        self.timeout = timeout
        self.q: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self.acked: queue.Queue[int] = queue.Queue()
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"app-{ep}")
        subscribed: queue.Queue[object] = queue.Queue()
        self.c.on_message = lambda c, u, m: self.q.put((m.topic, json.loads(m.payload)))
        self.c.on_subscribe = lambda *a: subscribed.put(a)
        self.c.on_publish = lambda c, u, mid, rc, p: self.acked.put(mid)
        self.c.connect(gw.host, gw.tcp)
        self.c.loop_start()
        self.c.subscribe(f"lwm2m/{ep}/up/#", 0)
        subscribed.get(timeout=timeout)

    def command(self, req_id: int, msg_type: str, **data: Any) -> None:
        body = json.dumps({"reqID": req_id, "msgType": msg_type, "data": data})
        info = self.c.publish(f"lwm2m/{self.ep}/dn", body, self.qos)
        if self.qos:
            while self.acked.get(timeout=self.timeout) != info.mid:
                pass

    def next(self) -> tuple[str, dict[str, Any]]:
        return self.q.get(timeout=self.timeout)

    async def next_async(self) -> tuple[str, dict[str, Any]]:
        """``next`` for a test running the device simulator on an event loop."""
        return await asyncio.to_thread(self.next)

    async def roundtrip(self, req_id: int, msg_type: str, **data: Any) -> dict[str, Any]:
        """Send a command and return the ``data`` of the answer, which must be its answer."""
        self.command(req_id, msg_type, **data)
        topic, resp = await self.next_async()
        assert topic == f"lwm2m/{self.ep}/up/resp", resp
        assert resp["reqID"] == req_id and resp["msgType"] == msg_type, resp
        return resp["data"]  # type: ignore[no-any-return]

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()
