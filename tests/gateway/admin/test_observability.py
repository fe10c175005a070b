"""Prometheus exposition, $SYS topics and live trace of a real gatewayd."""

from __future__ import annotations

import http.client
import json
import queue
import threading
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.admin.gatewayd import WAIT, Client, Gatewayd, clients


def scrape(gw: Gatewayd) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, headers, body = gw.http("GET", "/metrics", auth=False)
    assert status == 200
    assert headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def test_prometheus_counts_real_connections_and_messages(gatewayd: Gatewayd) -> None:
    with clients() as made:
        sub = Client(gatewayd, "prom-sub").subscribe("prom/t", qos=1)
        made.append(sub)
        made.append(Client(gatewayd, "prom-idle"))
        before = scrape(gatewayd)
        sub.publish("prom/t", b"x", qos=1)
        sub.wait_for("prom/t")
        after = scrape(gatewayd)
        live = gatewayd.get("/api/v5/stats")["connections.count"]
        assert after[("gateway_connections_count", ())] == live >= 2
        listener = (("listener", "tcp:default"), ("protocol", "mqtt"), ("type", "tcp"))
        assert after[("gateway_listener_connections", listener)] == live
        assert after[("gateway_listener_max_connections", listener)] == 1000
        received = ("gateway_messages_received_total", ())
        sent = ("gateway_messages_sent_total", ())
        assert after[received] >= before[received] + 1
        assert after[sent] >= before[sent] + 1
        info = [k for k in after if k[0] == "gateway_info"]
        assert dict(info[0][1])["node"] == gatewayd.node_name
        assert ("process_open_fds", ()) in after
        assert after[("gateway_gc_frozen_objects", ())] > 0  # gateway.gcpolicy runs
        assert ("gateway_gc_full_collection_longest_seconds", ()) in after
        assert ("python_gc_collections_total", (("generation", "2"),)) in after
        assert ("gateway_clients_connected", (("protocol", "mqtt"),)) in after
    # the alias under /api/v5 says the same, and is public too (metrics_auth = false)
    status, _, _ = gatewayd.http("GET", "/api/v5/prometheus/stats", auth=False)
    assert status == 200


def test_sys_client_events_go_to_sys_subscribers_only(gatewayd: Gatewayd) -> None:
    node = gatewayd.node_name
    with clients() as made:
        sys_sub = Client(gatewayd, "sys-watch").subscribe(f"$SYS/brokers/{node}/clients/#")
        everything = Client(gatewayd, "sys-hash").subscribe("#")
        made.extend([sys_sub, everything])
        newcomer = Client(gatewayd, "sys-newcomer", username="neo")
        made.append(newcomer)
        msg = sys_sub.wait_for(f"$SYS/brokers/{node}/clients/sys-newcomer/connected")
        event = json.loads(msg.payload)
        assert event["clientid"] == "sys-newcomer"
        assert event["username"] == "neo"
        assert event["ipaddress"] == "127.0.0.1"
        assert event["sockport"] == gatewayd.mqtt_port
        assert event["proto_ver"] == 4 and event["keepalive"] == 60
        newcomer.subscribe("sys/sub/t")  # client_subscribed is on in this module's config
        sub_event = json.loads(
            sys_sub.wait_for(f"$SYS/brokers/{node}/clients/sys-newcomer/subscribed").payload)
        assert sub_event["topic"] == "sys/sub/t"
        newcomer.close()
        made.remove(newcomer)
        gone = json.loads(
            sys_sub.wait_for(f"$SYS/brokers/{node}/clients/sys-newcomer/disconnected").payload)
        assert gone["clientid"] == "sys-newcomer" and "disconnected_at" in gone
        # "#" never matched any of that: its first message is the marker published after
        everything.publish("sys/marker", b"m")
        first = everything.next_message()
        assert first.topic == "sys/marker"


def test_sys_periodic_topics(gatewayd: Gatewayd) -> None:
    node = gatewayd.node_name
    prefix = f"$SYS/brokers/{node}"
    with clients() as made:
        c = Client(gatewayd, "sys-periodic")
        made.append(c)
        for t in ("$SYS/brokers", f"{prefix}/version", f"{prefix}/uptime",
                  f"{prefix}/datetime", f"{prefix}/stats/connections/count",
                  f"{prefix}/metrics/messages/received"):
            c.subscribe(t)
        assert c.wait_for("$SYS/brokers").payload.decode() == node
        assert c.wait_for(f"{prefix}/version").payload.decode() == json.loads(
            gatewayd.http("GET", "/status", auth=False)[2])["version"]
        assert int(c.wait_for(f"{prefix}/uptime").payload) >= 0
        assert "T" in c.wait_for(f"{prefix}/datetime").payload.decode()
        assert int(c.wait_for(f"{prefix}/stats/connections/count").payload) >= 1
        assert int(c.wait_for(f"{prefix}/metrics/messages/received").payload) >= 0


