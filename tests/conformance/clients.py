"""Independent real clients: paho-mqtt (callback API v2) and the mosquitto command-line tools.

Every wait is on an event or a queue with a timeout; nothing sleeps. ``PahoClient`` runs
paho's network loop in its thread and turns callbacks into events and a message queue.
``MosquittoSub`` runs ``mosquitto_sub -d`` and waits for its "Subscribed" line before
returning, so a publish made afterwards cannot race the subscription.
"""

from __future__ import annotations

import queue
import shutil
import subprocess
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

TIMEOUT = 5.0

MQTTv311 = mqtt.MQTTv311
MQTTv5 = mqtt.MQTTv5


class PahoClient:
    """A paho client bound to one broker; ``connect()`` blocks until CONNACK."""

    def __init__(
        self,
        addr: tuple[str, int],
        *,
        protocol: MQTTProtocolVersion = MQTTv311,
        client_id: str = "",
        clean: bool = True,
    ) -> None:
        self.addr = addr
        self.protocol = protocol
        self.clean = clean
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=protocol,
            clean_session=None if protocol == MQTTv5 else clean,
        )
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.connack: tuple[object, object, object] | None = None
        self._connected = threading.Event()
        self._disconnected = threading.Event()
        self._subacks: dict[int, list[object]] = {}
        self._sub_event = threading.Condition()
        self.disconnect_reason: object = None
        c = self.client
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_subscribe = self._on_subscribe
        c.on_message = self._on_message

    # ---- callbacks (paho's thread)

    def _on_connect(self, client, userdata, flags, reason_code, properties) -> None:
        self.connack = (flags, reason_code, properties)
        self._connected.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties) -> None:
        self.disconnect_reason = reason_code
        self._disconnected.set()

    def _on_subscribe(self, client, userdata, mid, reason_codes, properties) -> None:
        with self._sub_event:
            self._subacks[mid] = list(reason_codes)
            self._sub_event.notify_all()

    def _on_message(self, client, userdata, message) -> None:
        self.messages.put(message)

    # ---- API

    def connect(
        self,
        *,
        keepalive: int = 60,
        properties: Properties | None = None,
        will: tuple[str, bytes, int, bool] | None = None,
    ) -> PahoClient:
        if will is not None:
            self.client.will_set(*will)
        if self.protocol == MQTTv5:
            self.client.connect(
                self.addr[0], self.addr[1], keepalive, clean_start=self.clean, properties=properties
            )
        else:
            self.client.connect(self.addr[0], self.addr[1], keepalive)
        self.client.loop_start()
        if not self._connected.wait(TIMEOUT):
            self.client.loop_stop()
            raise AssertionError("paho: no CONNACK within timeout")
        assert self.connack is not None
        rc = self.connack[1]
        assert not getattr(rc, "is_failure", False), f"paho CONNACK refused: {rc}"
        return self

    def subscribe(
        self,
        topic: str,
        qos: int = 0,
        *,
        options: SubscribeOptions | None = None,
        properties: Properties | None = None,
    ) -> list[object]:
        if self.protocol == MQTTv5:
            opts = options or SubscribeOptions(qos=qos)
            result, mid = self.client.subscribe(topic, options=opts, properties=properties)
        else:
            result, mid = self.client.subscribe(topic, qos)
        assert result == mqtt.MQTT_ERR_SUCCESS and mid is not None, f"paho subscribe: {result}"
        with self._sub_event:
            ok = self._sub_event.wait_for(lambda: mid in self._subacks, TIMEOUT)
        assert ok, f"paho: no SUBACK for {topic!r}"
        return self._subacks[mid]

    def publish(
        self,
        topic: str,
        payload: bytes = b"",
        qos: int = 0,
        retain: bool = False,
        properties: Properties | None = None,
    ) -> None:
        """Publish and wait until the QoS flow completes (PUBACK / PUBCOMP / written)."""
        info = self.client.publish(topic, payload, qos=qos, retain=retain, properties=properties)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published(), f"paho: publish to {topic!r} did not complete"

    def get(self, timeout: float = TIMEOUT) -> mqtt.MQTTMessage:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"paho: no message within {timeout}s") from None

    def expect_nothing(self, timeout: float = 0.5) -> None:
        try:
            msg = self.messages.get(timeout=timeout)
        except queue.Empty:
            return
        raise AssertionError(f"paho: unexpected message on {msg.topic!r}: {msg.payload!r}")

    def disconnect(self) -> None:
        self.client.disconnect()
        self._disconnected.wait(TIMEOUT)
        self.client.loop_stop()

    def close(self) -> None:
        """Stop the loop; disconnect politely if still connected."""
        if self.client.is_connected():
            self.disconnect()
        else:
            self.client.loop_stop()

    def __enter__(self) -> PahoClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def v5_properties(packet_type: int, **fields: object) -> Properties:
    """``v5_properties(PacketTypes.PUBLISH, ContentType="text/plain", UserProperty=[...])``."""
    props = Properties(packet_type)
    for name, value in fields.items():
        setattr(props, name, value)
    return props


