"""QoS 2 exactly once across a power cut, end to end: the rig's paho device
(:class:`hil.simulators.paho_async.Client`), a real gatewayd with its SQLite file, and
``kill -9`` at a chosen point of the QoS 2 flow, then reconnect attempts that fail while
the unit is down (as they do during the QEMU image's cold boot) before one succeeds.

- PUBREL phase: the device sent PUBREL and the broker committed its end of the flow (the
  PUBCOMP is in the device's socket, unread), then the power goes. The device must send
  the PUBREL again, not the PUBLISH: for the broker a PUBLISH with a completed packet id
  is a new message. paho-mqtt 2.2 itself gets this wrong after the second
  ``reconnect()`` (the canary below shows it, so the scenario really exercises the bug;
  when it fails, paho is fixed and the rig's override can go).
- PUBLISH phase: the broker committed the message and its awaiting-PUBREL record (the
  PUBREC is in the device's socket, unread). The device re-sends the PUBLISH (DUP); the
  restarted broker must answer PUBREC without delivering it again (its awaiting-PUBREL
  row survived the kill).

The subscriber is an offline persistent session (its copy waits in the store's queue),
read after the restart; a last message from the same device marks the end (one
session's deliveries keep their order), so no test waits on a clock.

- Random kills: four devices on paho's own threads publish bursts, gatewayd is killed
  at a seeded random moment of each burst; every message must end up acknowledged and
  received exactly once. A wider net than the tests above, not a sure one: with paho's
  own Client it once found 2 duplicates (seed 1), and once passed.
"""

from __future__ import annotations

import collections
import os
import random
import select
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from hil.simulators.paho_async import Client
from tests.gateway.admin.gatewayd import Gatewayd

pytestmark = [pytest.mark.hil, pytest.mark.slow, pytest.mark.timeout(120)]

WAIT = 15.0
FAILED_ATTEMPTS = 3  # reconnects refused while the unit is down


def connect_props() -> Properties:
    p = Properties(PacketTypes.CONNECT)
    p.SessionExpiryInterval = 3600
    return p


class Collector:
    """A persistent MQTT 5 session subscribed to ``t/#`` at QoS 2 (paho, its own thread)."""

    def __init__(self, gw: Gatewayd) -> None:
        self.got: list[bytes] = []
        self.end = threading.Event()
        up = threading.Event()
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="collector",
                        protocol=mqtt.MQTTv5)
        c.on_connect = lambda *a: up.set()
        c.on_message = self._on_message
        c.connect("127.0.0.1", gw.mqtt_port, 30, clean_start=False, properties=connect_props())
        c.loop_start()
        assert up.wait(WAIT), "collector: no CONNACK"
        self.c = c

    def _on_message(self, c: mqtt.Client, userdata: object, m: mqtt.MQTTMessage) -> None:
        self.got.append(bytes(m.payload))
        if m.payload == b"end":
            self.end.set()

    def subscribe(self) -> None:
        done = threading.Event()
        self.c.on_subscribe = lambda *a: done.set()
        self.c.subscribe("t/#", 2)
        assert done.wait(WAIT), "collector: no SUBACK"

    def close(self) -> None:
        self.c.disconnect()  # session expiry 3600: the session stays, offline
        self.c.loop_stop()


def device(cls: type[mqtt.Client], gw: Gatewayd, version: int) -> mqtt.Client:
    """A persistent device session, driven step by step on this thread."""
    if version == 5:
        d = cls(CallbackAPIVersion.VERSION2, client_id="dev", protocol=mqtt.MQTTv5)
        d.connect("127.0.0.1", gw.mqtt_port, 30, clean_start=False, properties=connect_props())
    else:
        d = cls(CallbackAPIVersion.VERSION2, client_id="dev", protocol=mqtt.MQTTv311,
                clean_session=False)
        d.connect("127.0.0.1", gw.mqtt_port, 30)
    until(d, d.is_connected, "CONNACK")
    return d


