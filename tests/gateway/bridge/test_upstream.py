"""Acceptance: gatewayd bridged to a real mosquitto.

- The uplink goes down while messages are published locally, gatewayd is killed (SIGKILL)
  and restarted meanwhile, the uplink comes back: every message arrives upstream, in
  order per topic, none lost (two ways down: the network cut, with the upstream session
  kept; and the upstream broker restarted, persistence off, its session gone).
- Upstream-to-local subscriptions.
- TLS and mutual TLS to upstream, with certificates from ``gatewayctl certs``.
- Loop prevention when a forward and a subscription overlap.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from .conftest import Procs
from .support import Client, Gatewayd, Mosquitto, TcpGate, needs_mosquitto

pytestmark = [needs_mosquitto, pytest.mark.interop, pytest.mark.slow]

TOPICS = 4


def bridge_config(port: int, proto: str = "v5", extra: str = "", *, forwards: str = "",
                  subscriptions: str = "") -> str:
    return f"""
[bridges.mqtt.cloud]
server = "127.0.0.1:{port}"
proto_ver = "{proto}"
clientid = "edge-1"
keepalive = 30
{extra}
[bridges.mqtt.cloud.reconnect]
initial = "100ms"
max = "500ms"
{forwards or '''
[[bridges.mqtt.cloud.forwards]]
local = "tele/#"
remote = "fleet/edge-1/${topic}"
'''}
{subscriptions}
"""


def batch(start: int, n: int) -> list[tuple[str, bytes, int]]:
    """``n`` messages over TOPICS topics, sequence numbers from ``start``; QoS 1 mostly,
    every fifth QoS 0 (queued durably too while upstream is down)."""
    return [(f"tele/d{i % TOPICS}", f"{i}".encode(), 0 if i % 5 == 4 else 1)
            for i in range(start, start + n)]


def per_topic(messages: list[tuple[str, bytes]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for topic, payload in messages:
        out[topic].append(int(payload))
    return dict(out)


def differences(seen: dict[str, list[int]], expected: dict[str, list[int]]) -> list[str]:
    """What is wrong, per topic: missing, duplicated, out of order."""
    out = []
    for topic in sorted(set(seen) | set(expected)):
        got, want = seen.get(topic, []), expected.get(topic, [])
        missing = sorted(set(want) - set(got))
        dupes = sorted({x for x in got if got.count(x) > 1})
        disorder = [(a, b) for a, b in itertools.pairwise(got) if b < a]
        if missing or dupes or disorder or len(got) != len(want):
            out.append(f"{topic}: missing {missing[:10]} ({len(missing)}), "
                       f"duplicated {dupes[:10]}, out of order {disorder[:5]}")
    return out


@pytest.mark.parametrize(("proto", "outage"), [("v5", "network"), ("v4", "broker_restart")])
def test_outbox_survives_outage_and_kill9(tmp_path: Path, procs: Procs, proto: str,
                                          outage: str) -> None:
    n1, n2 = 300, 300
    mosq = procs.add(Mosquitto(tmp_path / "mosquitto").start())
    gate = procs.add(TcpGate(mosq.port).open())
    observer = procs.add(Client(mosq.port, "observer", version=4).subscribe("fleet/#", 1))
    gw = procs.add(Gatewayd(tmp_path / "gw", bridge_config(gate.port, proto)).start())
    gw.wait_bridge("connected", lambda b: b["status"] == "connected")
    device = procs.add(Client(gw.mqtt_port, "dev"))
    device.publish_all([("tele/before", b"-1", 1)])
    assert [m.topic for m in observer.take(1)] == ["fleet/edge-1/tele/before"]
    # the upstream's PUBACK may still be on its way when the observer has the message;
    # cutting the link before it arrives leaves that message in the outbox (rightly)
    gw.wait_bridge("before acked", lambda b: b["acked"] == 1)

    # the uplink goes down
    gate.close()
    if outage == "broker_restart":
        observer.close()
        mosq.stop()
    gw.wait_bridge("disconnected", lambda b: b["status"] == "disconnected")
    device.publish_all(batch(0, n1))  # every PUBACK: the message is in the outbox on disk
    queued = gw.wait_bridge("everything queued", lambda b: b["queue_len"] == n1)
    assert queued["oldest_age"] is not None and queued["queue_bytes"] > 0

    # gatewayd dies and comes back while the uplink is still down
    device.close()
    gw.kill()
    gw.start()
    restored = gw.bridge()
    assert restored["queue_len"] == n1 and restored["status"] != "connected"
    device = procs.add(Client(gw.mqtt_port, "dev2"))
    device.publish_all(batch(n1, n2))
    gw.wait_bridge("everything queued", lambda b: b["queue_len"] == n1 + n2)

    # the uplink returns
    if outage == "broker_restart":
        mosq.start()
        observer = procs.add(Client(mosq.port, "observer", version=4).subscribe("fleet/#", 1))
    gate.open()
    got = observer.take(n1 + n2)
    seen = per_topic([(m.topic, m.payload) for m in got])
    expected = per_topic([(f"fleet/edge-1/{t}", p) for t, p, _ in batch(0, n1 + n2)])
    assert not differences(seen, expected)  # all of them, once each, in order per topic
    assert [int(m.payload) for m in got] == list(range(n1 + n2))  # and overall FIFO
    done = gw.wait_bridge("outbox empty", lambda b: b["queue_len"] == 0)
    assert done["status"] == "connected" and done["oldest_age"] is None
    if outage == "network" and proto == "v5":
        assert done["session_present"] is True  # the upstream kept our session


def test_upstream_subscriptions_reach_local_subscribers(tmp_path: Path, procs: Procs) -> None:
    mosq = procs.add(Mosquitto(tmp_path / "mosquitto").start())
    subs = """
