"""Real processes for the bridge's acceptance tests: mosquitto as the upstream broker,
a TCP gate in front of it (the uplink, which the test cuts and restores), gatewayd with a
bridge, and paho clients that wait on events.

Waits are bounded: readiness is a TCP-connect poll (mosquitto) or gatewayd's READY=1 (it
runs as a :class:`tests.harness.gatewayd.GatewaydProcess`), bridge states are
polled from the management API (another process: there is no event to await), messages
are awaited on queues with a deadline.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import shutil
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.harness.gatewayd import (
    GatewaydProcess,
    free_port,
    gatewayd_command,
    gatewayd_env,
)
from tests.harness.wait import until

WAIT = 30.0  # seconds any single expected event may take on a busy machine
POLL = 0.05
MOSQUITTO = shutil.which("mosquitto") or next(
    (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.path.exists(p)), None
)
needs_mosquitto = pytest.mark.skipif(MOSQUITTO is None, reason="needs Debian's mosquitto")
REPO = Path(__file__).resolve().parents[3]


def wait_until(what: str, predicate: Callable[[], Any], timeout: float = WAIT) -> Any:
    return until(what, predicate, timeout, POLL)


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


class Mosquitto:
    """Debian's mosquitto on 127.0.0.1, persistence off, from a generated config."""

    def __init__(self, workdir: Path, *, tls: dict[str, Any] | None = None) -> None:
        self.workdir = workdir
        self.port = free_port()  # plain listener (observers, publishers)
        self.tls = tls
        self.tls_port = free_port() if tls else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def config(self) -> str:
        lines = [
            "user root",
            "persistence false",
            "log_dest stderr",
            "log_type all",
            "per_listener_settings false",
            "allow_anonymous true",
            # no outgoing window: mosquitto otherwise queues QoS 1 deliveries behind a full
            # window while QoS 0 ones go straight out, and the observer sees them reordered
            "max_inflight_messages 0",
            f"listener {self.port} 127.0.0.1",
        ]
        if self.tls:
            lines += [f"listener {self.tls_port} 127.0.0.1"]
            lines += [f"{k} {v}" for k, v in self.tls.items()]
        return "\n".join(lines) + "\n"

    def start(self) -> Mosquitto:
        assert MOSQUITTO is not None
        self.workdir.mkdir(parents=True, exist_ok=True)
        conf = self.workdir / "mosquitto.conf"
        conf.write_text(self.config())
        self.starts += 1
        log = open(self.workdir / f"mosquitto-{self.starts}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=log, stderr=log)
        log.close()
        ports = [p for p in (self.port, self.tls_port) if p is not None]
        wait_until("mosquitto to listen", lambda: self._alive() and all(map(port_open, ports)))
        return self

    def _alive(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"mosquitto exited {self.proc.returncode}:\n{self.log()}")
        return True

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in
                         sorted(self.workdir.glob("mosquitto-*.log")))


