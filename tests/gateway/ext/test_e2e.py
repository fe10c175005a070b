"""The MQTT extensions end to end: a real gatewayd (conftest), paho and mosquitto clients
over real sockets, the management API and gatewayctl."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import time
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from tests.conformance.clients import MosquittoSub, mosquitto_pub
from tests.gateway.admin.gatewayd import WAIT, Client, Gatewayd, clean_environ, q

pytestmark = pytest.mark.ext
API = "/api/v5/mqtt"


def no_message(c: Client, timeout: float = 0.5) -> None:
    with pytest.raises(queue.Empty):
        m = c.next_message(timeout)
        raise AssertionError(f"unexpected message {m.topic} {m.payload!r}")


def subscriptions(gw: Gatewayd, clientid: str) -> dict[str, int]:
    subs = gw.get(f"/api/v5/clients/{q(clientid)}/subscriptions")
    return {s["topic"]: s["qos"] for s in subs}


def ctl(gw: Gatewayd, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**clean_environ(), **gw.env}
    return subprocess.run([sys.executable, "-m", "gateway.cli.gatewayctl", *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def suback_codes(c: Client, topic: str, qos: int = 0) -> list[int]:
    got: queue.Queue[list[Any]] = queue.Queue()
    c.c.on_subscribe = lambda cl, u, mid, rcs, p: got.put(rcs)
    c.c.subscribe(topic, qos)
    return [int(rc.value) if isinstance(rc, ReasonCode) else int(rc)
            for rc in got.get(timeout=WAIT)]


# -- auto-subscribe -----------------------------------------------------------------------


def test_auto_subscribe_from_config_with_placeholders(gatewayd: Gatewayd) -> None:
    c = Client(gatewayd, "auto-1", version=5, username="alice")
    try:
        subs = subscriptions(gatewayd, "auto-1")
        # denied/${clientid} is refused by authorization like a SUBSCRIBE would be
        assert subs == {"cmd/auto-1": 1, "user/alice/in": 0, "from/127.0.0.1": 0}
        mosquitto_pub(("127.0.0.1", gatewayd.mqtt_port), "cmd/auto-1", "go", qos=1)
        m = c.wait_for("cmd/auto-1")
        assert (m.payload, m.qos) == (b"go", 1)
        mosquitto_pub(("127.0.0.1", gatewayd.mqtt_port), "user/alice/in", "hi")
        assert c.wait_for("user/alice/in").payload == b"hi"
    finally:
        c.close()
    # no username: the ${username} topic is skipped, not subscribed as "user//in"
    anon = Client(gatewayd, "auto-2")
    try:
        assert subscriptions(gatewayd, "auto-2") == {"cmd/auto-2": 1, "from/127.0.0.1": 0}
    finally:
        anon.close()
    metrics = gatewayd.get("/api/v5/metrics")
    metrics = metrics[0] if isinstance(metrics, list) else metrics
    assert metrics["auto_subscribe.denied"] >= 2 and metrics["auto_subscribe.skipped"] >= 1


def test_auto_subscribe_resumed_session_has_no_duplicates(gatewayd: Gatewayd) -> None:
    # retained message on an auto topic: rh = 0 sends it on every connect
    mosquitto_pub(("127.0.0.1", gatewayd.mqtt_port), "cmd/auto-p", "kept", qos=1, retain=True)
    c = Client(gatewayd, "auto-p", version=5, clean=True, session_expiry=300)
    assert c.wait_for("cmd/auto-p").retain
    c.close()
    assert c.disconnected.wait(WAIT)
    # queued while offline, then delivered on resume, once
    mosquitto_pub(("127.0.0.1", gatewayd.mqtt_port), "cmd/auto-p", "while-away", qos=1)
    c2 = Client(gatewayd, "auto-p", version=5, clean=False, session_expiry=300)
    try:
        got = [c2.wait_for("cmd/auto-p"), c2.wait_for("cmd/auto-p")]
        assert sorted(m.payload for m in got) == [b"kept", b"while-away"]
        no_message(c2)
        assert subscriptions(gatewayd, "auto-p") == {"cmd/auto-p": 1, "from/127.0.0.1": 0}
        all_subs = gatewayd.get("/api/v5/subscriptions", clientid="auto-p")["data"]
        assert len(all_subs) == 2
    finally:
        c2.close()
    gatewayd.http("DELETE", f"/api/v5/retainer/messages/{q('cmd/auto-p')}")


def test_per_client_auto_subscribe_through_api_and_gatewayctl(gatewayd: Gatewayd) -> None:
    status, _, body = gatewayd.http("POST", f"{API}/auto_subscribe/clients/dev-9",
                                    body={"topic": "ota/${clientid}", "qos": 2, "nl": 1})
    assert status == 201, body
    done = ctl(gatewayd, "auto-subscribe", "add", "dev-9", "fw/+/notice", "--qos", "1")
    assert done.returncode == 0, done.stderr
    bad = ctl(gatewayd, "auto-subscribe", "add", "dev-9", "a/#/b")
    assert bad.returncode != 0 and "#" in bad.stderr and "\n" not in bad.stderr.strip()
    listed = ctl(gatewayd, "auto-subscribe", "list", "dev-9", "--json")
    assert listed.returncode == 0, listed.stderr
    table = ctl(gatewayd, "auto-subscribe", "list")  # every client, and the configured
    assert table.returncode == 0, table.stderr
    assert "cmd/${clientid}" in table.stdout and "fw/+/notice" in table.stdout
    own = json.loads(listed.stdout)["clients"]
    assert {(t["topic"], t["qos"], t["nl"]) for t in own} == {
        ("ota/${clientid}", 2, 1), ("fw/+/notice", 1, 0)}
    c = Client(gatewayd, "dev-9", version=5)
    try:
        subs = subscriptions(gatewayd, "dev-9")
        assert subs["ota/dev-9"] == 2 and subs["fw/+/notice"] == 1
        mosquitto_pub(("127.0.0.1", gatewayd.mqtt_port), "fw/v2/notice", "n", qos=1)
        assert c.wait_for("fw/v2/notice").payload == b"n"
    finally:
        c.close()
    assert ctl(gatewayd, "auto-subscribe", "delete", "dev-9").returncode == 0
    assert gatewayd.get(f"{API}/auto_subscribe/clients/dev-9") == []
    status, _, _ = gatewayd.http("DELETE", f"{API}/auto_subscribe/clients/dev-9")
    assert status == 404


# -- delayed publish ----------------------------------------------------------------------


def test_delayed_publish_arrives_after_the_delay(gatewayd: Gatewayd) -> None:
    sub = MosquittoSub(("127.0.0.1", gatewayd.mqtt_port), "later/#", qos=1).start()
    try:
        t0 = time.monotonic()
        mosquitto_pub(("127.0.0.1", gatewayd.mqtt_port), "$delayed/2/later/a", "x", qos=1)
        m = sub.get(timeout=WAIT)
        waited = time.monotonic() - t0
        assert (m.topic, m.payload, m.qos) == ("later/a", "x", 1)
        assert 1.9 <= waited < 6, waited
    finally:
        sub.stop()


def test_delayed_list_show_cancel_and_authorization(gatewayd: Gatewayd) -> None:
    c = Client(gatewayd, "delayer", version=5)
    watcher = Client(gatewayd, "watcher", version=5).subscribe("held/#", 1)
    try:
        c.publish("$delayed/600/held/one", b"p1", qos=1)
        c.publish("$delayed/900/held/two", b"p2", qos=1)
        c.publish("$delayed/abc/held/bad", b"dropped", qos=1)  # not a number: discarded
        c.publish("$delayed/10/secret/x", b"denied", qos=1)  # final topic is denied
        items = gatewayd.get(f"{API}/delayed/messages")["data"]
        mine = [m for m in items if m["from_clientid"] == "delayer"]
        assert [m["topic"] for m in mine] == ["held/one", "held/two"]
        assert 590 < mine[0]["delayed_remaining"] <= 600
        one = gatewayd.get(f"{API}/delayed/messages/{q(gatewayd.node_name)}/{mine[0]['msgid']}")
        assert one["payload"] == "cDE="  # base64 of p1
        listed = ctl(gatewayd, "delayed", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        assert {m["msgid"] for m in json.loads(listed.stdout)} >= {m["msgid"] for m in mine}
        table = ctl(gatewayd, "delayed", "list")
        assert table.returncode == 0 and "held/one" in table.stdout, table.stderr
        cancel = ctl(gatewayd, "delayed", "cancel", mine[0]["msgid"])
        assert cancel.returncode == 0, cancel.stderr
        status, _, _ = gatewayd.http(
            "DELETE", f"{API}/delayed/messages/{q(gatewayd.node_name)}/{mine[1]['msgid']}")
        assert status == 204
        left = [m for m in gatewayd.get(f"{API}/delayed/messages")["data"]
                if m["from_clientid"] == "delayer"]
        assert left == []
        again = ctl(gatewayd, "delayed", "cancel", mine[0]["msgid"])
        assert again.returncode != 0 and "no delayed message" in again.stderr
        no_message(watcher)
        metrics = gatewayd.get("/api/v5/metrics")
        metrics = metrics[0] if isinstance(metrics, list) else metrics
        assert metrics["messages.delayed.invalid"] >= 1
        assert metrics["authorization.deny"] >= 1
    finally:
        c.close()
        watcher.close()


# -- topic rewrite ------------------------------------------------------------------------


def test_rewrite_publish_subscribe_and_order(gatewayd: Gatewayd) -> None:
    sub = Client(gatewayd, "rw-sub", version=5).subscribe("y/#", 1)
    old = Client(gatewayd, "rw-old", version=5).subscribe("old/news", 1)
    try:
        assert "new/news" in subscriptions(gatewayd, "rw-old")  # the SUBSCRIBE was rewritten
        mosquitto_pub(("127.0.0.1", gatewayd.mqtt_port), "x/a/b", "1", qos=1)
        assert sub.wait_for("y/a/b").payload == b"1"
        # x/keep/... matches the first rule (x/#) first: the later rule never applies
        mosquitto_pub(("127.0.0.1", gatewayd.mqtt_port), "x/keep/z", "2", qos=1)
        assert sub.wait_for("y/keep/z").payload == b"2"
        mosquitto_pub(("127.0.0.1", gatewayd.mqtt_port), "new/news", "3", qos=1)
        assert old.wait_for("new/news").payload == b"3"
        # authorization sees the rewritten topic: x/forbidden -> y/forbidden is denied
        mosquitto_pub(("127.0.0.1", gatewayd.mqtt_port), "x/forbidden", "4", qos=1)
        no_message(sub)
        # placeholders: me/# -> dev/${clientid}/...
        me = Client(gatewayd, "rw-me", version=5).subscribe("me/status", 1)
        try:
            assert "dev/rw-me/status" in subscriptions(gatewayd, "rw-me")
            me.publish("me/status", b"up", qos=1)
            assert me.wait_for("dev/rw-me/status").payload == b"up"
        finally:
            me.close()
        rules = gatewayd.get(f"{API}/topic_rewrite")
        assert [r["source_topic"] for r in rules] == ["x/#", "old/+", "me/#", "x/keep/#"]
        listed = ctl(gatewayd, "rewrite", "list")
        assert listed.returncode == 0 and "old/+" in listed.stdout
    finally:
        sub.close()
        old.close()


def test_bad_rewrite_regex_is_a_check_error_naming_the_rule(tmp_path: Any) -> None:
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(
        '[[rewrite]]\naction = "all"\nsource_topic = "a/#"\ndest_topic = "b/$1"\n'
        're = "^a/(.+)$"\n\n'
        '[[rewrite]]\naction = "publish"\nsource_topic = "c/#"\ndest_topic = "d"\n'
        're = "^c/(unclosed"\n'
    )
    done = subprocess.run([sys.executable, "-m", "gateway.cli.gatewayd", "--check",
                           "--config", str(cfg)], env=clean_environ(), capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 2, (done.stdout, done.stderr)
    err = done.stderr.strip()
    assert "\n" not in err
    assert "rewrite[1].re: rule with source_topic 'c/#': bad regular expression" in err, err
    assert "missing )" in err, err


# -- exclusive subscriptions --------------------------------------------------------------


def _v5(gw: Gatewayd, cid: str) -> Client:
    return Client(gw, cid, version=5)


def test_exclusive_subscription_second_client_gets_0x97(gatewayd: Gatewayd) -> None:
    a, b = _v5(gatewayd, "ex-a"), _v5(gatewayd, "ex-b")
    try:
        assert suback_codes(a, "$exclusive/ex/t", 1) == [1]
        assert suback_codes(b, "$exclusive/ex/t", 1) == [0x97]
        assert suback_codes(a, "$exclusive/ex/t", 0) == [0]  # the holder again: fine
        assert suback_codes(b, "ex/t", 0) == [0]  # plain subscriptions are not affected
        holders = gatewayd.get(f"{API}/exclusive")["data"]
        assert {"topic": "ex/t", "clientid": "ex-a", "node": gatewayd.node_name} in holders
        assert "ex/t" in subscriptions(gatewayd, "ex-a")
        mosquitto_pub(("127.0.0.1", gatewayd.mqtt_port), "ex/t", "m", qos=1)
        assert a.wait_for("ex/t").payload == b"m"
        # released by UNSUBSCRIBE
        a.c.unsubscribe("$exclusive/ex/t")
        deadline = time.monotonic() + WAIT
        while "ex-a" in {h["clientid"] for h in gatewayd.get(f"{API}/exclusive")["data"]}:
            assert time.monotonic() < deadline
            time.sleep(0.05)  # bounded poll of the node's state
        assert suback_codes(b, "$exclusive/ex/t", 1) == [1]
        # released when the holder's session ends
        b.close()
        assert b.disconnected.wait(WAIT)
        deadline = time.monotonic() + WAIT
        while True:
            codes = suback_codes(a, "$exclusive/ex/t", 1)
            if codes == [1]:
                break
            assert time.monotonic() < deadline, codes
            time.sleep(0.05)  # bounded poll: the server settles b's session
        listed = ctl(gatewayd, "exclusive", "list")
        assert listed.returncode == 0 and "ex-a" in listed.stdout
        # MQTT 3.1.1 refusal is 0x80
        c4 = Client(gatewayd, "ex-c4", version=4)
        try:
            assert suback_codes(c4, "$exclusive/ex/t", 0) == [0x80]
        finally:
            c4.close()
    finally:
        a.close()
        b.close()


def test_paho_sees_0x97_reason_name(gatewayd: Gatewayd) -> None:
    a = _v5(gatewayd, "ex-n1")
    b = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="ex-n2", protocol=mqtt.MQTTv5)
    got: queue.Queue[Any] = queue.Queue()
    b.on_subscribe = lambda c, u, mid, rcs, p: got.put(rcs)
    try:
        assert suback_codes(a, "$exclusive/ex/name", 0) == [0]
        b.connect("127.0.0.1", gatewayd.mqtt_port)
        b.loop_start()
        b.subscribe("$exclusive/ex/name", 0)
        rc = got.get(timeout=WAIT)[0]
        assert rc.getName() == "Quota exceeded"
    finally:
        a.close()
        b.disconnect()
        b.loop_stop()


def test_responses_match_the_openapi_document(gatewayd: Gatewayd) -> None:
    from tests.gateway.admin.test_openapi import _check

    c = Client(gatewayd, "oas-ext", version=5)
    try:
        c.publish("$delayed/900/oas/d", b"x", qos=1)
        assert suback_codes(c, "$exclusive/oas/e", 0) == [0]
        gatewayd.http("POST", f"{API}/auto_subscribe/clients/oas-ext", body={"topic": "o/a"})
        msgid = gatewayd.get(f"{API}/delayed/messages")["data"][-1]["msgid"]
        one = f"{API}/delayed/messages/{{node}}/{{msgid}}"
        for doc_path, url in [
            (f"{API}/delayed", f"{API}/delayed"),
            (f"{API}/delayed/messages", f"{API}/delayed/messages"),
            (one, f"{API}/delayed/messages/{q(gatewayd.node_name)}/{msgid}"),
            (f"{API}/topic_rewrite", f"{API}/topic_rewrite"),
            (f"{API}/auto_subscribe", f"{API}/auto_subscribe"),
            (f"{API}/auto_subscribe/clients", f"{API}/auto_subscribe/clients"),
            (f"{API}/auto_subscribe/clients/{{clientid}}",
             f"{API}/auto_subscribe/clients/oas-ext"),
            (f"{API}/exclusive", f"{API}/exclusive"),
        ]:
            _check(gatewayd, "GET", doc_path, url)
        _check(gatewayd, "DELETE", one, f"{API}/delayed/messages/{q(gatewayd.node_name)}/{msgid}",
               204)
        _check(gatewayd, "DELETE", f"{API}/auto_subscribe/clients/{{clientid}}",
               f"{API}/auto_subscribe/clients/oas-ext", 204)
        status, _, body = gatewayd.http("POST", f"{API}/auto_subscribe/clients/x",
                                        body={"topic": "a/#/b", "qos": 1})
        assert status == 400 and b"topic" in body
    finally:
        c.close()