def until(d: mqtt.Client, cond: object, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"device: no {what}"
        d.loop(0.05)  # one select() on the socket: returns as soon as a packet arrives


def answer_waiting(d: mqtt.Client) -> None:
    """Until the broker's next packet is in the device's socket (not read)."""
    d.loop_write()
    sock = d.socket()
    assert sock is not None
    r, _, _ = select.select([sock], [], [], WAIT)
    assert r, "the broker did not answer"


def power_cut_in(phase: str, cls: type[mqtt.Client], tmp_path: Path, version: int) -> list[bytes]:
    """Publish b"m1" at QoS 2, kill -9 gatewayd at ``phase``, fail FAILED_ATTEMPTS
    reconnects, restart, finish the flow, publish b"end"; what the collector got."""
    gw = Gatewayd(tmp_path / "gw").start()
    try:
        col = Collector(gw)
        col.subscribe()
        col.close()
        dev = device(cls, gw, version)
        info = dev.publish("t/dev", b"m1", qos=2)
        m = dev._out_messages[info.mid]
        if phase == "pubrel":
            until(dev, lambda: m.state == mqtt.mqtt_ms_wait_for_pubcomp, "PUBREC")
        answer_waiting(dev)  # the PUBCOMP (pubrel) or PUBREC (publish) is committed
        assert gw.proc is not None
        gw.proc.kill()
        gw.proc.wait()
        for _ in range(FAILED_ATTEMPTS):
            with pytest.raises(ConnectionRefusedError):
                dev.reconnect()
        gw.start()
        col = Collector(gw)
        dev.reconnect()
        until(dev, info.is_published, "PUBCOMP")
        end = dev.publish("t/dev", b"end", qos=2)
        until(dev, end.is_published, "PUBCOMP of the end mark")
        assert col.end.wait(WAIT), f"collector: no end mark, got {col.got}"
        col.close()
        dev.disconnect()
        return col.got
    finally:
        gw.stop()


@pytest.mark.parametrize("version", [5, 4], ids=["mqtt5", "mqtt311"])
@pytest.mark.parametrize("phase", ["pubrel", "publish"])
def test_qos2_exactly_once_across_kill_and_failed_reconnects(
    tmp_path: Path, phase: str, version: int
) -> None:
    got = power_cut_in(phase, Client, tmp_path, version)
    assert got == [b"m1", b"end"], got


def test_canary_plain_paho_publishes_again_after_pubrel(tmp_path: Path) -> None:
    """paho-mqtt's own Client re-sends the PUBLISH after a failed reconnect: the
    subscriber gets the message twice. If this fails, paho fixed its reconnect and
    :class:`hil.simulators.paho_async.Client` is no longer needed."""
    got = power_cut_in("pubrel", mqtt.Client, tmp_path, 5)
    assert got == [b"m1", b"m1", b"end"], got


class _Counting(Client):
    """The rig's client, counting refused reconnect attempts (paho's own thread makes
    them, every ``reconnect_delay``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.refused = 0
        self.refused_event = threading.Event()

    def reconnect(self) -> MQTTErrorCode:
        try:
            return super().reconnect()
        except ConnectionRefusedError:
            self.refused += 1
            self.refused_event.set()
            raise


@pytest.mark.skipif(not os.environ.get("GATEWAY_STRESS"),
                    reason="stress test, run by hand: GATEWAY_STRESS=1 (it passes in ~25 s "
                    "on a quiet machine, but under CI's parallel load it once ran past "
                    "300 s; the deterministic cases above are what CI relies on)")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("seed", [1])
def test_qos2_exactly_once_across_random_kills(tmp_path: Path, seed: int) -> None:
    """Four devices (paho's own network threads, persistent MQTT 5) publish bursts of
    QoS 2; gatewayd is killed at a random moment of each of three bursts and restarted
    once every device had a reconnect refused. In the end every message is acknowledged
    and the collector has each exactly once."""
    rnd = random.Random(seed)
    gw = Gatewayd(tmp_path / "gw").start()
    got: collections.Counter[str] = collections.Counter()
    acked: set[str] = set()
    sent: dict[tuple[int, int], str] = {}
    cond = threading.Condition()
    try:
        col = Collector(gw)
        col.subscribe()

        def on_message(c: mqtt.Client, u: object, m: mqtt.MQTTMessage) -> None:
            with cond:
                got[m.payload.decode()] += 1
                cond.notify_all()
        col.c.on_message = on_message
        col.c.reconnect_delay_set(1, 1)
        devs: list[_Counting] = []
        for i in range(4):
            d = _Counting(CallbackAPIVersion.VERSION2, client_id=f"dev{i}", protocol=mqtt.MQTTv5)
            d.reconnect_delay_set(1, 1)

            def on_publish(c: mqtt.Client, u: object, mid: int, rc: object, p: object,
                           i: int = i) -> None:
                with cond:
                    acked.add(sent[(i, mid)])
                    cond.notify_all()
            d.on_publish = on_publish
            d.connect("127.0.0.1", gw.mqtt_port, 5, clean_start=False,
                      properties=connect_props())
            d.loop_start()
            devs.append(d)
        for burst in range(4):
            for d in devs:  # each connected again before the next burst
                until_connected(d)
            for n in range(60):
                for i, d in enumerate(devs):
                    with cond:  # the mid is known before its PUBCOMP can arrive
                        info = d.publish("t/dev", f"{i}:{burst}:{n}".encode(), qos=2)
                        sent[(i, info.mid)] = f"{i}:{burst}:{n}"
            if burst == 3:
                break
            time.sleep(rnd.uniform(0.0, 0.3))  # the fault's moment, within the burst
            assert gw.proc is not None
            gw.proc.kill()
            gw.proc.wait()
            for d in devs:
                d.refused_event.clear()
            for d in devs:
                assert d.refused_event.wait(WAIT), "a device never tried to reconnect"
            gw.start()
        want = set(sent.values())
        with cond:
            assert cond.wait_for(lambda: len(acked) == len(sent), 60), (
                f"{len(sent) - len(acked)} of {len(sent)} never acknowledged")
            assert cond.wait_for(lambda: want <= set(got), 60), (
                f"{len(want - set(got))} acknowledged messages never arrived")
        # end marks: a duplicate still on its way arrives before them (one session each)
        for d in devs:
            with cond:
                info = d.publish("t/dev", b"end", qos=2)
                sent[(devs.index(d), info.mid)] = "end"
        with cond:
            assert cond.wait_for(lambda: got["end"] >= len(devs), WAIT), "no end marks"
            dups = sorted(m for m, k in got.items() if k > 1 and m != "end")
        print(f"seed {seed}: {len(want)} QoS 2 messages, 3 kills, "
              f"{sum(d.refused for d in devs)} refused reconnects, {len(dups)} duplicates")
        assert not dups, dups
        for d in devs:
            d.disconnect()
            d.loop_stop()
        col.close()
    finally:
        gw.stop()


def until_connected(d: mqtt.Client) -> None:
    deadline = time.monotonic() + 60
    while not d.is_connected():
        assert time.monotonic() < deadline, "a device did not reconnect"
        time.sleep(0.05)  # paho's own thread connects; polled, bounded