[[bridges.mqtt.cloud.subscriptions]]
remote = "cmd/edge-1/#"
local = "down/${topic}"
qos = 2
"""
    gw = procs.add(Gatewayd(tmp_path / "gw", bridge_config(mosq.port, "v5",
                                                           subscriptions=subs)).start())
    gw.wait_bridge("connected", lambda b: b["status"] == "connected")
    local = procs.add(Client(gw.mqtt_port, "app").subscribe("down/#", 2))
    cloud = procs.add(Client(mosq.port, "cloud-app"))
    sent = [(f"cmd/edge-1/{i}", f"c{i}".encode(), i % 3) for i in range(30)]
    cloud.publish_all(sent)
    got = local.take(len(sent))
    assert sorted((m.topic, m.payload) for m in got) == sorted(
        (f"down/{t}", p) for t, p, _ in sent)
    for q in range(3):  # in order for each QoS (each QoS is its own flow upstream)
        assert [m.payload for m in got if int(m.topic.rsplit("/", 1)[1]) % 3 == q] == [
            p for _, p, qq in sent if qq == q]
    view = gw.wait_bridge("received counted", lambda b: b["received"] == len(sent))
    assert view["last_error"] is None


def make_certs(pki: Path) -> None:
    ctl = [sys.executable, "-m", "gateway.cli.gatewayctl", "certs"]
    for args in (["init-ca", str(pki)], ["issue", str(pki), "upstream", "--server"],
                 ["issue", str(pki), "edge-1", "--client"],
                 ["init-ca", str(pki / "other")],
                 ["issue", str(pki / "other"), "stranger", "--client"]):
        subprocess.run([*ctl, *args], check=True, capture_output=True)


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mutual_tls"])
def test_tls_to_upstream(tmp_path: Path, procs: Procs, mutual: bool) -> None:
    pki = tmp_path / "pki"
    make_certs(pki)
    tls = {"cafile": pki / "ca.crt", "certfile": pki / "upstream.crt",
           "keyfile": pki / "upstream.key"}
    if mutual:
        tls |= {"require_certificate": "true", "use_identity_as_username": "true"}
    mosq = procs.add(Mosquitto(tmp_path / "mosquitto", tls=tls).start())
    observer = procs.add(Client(mosq.port, "observer").subscribe("fleet/#", 1))
    client_cert = (f'certfile = "{pki / "edge-1.crt"}"\nkeyfile = "{pki / "edge-1.key"}"\n'
                   if mutual else "")
    extra = f"""
