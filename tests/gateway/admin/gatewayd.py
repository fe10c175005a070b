"""A real ``gatewayd`` on free loopback ports, and small HTTP/MQTT helpers, for the
management API, Prometheus, ``$SYS`` and ``gatewayctl`` tests.

The process is :class:`tests.harness.gatewayd.GatewaydProcess` (free ports, gatewayd's
own READY=1, clean stop); MQTT helpers wait for CONNACK/SUBACK/messages on events with a
timeout.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import queue
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from tests.harness.gatewayd import SRC, GatewaydProcess, clean_environ, free_port, gatewayd_env

__all__ = ["Client", "Gatewayd", "clean_environ", "clients", "free_port", "q"]

WAIT = 10.0


@dataclass
class Gatewayd:
    workdir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    mqtt_port: int = field(default_factory=free_port)
    api_port: int = field(default_factory=free_port)
    node_name: str = "gw-test@127.0.0.1"
    process: GatewaydProcess | None = None
    src: Path = SRC  # the source tree it runs from (a compiled copy: tests/test_compiled.py)

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        return self.workdir / "gatewayd.log"

    @property
    def env(self) -> dict[str, str]:
        """What gatewayd and gatewayctl need to find each other."""
        return {
            "GATEWAY_NODE__NAME": self.node_name,
            "GATEWAY_NODE__DATA_DIR": str(self.data_dir),
            "GATEWAY_LISTENERS__TCP__DEFAULT__BIND": f"127.0.0.1:{self.mqtt_port}",
            "GATEWAY_LISTENERS__TCP__DEFAULT__MAX_CONNECTIONS": "1000",
            "GATEWAY_API__BIND": f"127.0.0.1:{self.api_port}",
            **self.extra_env,
        }

    def start(self) -> Gatewayd:
        self.process = GatewaydProcess(self.workdir, gatewayd_env(self.env, self.src)).start()
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def log(self) -> str:
        return self.process.log() if self.process is not None else ""

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The gatewayd process itself (for kill -9, pid and exit status checks)."""
        return self.process.proc if self.process is not None else None

    @property
    def token(self) -> str:
        return (self.data_dir / "api.token").read_text().strip()

    def http(self, method: str, path: str, *, auth: bool = True, token: str | None = None,
             body: Any = None, headers: dict[str, str] | None = None
             ) -> tuple[int, dict[str, str], bytes]:
        h = dict(headers or {})
        if auth:
            h["Authorization"] = f"Bearer {token if token is not None else self.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            h["Content-Type"] = "application/json"
        conn = http.client.HTTPConnection("127.0.0.1", self.api_port, timeout=WAIT)
        try:
            conn.request(method, path, body=data, headers=h)
            r = conn.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            conn.close()

    def get(self, path: str, **params: Any) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        status, _, body = self.http("GET", path + (f"?{query}" if query else ""))
        assert status == 200, (status, body)
        return json.loads(body)


def q(value: str) -> str:
    return urllib.parse.quote(value, safe="")


class Client:
    """A paho-mqtt client whose every step is awaited on an event."""

    def __init__(self, gw: Gatewayd, client_id: str, *, version: int = 4,
                 username: str | None = None, clean: bool = True,
                 will: tuple[str, bytes] | None = None, session_expiry: int = 0) -> None:
        proto = {4: mqtt.MQTTv311, 5: mqtt.MQTTv5}[version]
        self.version = version
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=proto,
                             clean_session=clean if version == 4 else None)
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.subscribed = threading.Event()
        self.disconnect_reason: Any = None
        self.c.on_connect = lambda c, u, f, rc, p: self.connected.set()
        self.c.on_subscribe = lambda c, u, mid, rcs, p: self.subscribed.set()
        self.c.on_message = lambda c, u, m: self.messages.put(m)
        self.c.on_disconnect = self._on_disconnect
        if username is not None:
            self.c.username_pw_set(username)
        if will is not None:
            self.c.will_set(will[0], will[1], qos=1)
        kwargs: dict[str, Any] = {}
        if version == 5:
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = session_expiry
            kwargs = {"clean_start": clean, "properties": props}
        self.c.connect("127.0.0.1", gw.mqtt_port, keepalive=60, **kwargs)
        self.c.loop_start()
        assert self.connected.wait(WAIT), f"{client_id} did not connect"

    def _on_disconnect(self, c: Any, u: Any, flags: Any, rc: Any, props: Any) -> None:
        self.disconnect_reason = rc
        self.disconnected.set()

    def subscribe(self, topic: str, qos: int = 0) -> Client:
        self.subscribed.clear()
        self.c.subscribe(topic, qos)
        assert self.subscribed.wait(WAIT), f"no SUBACK for {topic}"
        return self

    def publish(self, topic: str, payload: bytes | str, qos: int = 0, retain: bool = False
                ) -> None:
        info = self.c.publish(topic, payload, qos=qos, retain=retain)
        info.wait_for_publish(WAIT)

    def next_message(self, timeout: float = WAIT) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=timeout)

    def wait_for(self, topic: str, timeout: float = WAIT) -> mqtt.MQTTMessage:
        """The next message on ``topic``, skipping others."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no message on {topic}")
            m = self.messages.get(timeout=left)
            if m.topic == topic:
                return m

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.c.disconnect()
        self.c.loop_stop()


@contextlib.contextmanager
def clients() -> Iterator[list[Client]]:
    made: list[Client] = []
    try:
        yield made
    finally:
        for c in made:
            c.close()
