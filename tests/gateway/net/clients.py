"""Independent TLS clients for the listener tests: paho-mqtt (``tls_set``) and the
mosquitto command-line tools (``--cafile``, ``--cert``, ``--key``).

Every wait is on an event, a queue or a process with a timeout; nothing sleeps.
"""

from __future__ import annotations

import queue
import shutil
import socket
import ssl
import subprocess
import threading
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion

TIMEOUT = 10.0
HAVE_MOSQUITTO_CLIENTS = bool(shutil.which("mosquitto_pub") and shutil.which("mosquitto_sub"))


class Refused(Exception):
    """The connection did not get a successful CONNACK (TLS failure, refusal, close)."""


class Client:
    """A paho client; ``connect()`` blocks until a successful CONNACK or raises Refused."""

    def __init__(
        self,
        addr: tuple[str, int],
        *,
        client_id: str = "",
        username: str | None = None,
        password: str | None = None,
        cafile: Path | None = None,
        cert: Path | None = None,
        key: Path | None = None,
        protocol: MQTTProtocolVersion = mqtt.MQTTv311,
    ) -> None:
        self.addr = addr
        self.c = c = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=protocol,
            reconnect_on_failure=False,  # a kicked client stays gone (no takeover loops)
        )
        if username is not None:
            c.username_pw_set(username, password)
        if cafile is not None:
            c.tls_set(
                ca_certs=str(cafile),
                certfile=str(cert) if cert else None,
                keyfile=str(key) if key else None,
            )
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.reason_code: int | None = None
        self._gone = threading.Event()
        self._done = threading.Event()  # a CONNACK or the end of the connection
        self._subscribed = threading.Event()
        self._published: dict[int, threading.Event] = {}
        self._lock = threading.Lock()
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_subscribe = lambda *a: self._subscribed.set()
        c.on_message = lambda client, userdata, msg: self.messages.put(msg)
        c.on_publish = self._on_publish

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self.reason_code = reason_code.value
        self._done.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self._gone.set()
        self._done.set()

    def _on_publish(self, client, userdata, mid, reason_code, properties) -> None:
        with self._lock:
            self._published.setdefault(mid, threading.Event()).set()

    def connect(self) -> Client:
        try:
            self.c.connect(*self.addr, keepalive=30)
        except (OSError, ssl.SSLError) as exc:
            raise Refused(f"connect failed: {exc!r}") from exc
        self.c.loop_start()
        self._done.wait(TIMEOUT)
        if self.reason_code != 0 or self._gone.is_set():
            self.close()
            raise Refused(f"no successful CONNACK (reason code {self.reason_code})")
        return self

    @property
    def connected(self) -> bool:
        return self.reason_code == 0 and not self._gone.is_set()

    def subscribe(self, topic: str, qos: int = 1) -> None:
        self._subscribed.clear()
        self.c.subscribe(topic, qos)
        assert self._subscribed.wait(TIMEOUT), "no SUBACK"

    def publish(self, topic: str, payload: bytes | str, qos: int = 1) -> None:
        info = self.c.publish(topic, payload, qos)
        if qos:
            with self._lock:
                event = self._published.setdefault(info.mid, threading.Event())
            assert event.wait(TIMEOUT), f"publish to {topic} not acknowledged"

    def receive(self) -> tuple[str, bytes]:
        msg = self.messages.get(timeout=TIMEOUT)
        return msg.topic, msg.payload

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def tls_peer_serial(addr: tuple[str, int], cafile: Path) -> int:
    """The serial number of the certificate a TLS server presents (a raw handshake)."""
    ctx = ssl.create_default_context(cafile=str(cafile))
    with socket.create_connection(addr, timeout=TIMEOUT) as raw, ctx.wrap_socket(
        raw, server_hostname=addr[0]
    ) as tls:
        cert = tls.getpeercert()
    assert cert is not None
    return int(str(cert["serialNumber"]), 16)


def mosquitto_args(
    addr: tuple[str, int], cafile: Path, cert: Path | None = None, key: Path | None = None
) -> list[str]:
    args = ["-h", addr[0], "-p", str(addr[1]), "--cafile", str(cafile)]
    if cert is not None and key is not None:
        args += ["--cert", str(cert), "--key", str(key)]
    return args


def mosquitto_pub(
    addr: tuple[str, int], cafile: Path, *args: str, cert: Path | None = None,
    key: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["mosquitto_pub", *mosquitto_args(addr, cafile, cert, key), *args],
        capture_output=True, text=True, timeout=TIMEOUT, check=False,
    )


class MosquittoSub:
    """``mosquitto_sub -d``, returned once its SUBACK line is printed."""

    def __init__(
        self, addr: tuple[str, int], cafile: Path, *args: str, cert: Path | None = None,
        key: Path | None = None,
    ) -> None:
        cli = ["mosquitto_sub", "-d", *mosquitto_args(addr, cafile, cert, key), *args]
        stdbuf = shutil.which("stdbuf")  # line-buffered output through the pipe
        self.proc = subprocess.Popen(
            [stdbuf, "-oL", *cli] if stdbuf else cli,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        try:
            while True:
                line = self.lines.get(timeout=TIMEOUT)
                if line is None:
                    raise Refused("mosquitto_sub exited before subscribing")
                if line.startswith("Subscribed (mid"):
                    return
        except BaseException:
            self.close()  # never leave the process behind
            raise

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next_message(self) -> str:
        """The next line that is not mosquitto_sub's debug output."""
        while True:
            line = self.lines.get(timeout=TIMEOUT)
            assert line is not None, "mosquitto_sub exited"
            if not line.startswith(("Client ", "Subscribed (mid")):
                return line

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=TIMEOUT)