[bridges.mqtt.cloud.tls]
enable = true
cacertfile = "{pki / "ca.crt"}"
server_name_indication = "localhost"
{client_cert}"""
    assert mosq.tls_port is not None
    gw = procs.add(Gatewayd(tmp_path / "gw", bridge_config(mosq.tls_port, "v4", extra)).start())
    view = gw.wait_bridge("connected", lambda b: b["status"] == "connected")
    assert view["upstream"] == f"mqtts://127.0.0.1:{mosq.tls_port}"
    device = procs.add(Client(gw.mqtt_port, "dev"))
    device.publish_all([("tele/t", b"secret", 1)])
    [m] = observer.take(1)
    assert (m.topic, m.payload) == ("fleet/edge-1/tele/t", b"secret")
    if mutual:
        assert "edge-1" in mosq.log()  # the certificate's CN became the user name


def test_tls_failures_are_reported_not_fatal(tmp_path: Path, procs: Procs) -> None:
    """Mutual TLS without a client certificate, and a server from another CA: the bridge
    keeps retrying and says why; messages wait in the outbox."""
    pki = tmp_path / "pki"
    make_certs(pki)
    tls = {"cafile": pki / "ca.crt", "certfile": pki / "upstream.crt",
           "keyfile": pki / "upstream.key", "require_certificate": "true"}
    mosq = procs.add(Mosquitto(tmp_path / "mosquitto", tls=tls).start())
    assert mosq.tls_port is not None
    extra = f"""
[bridges.mqtt.cloud.tls]
enable = true
cacertfile = "{pki / "other" / "ca.crt"}"
"""
    gw = procs.add(Gatewayd(tmp_path / "gw", bridge_config(mosq.tls_port, "v4", extra)).start())
    view = gw.wait_bridge("an error", lambda b: b["last_error"] is not None)
    assert "certificate verif" in view["last_error"], view
    device = procs.add(Client(gw.mqtt_port, "dev"))
    device.publish_all([("tele/t", b"waits", 1)])
    view = gw.wait_bridge("queued", lambda b: b["queue_len"] == 1)
    assert view["status"] != "connected"


@pytest.mark.parametrize("mode", ["v5", "v4", "v4_bridge_mode"])
def test_loop_prevention_when_directions_overlap(tmp_path: Path, procs: Procs,
                                                 mode: str) -> None:
    """Forward ``loop/#`` up as itself and subscribe to ``loop/#`` upstream down as
    itself: a message must go up once, and never circulate."""
    proto = "v5" if mode == "v5" else "v4"
    extra = "bridge_mode = true" if mode == "v4_bridge_mode" else ""
    mosq = procs.add(Mosquitto(tmp_path / "mosquitto").start())
    cfg = bridge_config(mosq.port, proto, extra, forwards="""
[[bridges.mqtt.cloud.forwards]]
local = "loop/#"
""", subscriptions="""
[[bridges.mqtt.cloud.subscriptions]]
remote = "loop/#"
""")
    gw = procs.add(Gatewayd(tmp_path / "gw", cfg).start())
    gw.wait_bridge("connected", lambda b: b["status"] == "connected")
    observer = procs.add(Client(mosq.port, "observer").subscribe("loop/#", 1))
    local = procs.add(Client(gw.mqtt_port, "app").subscribe("loop/#", 1))
    device = procs.add(Client(gw.mqtt_port, "dev"))
    cloud = procs.add(Client(mosq.port, "cloud"))

    device.publish_all([("loop/a", b"1", 1)])
    echo = mode == "v4"  # a plain 3.1.1 client gets its own messages back
    # locally: the original, and the upstream's echo when it sends one
    assert [m.topic for m in local.take(2 if echo else 1)] == ["loop/a"] * (2 if echo else 1)
    # a message from upstream comes after anything upstream sent us before it
    cloud.publish_all([("loop/z", b"2", 1)])
    assert [m.topic for m in local.take_until("loop/z")] == ["loop/z"]
    # upstream: loop/a once, loop/z (its own); the echo was not forwarded again, which it
    # would have been before a marker sent up after it
    device.publish_all([("loop/marker", b"3", 1)])
    assert [m.topic for m in observer.take_until("loop/marker")] == [
        "loop/a", "loop/z", "loop/marker"]
    view = gw.bridge()
    assert view["forwarded"] == 2
    assert view["loops_prevented"] == (3 if echo else 1)  # loop/z (+ echoes of a, marker)