class TcpGate:
    """A TCP relay from ``port`` to mosquitto: the uplink. ``close()`` cuts every relayed
    connection and refuses new ones (connection refused); ``open()`` listens again."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self.target = target_port
        self._listener: socket.socket | None = None
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.accepted = 0

    def open(self) -> TcpGate:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(16)
        self._listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()
        return self

    def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, set()
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)
            c.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns |= {client, upstream}
                self.accepted += 1
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


class Gatewayd:
    """gatewayd with a configuration file; ``kill()`` is SIGKILL, ``start()`` again
    reuses the same ports and data directory."""

    def __init__(self, workdir: Path, config: str) -> None:
        self.workdir = workdir
        self.mqtt_port = free_port()
        self.api_port = free_port()
        self.data_dir = workdir / "data"
        self.config_path = workdir / "gateway.toml"
        self.config_path.parent.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(
            f'[node]\nname = "edge1@127.0.0.1"\ndata_dir = "{self.data_dir}"\n'
            f'[listeners.tcp.default]\nbind = "127.0.0.1:{self.mqtt_port}"\n'
            f"max_connections = 1000\n"
            f"[mqtt]\nmax_inflight = 1000\n"  # the test clients' window (see Client)
            f'[api]\nbind = "127.0.0.1:{self.api_port}"\n' + config
        )
        self.process: GatewaydProcess | None = None
        self.starts = 0

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.process.proc if self.process is not None else None

    def start(self) -> Gatewayd:
        self.starts += 1
        self.process = GatewaydProcess(
            self.workdir, gatewayd_env(),
            command=gatewayd_command("--config", str(self.config_path)),
            log_path=self.workdir / f"gatewayd-{self.starts}.log",
        ).start()
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown, no last commit, no DISCONNECT."""
        assert self.process is not None
        self.process.kill()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def log(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in
                         sorted(self.workdir.glob("gatewayd-*.log")))

    def http(self, method: str, path: str, *, auth: bool = True) -> tuple[int, bytes]:
        headers = {}
        if auth:
            token = (self.data_dir / "api.token").read_text().strip()
            headers["Authorization"] = f"Bearer {token}"
        conn = http.client.HTTPConnection("127.0.0.1", self.api_port, timeout=10)
        try:
            conn.request(method, path, headers=headers)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def bridge(self, name: str = "cloud") -> dict[str, Any]:
        status, body = self.http("GET", "/api/v5/bridges")
        assert status == 200, body
        for b in json.loads(body)["bridges"]:
            if b["name"] == name:
                return dict(b)
        raise AssertionError(f"no bridge {name} in {body!r}")

    def wait_bridge(self, what: str, predicate: Callable[[dict[str, Any]], bool],
                    name: str = "cloud") -> dict[str, Any]:
        view: dict[str, Any] = {}

        def check() -> bool:
            nonlocal view
            view = self.bridge(name)
            return predicate(view)

        try:
            wait_until(f"bridge {name}: {what}", check)
        except AssertionError:
            raise AssertionError(f"bridge {name}: {what}; last view {view}") from None
        return view


class Client:
    """A paho client whose steps are awaited on events; messages land on a queue."""

    def __init__(self, port: int, client_id: str, *, version: int = 4) -> None:
        proto = {4: mqtt.MQTTv311, 5: mqtt.MQTTv5}[version]
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=proto)
        # wide enough that paho never holds a QoS 1 message back while a later QoS 0 one
        # goes out (order on the wire = order of the calls)
        self.c.max_inflight_messages_set(1000)
        self.c.max_queued_messages_set(0)
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connected = threading.Event()
        self.subscribed = threading.Event()
        self.c.on_connect = lambda c, u, f, rc, p: self.connected.set()
        self.c.on_subscribe = lambda c, u, mid, rcs, p: self.subscribed.set()
        self.c.on_message = lambda c, u, m: self.messages.put(m)
        self.c.connect("127.0.0.1", port, keepalive=60)
        self.c.loop_start()
        assert self.connected.wait(WAIT), f"{client_id} did not connect"

    def subscribe(self, topic: str, qos: int = 1) -> Client:
        self.subscribed.clear()
        self.c.subscribe(topic, qos)
        assert self.subscribed.wait(WAIT), f"no SUBACK for {topic}"
        return self

    def publish_all(self, messages: list[tuple[str, bytes, int]]) -> None:
        """Publish, then wait for every acknowledgement (PUBACK: durable at the broker)."""
        infos = [self.c.publish(t, p, qos=q) for t, p, q in messages]
        for info in infos:
            info.wait_for_publish(WAIT)
            assert info.is_published(), "not acknowledged"

    def take(self, n: int, timeout: float = WAIT) -> list[mqtt.MQTTMessage]:
        """The next ``n`` messages (each within ``timeout`` of the previous one)."""
        out = []
        for _ in range(n):
            try:
                out.append(self.messages.get(timeout=timeout))
            except queue.Empty:
                raise AssertionError(f"got {len(out)} of {n} messages") from None
        return out

    def take_until(self, topic: str, timeout: float = WAIT) -> list[mqtt.MQTTMessage]:
        """Every message up to and including the first on ``topic``."""
        out: list[mqtt.MQTTMessage] = []
        while True:
            try:
                m = self.messages.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"nothing on {topic}; got {len(out)} others") from None
            out.append(m)
            if m.topic == topic:
                return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.c.disconnect()
        self.c.loop_stop()
