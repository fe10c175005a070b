"""Delayed publish is durable: ``kill -9`` in the middle loses no acknowledged delayed
message; they fire when due after the restart. And the count limit answers 0x97."""

from __future__ import annotations

import queue
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.gateway.admin.gatewayd import WAIT, Client, q
from tests.gateway.ext.conftest import ExtGatewayd, make

pytestmark = [pytest.mark.ext, pytest.mark.slow]
API = "/api/v5/mqtt"


class Publisher:
    """A paho MQTT 5 publisher that keeps the reason code of every PUBACK."""

    def __init__(self, gw: ExtGatewayd, cid: str) -> None:
        self.c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=cid, protocol=mqtt.MQTTv5)
        self.acks: queue.Queue[tuple[int, int]] = queue.Queue()
        self.c.on_publish = lambda c, u, mid, rc, p: self.acks.put((mid, int(rc.value)))
        connected: queue.Queue[Any] = queue.Queue()
        self.c.on_connect = lambda c, u, f, rc, p: connected.put(rc)
        self.c.connect("127.0.0.1", gw.mqtt_port)
        self.c.loop_start()
        connected.get(timeout=WAIT)

    def publish(self, topic: str, payload: bytes, qos: int = 1) -> int:
        """The PUBACK's reason code."""
        info = self.c.publish(topic, payload, qos=qos)
        mid, rc = self.acks.get(timeout=WAIT)
        assert mid == info.mid
        return rc

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


def test_kill_9_loses_no_acknowledged_delayed_message_and_the_limit_holds(
    tmp_path: Path,
) -> None:
    gw = make(tmp_path / "gw", {"GATEWAY_DELAYED__MAX_DELAYED_MESSAGES": "4"})
    gw.start()
    try:
        # a persistent subscriber: what fires while it is away is queued for it
        sub = Client(gw, "dl-sub", version=5, clean=True, session_expiry=600)
        sub.subscribe("due/#", 1)
        sub.close()
        assert sub.disconnected.wait(WAIT)
        pub = Publisher(gw, "dl-pub")
        codes = [pub.publish(f"$delayed/{d}/due/{i}", f"m{i}".encode())
                 for i, d in enumerate((2, 3, 4))]
        codes.append(pub.publish("$delayed/600/due/late", b"late"))
        # full (4 waiting): QoS 1 refused with 0x97, QoS 0 dropped
        codes.append(pub.publish("$delayed/2/due/refused", b"no"))
        pub.c.publish("$delayed/2/due/refused0", b"no", qos=0)
        assert codes[:4] == [0x10, 0x10, 0x10, 0x10]  # EMQX's "no matching subscribers"
        assert codes[4] == 0x97
        pub.close()
        assert gw.proc is not None
        gw.proc.kill()  # kill -9 right after the acknowledgements
        gw.proc.wait(WAIT)
        gw.start()
        listed = gw.get(f"{API}/delayed/messages")["data"]
        assert "due/late" in [m["topic"] for m in listed]
        late = next(m for m in listed if m["topic"] == "due/late")
        status, _, _ = gw.http(
            "DELETE", f"{API}/delayed/messages/{q(gw.node_name)}/{late['msgid']}")
        assert status == 204
        sub2 = Client(gw, "dl-sub", version=5, clean=False, session_expiry=600)
        try:
            got = sorted(sub2.next_message(WAIT + 5).topic for _ in range(3))
            assert got == ["due/0", "due/1", "due/2"]
            with pytest.raises(queue.Empty):
                m = sub2.next_message(1.0)
                raise AssertionError(f"unexpected {m.topic}")
        finally:
            sub2.close()
        assert gw.get(f"{API}/delayed")["count"] == 0
        metrics = gw.get("/api/v5/metrics")
        metrics = metrics[0] if isinstance(metrics, list) else metrics
        assert metrics["messages.delayed.published"] == 3
    finally:
        gw.stop()


def test_restart_with_sigterm_keeps_them_too(tmp_path: Path) -> None:
    gw = make(tmp_path / "gw")
    gw.start()
    try:
        pub = Publisher(gw, "dl-pub2")
        assert pub.publish("$delayed/3600/keep/me", b"1") == 0x10
        pub.close()
        gw.stop()
        gw.start()
        t0 = time.monotonic()
        rows = gw.get(f"{API}/delayed/messages")["data"]
        assert [(m["topic"], m["from_clientid"]) for m in rows] == [("keep/me", "dl-pub2")]
        assert 3500 < rows[0]["delayed_remaining"] <= 3600 - (time.monotonic() - t0) + 1
    finally:
        gw.stop()