# --------------------------------------------------------------------------- mosquitto CLI


def _cli(name: str) -> str:
    path = shutil.which(name)
    assert path, f"{name} not installed"
    return path


def mosquitto_pub(
    addr: tuple[str, int],
    topic: str,
    payload: str | None,
    *,
    version: str = "mqttv311",
    qos: int = 0,
    retain: bool = False,
    extra: Sequence[str] = (),
) -> None:
    """Run mosquitto_pub once (``payload=None`` sends a zero-length payload)."""
    cmd = [
        _cli("mosquitto_pub"),
        "-h",
        addr[0],
        "-p",
        str(addr[1]),
        "-V",
        version,
        "-t",
        topic,
        *(["-n"] if payload is None else ["-m", payload]),
        "-q",
        str(qos),
        *(["-r"] if retain else []),
        *extra,
    ]
    done = subprocess.run(cmd, capture_output=True, timeout=TIMEOUT * 2, check=False)
    assert done.returncode == 0, f"{cmd} failed: {done.stderr.decode(errors='replace')}"


@dataclass
class CliMessage:
    topic: str
    qos: int
    retain: bool
    user_property: str
    payload: str


_FIELD_SEP = "\x1f"


class MosquittoSub:
    """``mosquitto_sub -d`` in the background; ``start()`` returns once SUBACK is printed."""

    def __init__(
        self,
        addr: tuple[str, int],
        topic: str,
        *,
        version: str = "mqttv311",
        qos: int = 0,
        extra: Sequence[str] = (),
    ) -> None:
        fmt = _FIELD_SEP.join(["MSG", "%t", "%q", "%r", "%P", "%p"])
        cli = [
            _cli("mosquitto_sub"),
            "-h",
            addr[0],
            "-p",
            str(addr[1]),
            "-V",
            version,
            "-t",
            topic,
            "-q",
            str(qos),
            "-d",
            "-F",
            fmt,
            *extra,
        ]
        stdbuf = shutil.which("stdbuf")
        self.cmd = [stdbuf, "-oL", *cli] if stdbuf else cli
        self.proc: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self.messages: queue.Queue[CliMessage] = queue.Queue()
        self._subscribed = threading.Event()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.rstrip("\n")
            self.lines.append(line)
            if line.startswith("Subscribed (mid"):
                self._subscribed.set()
            elif line.startswith("MSG" + _FIELD_SEP):
                _, topic, qos, retain, user, payload = line.split(_FIELD_SEP, 5)
                self.messages.put(CliMessage(topic, int(qos), retain == "1", user, payload))

    def start(self) -> MosquittoSub:
        self.proc = subprocess.Popen(
            self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        threading.Thread(target=self._read, daemon=True).start()
        if not self._subscribed.wait(TIMEOUT):
            self.stop()
            raise AssertionError(f"mosquitto_sub never subscribed: {self.lines}")
        return self

    def get(self, timeout: float = TIMEOUT) -> CliMessage:
        try:
            return self.messages.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"mosquitto_sub got nothing; output: {self.lines}") from None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def __enter__(self) -> MosquittoSub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