class TraceReader(threading.Thread):
    """Reads /api/v5/trace (server-sent events) into a queue."""

    def __init__(self, gw: Gatewayd, query: str) -> None:
        super().__init__(daemon=True)
        self.conn = http.client.HTTPConnection("127.0.0.1", gw.api_port, timeout=WAIT * 3)
        self.conn.request("GET", f"/api/v5/trace?{query}",
                          headers={"Authorization": f"Bearer {gw.token}"})
        self.response = self.conn.getresponse()
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()

    def run(self) -> None:
        try:
            while True:
                line = self.response.readline()
                if not line:
                    return
                if line.startswith(b"data:"):
                    self.events.put(json.loads(line[5:]))
        except (OSError, ValueError, AttributeError):  # closed under us by close()
            return

    def next(self, name: str) -> dict[str, Any]:
        while True:
            e = self.events.get(timeout=WAIT)
            if e["event"] == name:
                return e

    def close(self) -> None:
        self.conn.close()


def test_trace_a_topic(gatewayd: Gatewayd) -> None:
    reader = TraceReader(gatewayd, "topic=trace/%23")
    assert reader.response.status == 200
    assert reader.response.getheader("Content-Type") == "text/event-stream"
    reader.start()
    try:
        started = reader.next("trace.started")
        assert started["subject"] == {"type": "topic", "value": "trace/#"}
        with clients() as made:
            sub = Client(gatewayd, "trace-sub").subscribe("trace/#", qos=1)
            made.append(sub)
            sub.publish("other/topic", b"not traced")
            sub.publish("trace/t1", b"hello", qos=1)
            published = reader.next("message.publish")
            assert published["topic"] == "trace/t1" and published["payload"] == "hello"
            assert published["from_clientid"] == "trace-sub"
            delivered = reader.next("message.delivered")
            assert delivered["clientid"] == "trace-sub" and delivered["qos"] == 1
    finally:
        reader.close()


def test_trace_a_client(gatewayd: Gatewayd) -> None:
    reader = TraceReader(gatewayd, "clientid=trace-me")
    reader.start()
    try:
        reader.next("trace.started")
        with clients() as made:
            me = Client(gatewayd, "trace-me", username="u1")
            made.append(me)
            connected = reader.next("client.connected")
            assert connected["username"] == "u1" and connected["listener"] == "tcp:default"
            me.subscribe("trace/client/#", qos=1)
            assert reader.next("session.subscribed")["topic"] == "trace/client/#"
            me.publish("trace/client/x", b"\xff\xfe", qos=1)
            published = reader.next("message.publish")
            assert published["payload_hex"] == "fffe"
            assert reader.next("message.delivered")["clientid"] == "trace-me"
            me.close()
            made.remove(me)
            reader.next("client.disconnected")
    finally:
        reader.close()


def test_prometheus_shows_a_bridge_and_its_outbox(tmp_path: Any) -> None:
    """A bridge whose upstream is down: not connected, what is forwarded waits in the
    outbox (acknowledged publishes are in it), and the scrape says so per bridge."""
    from tests.gateway.admin.gatewayd import free_port

    gw = Gatewayd(tmp_path, {
        "GATEWAY_BRIDGES__MQTT__UP__SERVER": f"127.0.0.1:{free_port()}",  # nobody there
        "GATEWAY_BRIDGES__MQTT__UP__FORWARDS": '[{local = "tele/#", qos = 1}]',
    }).start()
    try:
        with clients() as made:
            pub = Client(gw, "prom-bridge-pub")
            made.append(pub)
            for i in range(3):  # each PUBACK follows the commit of its outbox row
                pub.publish("tele/t", b"%d" % i, qos=1)
            samples = scrape(gw)
        up = (("bridge", "up"),)
        assert samples[("gateway_bridge_queue_messages", up)] == 3
        assert samples[("gateway_bridge_connected", up)] == 0
        assert samples[("gateway_bridge_queue_bytes", up)] == 3 * (len("tele/t") + 1)
        assert samples[("gateway_bridge_oldest_age_seconds", up)] >= 0
        assert samples[("gateway_bridge_forwarded_total", up)] == 0
    finally:
        gw.stop()
