"""Real ``gatewayd`` cluster nodes on free loopback ports, for the cluster tests.

Certificates come from our own CLI (``gatewayctl certs init-ca/issue --server-client``)
in a temporary directory; each node is configured only through ``GATEWAY_*`` variables
and runs as a :class:`tests.harness.gatewayd.GatewaydProcess` (free ports, gatewayd's own
READY=1, clean stop). Every other wait is a bounded poll of a condition (the management
API, a message queue), never a fixed sleep.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from tests.harness.gatewayd import GatewaydProcess, clean_environ, free_port, gatewayd_env

WAIT = 20.0


def gatewayctl(
    *args: str | Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.gatewayctl", *map(str, args)],
        capture_output=True, text=True, check=False, timeout=60,
        env={**clean_environ(), **(env or {})},
    )


def make_pki(root: Path, names: Iterable[str]) -> Path:
    """A cluster CA in ``root/ca`` with a --server-client certificate per node name, and a
    foreign CA in ``root/other`` with one node certificate ("intruder@127.0.0.1")."""
    ca = root / "ca"
    for args in (("init-ca", ca), *(("issue", ca, n, "--server-client") for n in names),
                 ("init-ca", root / "other", "--cn", "another CA"),
                 ("issue", root / "other", "intruder@127.0.0.1", "--server-client")):
        r = gatewayctl("certs", *args)
        assert r.returncode == 0, r.stderr
    return ca


def wait_until(cond: Callable[[], Any], timeout: float = WAIT, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = cond()
        except (OSError, AssertionError, KeyError, ValueError):
            last = None
        if last:
            return last
        time.sleep(0.05)  # bounded poll
    raise AssertionError(f"timed out waiting for {what}")


class Node:
    """One gatewayd cluster node (name ``<short>@127.0.0.1``)."""

    def __init__(self, workdir: Path, short: str, pki: Path, *, seeds: list[Node] | None = None,
                 role: str = "core", extra: dict[str, str] | None = None,
                 cert_dir: Path | None = None, cert_name: str | None = None,
                 host: str = "127.0.0.1", cluster_port: int | None = None) -> None:
        self.short = short
        self.host = host
        self.name = f"{short}@{host}"
        self.workdir = workdir / short
        self.pki = pki
        self.mqtt_port = free_port()
        self.api_port = free_port()
        self.cluster_port = cluster_port or free_port()
        self.role = role
        self.seeds = seeds or []
        self.extra = dict(extra or {})
        self.cert_dir = cert_dir or pki
        self.cert_name = cert_name or self.name
        self.process: GatewaydProcess | None = None

    @property
    def addr(self) -> str:
        return f"{self.name}:{self.cluster_port}"

    @property
    def env(self) -> dict[str, str]:
        return {
            "GATEWAY_NODE__NAME": self.name,
            "GATEWAY_NODE__ROLE": self.role,
            "GATEWAY_NODE__DATA_DIR": str(self.workdir / "data"),
            "GATEWAY_LISTENERS__TCP__DEFAULT__BIND": f"127.0.0.1:{self.mqtt_port}",
            "GATEWAY_API__BIND": f"127.0.0.1:{self.api_port}",
            "GATEWAY_CLUSTER__BIND": f"{self.host}:{self.cluster_port}",
            "GATEWAY_CLUSTER__SEEDS": ",".join(s.addr for s in self.seeds),
            "GATEWAY_CLUSTER__TLS__CERTFILE": str(self.cert_dir / f"{self.cert_name}.crt"),
            "GATEWAY_CLUSTER__TLS__KEYFILE": str(self.cert_dir / f"{self.cert_name}.key"),
            "GATEWAY_CLUSTER__TLS__CACERTFILE": str(self.pki / "ca.crt"),
            "GATEWAY_CLUSTER__HEARTBEAT_INTERVAL": "0.25s",
            "GATEWAY_CLUSTER__HEARTBEAT_TIMEOUT": "4s",
            "GATEWAY_CLUSTER__RECONNECT_MAX": "0.5s",
            "GATEWAY_SYS_TOPICS__SYS_MSG_INTERVAL": "0",
            "GATEWAY_SYS_TOPICS__SYS_HEARTBEAT_INTERVAL": "0",
            **self.extra,
        }

    @property
    def log_path(self) -> Path:
        return self.workdir / "gatewayd.log"

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.process.proc if self.process is not None else None

    def start(self, *, wait: bool = True) -> Node:
        """Start gatewayd (and wait until it is ready). The client and API ports were
        picked free but may be taken by someone else before gatewayd binds them: then
        it exits at once, and it is started again on other ones (at most 3 times; the
        cluster port is in other nodes' seeds, so it is kept)."""
        for attempt in range(3):
            self.process = GatewaydProcess(
                self.workdir, gatewayd_env(self.env), what=self.name
            ).start(wait=False)
            if not wait:
                return self
            try:
                self.process.wait_ready()
                return self
            except RuntimeError as exc:
                if "Address already in use" not in str(exc) or attempt == 2:
                    raise
                self.mqtt_port, self.api_port = free_port(), free_port()
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()

    def log(self) -> str:
        return self.process.log() if self.process is not None else ""

    @property
    def token(self) -> str:
        return (self.workdir / "data" / "api.token").read_text().strip()

    def http(self, method: str, path: str, *, auth: bool = True, body: Any = None
             ) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {self.token}"} if auth else {}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        conn = http.client.HTTPConnection("127.0.0.1", self.api_port, timeout=10)
        try:
            conn.request(method, path, body=data, headers=headers)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def cluster(self) -> dict[str, Any]:
        status, body = self.http("GET", "/api/v5/cluster")
        assert status == 200, body
        result: dict[str, Any] = json.loads(body)
        return result

    def member(self, name: str) -> dict[str, Any] | None:
        for m in self.cluster()["members"]:
            if m["node"] == name:
                return dict(m)
        return None

    def state_of(self, other: Node) -> str | None:
        m = self.member(other.name)
        return None if m is None else str(m["status"])

    def remote_routes(self, other: Node) -> int:
        m = self.member(other.name)
        return 0 if m is None else int(m["routes"])

    def ctl_env(self) -> dict[str, str]:
        return {"GATEWAY_NODE__DATA_DIR": str(self.workdir / "data"),
                "GATEWAY_API__BIND": f"127.0.0.1:{self.api_port}"}


def wait_mesh(nodes: list[Node], timeout: float = WAIT) -> None:
    """Every node sees every other one up."""
    def meshed() -> bool:
        return all(n.state_of(o) == "up" for n in nodes for o in nodes if o is not n)
    wait_until(meshed, timeout, "the full mesh")


def wait_routes(node: Node, other: Node, count: int, timeout: float = WAIT) -> None:
    wait_until(lambda: node.remote_routes(other) == count, timeout,
               f"{node.name} to see {count} routes of {other.name}")


class Client:
    """A paho-mqtt client whose every step is awaited on an event."""

    def __init__(self, node: Node, client_id: str, *, version: int = 5, clean: bool = True,
                 session_expiry: int = 0) -> None:
        proto = {4: mqtt.MQTTv311, 5: mqtt.MQTTv5}[version]
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=proto,
                             clean_session=clean if version == 4 else None)
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.subscribed = threading.Event()
        self.session_present: bool | None = None
        self.disconnect_reason: Any = None
        self.c.on_connect = self._on_connect
        self.c.on_subscribe = lambda c, u, mid, rcs, p: self.subscribed.set()
        self.c.on_message = lambda c, u, m: self.messages.put(m)
        self.c.on_disconnect = self._on_disconnect
        kwargs: dict[str, Any] = {}
        if version == 5:
            from paho.mqtt.packettypes import PacketTypes
            from paho.mqtt.properties import Properties

            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = session_expiry
            kwargs = {"clean_start": clean, "properties": props}
        self.c.reconnect_delay_set(60, 120)  # no automatic reconnect during a test
        self.c.connect("127.0.0.1", node.mqtt_port, keepalive=60, **kwargs)
        self.c.loop_start()
        assert self.connected.wait(WAIT), f"{client_id} did not connect"

    def _on_connect(self, c: Any, u: Any, flags: Any, rc: Any, p: Any) -> None:
        self.session_present = bool(getattr(flags, "session_present", False))
        self.connected.set()

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
        assert info.is_published(), f"publish to {topic} not acknowledged"

    def next_message(self, timeout: float = WAIT) -> mqtt.MQTTMessage:
        return self.messages.get(timeout=timeout)

    def collect(self, n: int, timeout: float = WAIT) -> list[mqtt.MQTTMessage]:
        deadline = time.monotonic() + timeout
        out: list[mqtt.MQTTMessage] = []
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"got {len(out)} of {n} messages")
            try:
                out.append(self.messages.get(timeout=left))
            except queue.Empty:
                raise AssertionError(f"got {len(out)} of {n} messages") from None
        return out

    def drain(self) -> list[mqtt.MQTTMessage]:
        out = []
        with contextlib.suppress(queue.Empty):
            while True:
                out.append(self.messages.get_nowait())
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.c.disconnect()
        self.c.loop_stop()
