"""The management API of a real gatewayd, with real MQTT clients (paho-mqtt)."""

from __future__ import annotations

import base64
import json
import os
import stat

from gateway.admin.api import ROUTES
from tests.gateway.admin.gatewayd import Client, Gatewayd, clients, q

API = "/api/v5"


def test_health_is_public_and_everything_else_needs_the_token(gatewayd: Gatewayd) -> None:
    status, _, body = gatewayd.http("GET", "/status", auth=False)
    assert status == 200
    assert json.loads(body) == {"node": gatewayd.node_name, "status": "running",
                                "version": json.loads(body)["version"]}
    for token in (None, "wrong-token-wrong-token"):
        status, headers, body = gatewayd.http(
            "GET", f"{API}/status", auth=token is not None, token=token
        )
        assert status == 401
        assert headers["www-authenticate"].startswith("Bearer")
        assert json.loads(body)["code"] == "UNAUTHORIZED"
    assert gatewayd.http("GET", f"{API}/status")[0] == 200


def test_every_route_refuses_a_missing_token(gatewayd: Gatewayd) -> None:
    public = {"/status", "/metrics", f"{API}/prometheus/stats"}
    for method, path, _ in ROUTES:
        if path in public:
            continue
        concrete = path.replace("{node}", "x").replace("{clientid}", "x").replace(
            "{topic:.+}", "x").replace("{as}", "clientid").replace("{who:.+}", "x").replace(
            "{user_id}", "x")
        assert gatewayd.http(method, concrete, auth=False)[0] == 401, (method, path)


def test_the_token_file_is_private(gatewayd: Gatewayd) -> None:
    mode = stat.S_IMODE(os.stat(gatewayd.data_dir / "api.token").st_mode)
    assert mode == 0o600
    assert len(gatewayd.token) >= 32


def test_clients_list_filters_and_show(gatewayd: Gatewayd) -> None:
    with clients() as made:
        made.append(Client(gatewayd, "api-list-a", version=4, username="alice"))
        made.append(Client(gatewayd, "api-list-b", version=5, username="bob").subscribe("x/#"))
        page = gatewayd.get(f"{API}/clients", like_clientid="api-list-")
        ids = [c["clientid"] for c in page["data"]]
        assert ids == ["api-list-a", "api-list-b"]
        assert page["meta"]["count"] == 2
        a = gatewayd.get(f"{API}/clients/api-list-a")
        assert a["connected"] is True
        assert a["username"] == "alice"
        assert a["ip_address"] == "127.0.0.1"
        assert a["proto_ver"] == 4 and a["protocol"] == "mqtt"
        assert a["listener"] == "tcp:default"
        assert a["node"] == gatewayd.node_name
        b = gatewayd.get(f"{API}/clients/api-list-b")
        assert b["proto_ver"] == 5 and b["subscriptions_cnt"] == 1
        only_bob = gatewayd.get(f"{API}/clients", username="bob")["data"]
        assert [c["clientid"] for c in only_bob] == ["api-list-b"]
        v5 = gatewayd.get(f"{API}/clients", proto_ver=5, like_clientid="api-list-")["data"]
        assert [c["clientid"] for c in v5] == ["api-list-b"]
        paged = gatewayd.get(f"{API}/clients", like_clientid="api-list-", limit=1, page=2)
        assert [c["clientid"] for c in paged["data"]] == ["api-list-b"]
        assert paged["meta"] == {"page": 2, "limit": 1, "count": 2, "hasnext": False}
    status, _, body = gatewayd.http("GET", f"{API}/clients/nobody-here")
    assert status == 404 and json.loads(body)["code"] == "NOT_FOUND"


def test_subscriptions_and_routes(gatewayd: Gatewayd) -> None:
    with clients() as made:
        made.append(Client(gatewayd, "api-subs-1", version=5)
                    .subscribe("api/subs/+/t", qos=1).subscribe("$share/grp/api/shared/#"))
        subs = gatewayd.get(f"{API}/subscriptions", clientid="api-subs-1")["data"]
        assert {(s["topic"], s["qos"], s["share_group"]) for s in subs} == {
            ("api/subs/+/t", 1, None), ("$share/grp/api/shared/#", 0, "grp")}
        matched = gatewayd.get(f"{API}/subscriptions", match_topic="api/subs/x/t")["data"]
        assert [s["clientid"] for s in matched] == ["api-subs-1"]
        per_client = gatewayd.get(f"{API}/clients/api-subs-1/subscriptions")
        assert len(per_client) == 2
        routes = gatewayd.get(f"{API}/routes")["data"]
        by_topic = {r["topic"]: r for r in routes}
        assert by_topic["api/subs/+/t"]["node"] == gatewayd.node_name
        assert by_topic["api/shared/#"]["shared_groups"] == ["grp"]
        one = gatewayd.get(f"{API}/routes/{q('api/subs/+/t')}")
        assert one[0]["subscribers"] == 1
    assert gatewayd.http("GET", f"{API}/routes/{q('no/such/filter')}")[0] == 404


def test_kick_sends_0x98_publishes_the_will_and_keeps_the_session(gatewayd: Gatewayd) -> None:
    with clients() as made:
        watcher = Client(gatewayd, "api-kick-watch").subscribe("api/kick/will", qos=1)
        made.append(watcher)
        victim = Client(gatewayd, "api-kick-victim", version=5, clean=False,
                        session_expiry=300, will=("api/kick/will", b"gone"))
        made.append(victim)
        status, _, body = gatewayd.http("DELETE", f"{API}/clients/api-kick-victim")
        assert status == 200 and json.loads(body)["result"] == "kicked"
        assert victim.disconnected.wait(10)
        assert victim.disconnect_reason == 0x98
        assert watcher.wait_for("api/kick/will").payload == b"gone"
        victim.c.loop_stop()  # no reconnect
        view = gatewayd.get(f"{API}/clients/api-kick-victim")
        assert view["connected"] is False and view["expiry_interval"] == 300
        # offline: only discard ends it
        status, _, body = gatewayd.http("DELETE", f"{API}/clients/api-kick-victim")
        assert status == 409
        status, _, body = gatewayd.http("DELETE", f"{API}/clients/api-kick-victim?discard=true")
        assert status == 200 and json.loads(body)["result"] == "discarded"
        assert gatewayd.http("GET", f"{API}/clients/api-kick-victim")[0] == 404


def test_kick_without_will(gatewayd: Gatewayd) -> None:
    with clients() as made:
        watcher = Client(gatewayd, "api-kick2-watch").subscribe("api/kick2/#", qos=1)
        made.append(watcher)
        victim = Client(gatewayd, "api-kick2-victim", will=("api/kick2/will", b"gone"))
        made.append(victim)
        status, _, _ = gatewayd.http("DELETE", f"{API}/clients/api-kick2-victim?will=false")
        assert status == 200
        assert victim.disconnected.wait(10)
        victim.c.loop_stop()
        watcher.publish("api/kick2/marker", b"m", qos=1)
        # the will would have been routed before the marker: the first message is the marker
        assert watcher.next_message().topic == "api/kick2/marker"
    assert gatewayd.http("DELETE", f"{API}/clients/nobody-here")[0] == 404


def test_retained_messages(gatewayd: Gatewayd) -> None:
    topic = "api/retained/a b"
    with clients() as made:
        pub = Client(gatewayd, "api-ret-pub")
        made.append(pub)
        pub.publish(topic, b"\x00\x01hello", qos=1, retain=True)
        listed = gatewayd.get(f"{API}/retainer/messages", topic="api/retained/#")["data"]
        assert [(m["topic"], m["payload_size"], m["from_clientid"]) for m in listed] == [
            (topic, 7, "api-ret-pub")]
        one = gatewayd.get(f"{API}/retainer/messages/{q(topic)}")
        assert base64.b64decode(one["payload"]) == b"\x00\x01hello"
        assert one["qos"] == 1
        assert gatewayd.http("DELETE", f"{API}/retainer/messages/{q(topic)}")[0] == 204
        assert gatewayd.http("GET", f"{API}/retainer/messages/{q(topic)}")[0] == 404
        assert gatewayd.http("DELETE", f"{API}/retainer/messages/{q(topic)}")[0] == 404
        late = Client(gatewayd, "api-ret-late").subscribe("api/retained/#")
        made.append(late)
        late.publish("api/retained/marker", b"m")
        assert late.next_message().topic == "api/retained/marker"  # nothing retained came


def test_listeners_stats_nodes_gateways(gatewayd: Gatewayd) -> None:
    with clients() as made:
        made.extend(Client(gatewayd, f"api-count-{i}") for i in range(3))
        listeners = gatewayd.get(f"{API}/listeners")
        tcp = next(x for x in listeners if x["id"] == "tcp:default")
        assert tcp["status"] == "running"
        assert tcp["addresses"] == [f"127.0.0.1:{gatewayd.mqtt_port}"]
        assert tcp["max_connections"] == 1000
        live = gatewayd.get(f"{API}/clients", conn_state="connected")["meta"]["count"]
        assert tcp["current_connections"] == live >= 3
        stats = gatewayd.get(f"{API}/stats")
        assert stats["connections.count"] == live
        assert stats["connections.max"] >= live
        nodes = gatewayd.get(f"{API}/nodes")
        assert [n["node"] for n in nodes] == [gatewayd.node_name]
        assert gatewayd.get(f"{API}/nodes/{q(gatewayd.node_name)}")["connections"] == live
        fronts = {g["name"]: g for g in gatewayd.get(f"{API}/gateways")}
        assert fronts["mqtt"]["status"] == "running"
        assert fronts["mqtt"]["current_connections"] == live
        status = gatewayd.get(f"{API}/status")
        assert status["connections"]["count"] == live
        assert status["connections"]["by_protocol"]["mqtt"] == live


def test_cluster_and_bridges_are_not_configured_with_a_stable_shape(gatewayd: Gatewayd) -> None:
    cluster = gatewayd.get(f"{API}/cluster")
    assert cluster["enabled"] is False and cluster["status"] == "not configured"
    assert [m["node"] for m in cluster["members"]] == [gatewayd.node_name]
    assert cluster["members"][0]["self"] is True
    bridges = gatewayd.get(f"{API}/bridges")
    assert bridges == {"enabled": False, "status": "not configured", "bridges": []}


def test_alarms_list_the_open_file_limit_when_it_is_too_low(gatewayd: Gatewayd) -> None:
    body = gatewayd.get(f"{API}/alarms")
    names = {a["name"] for a in body["data"]}
    status = gatewayd.get(f"{API}/status")
    nofile = status["limits"]["nofile"]
    assert ("nofile_limit" in names) == (not nofile["ok"])
    assert status["limits"]["max_connections"] == 1000
    assert gatewayd.get(f"{API}/alarms", activated="false")["data"] == []


def test_users(gatewayd: Gatewayd) -> None:
    body = gatewayd.get(f"{API}/users")
    assert body["status"] == "enabled", body  # the built-in user database is always there
    new = {"user_id": "api-user-1", "password": "s3cret-pass", "is_superuser": True}
    status, _, created = gatewayd.http("POST", f"{API}/users", body=new)
    assert status == 201 and json.loads(created)["user_id"] == "api-user-1"
    assert gatewayd.http("POST", f"{API}/users", body=new)[0] == 409
    users = {u["user_id"]: u for u in gatewayd.get(f"{API}/users")["data"]}
    assert users["api-user-1"]["is_superuser"] is True
    assert gatewayd.http("POST", f"{API}/users", body={"user_id": 3})[0] == 400
    assert gatewayd.http("DELETE", f"{API}/users/api-user-1")[0] == 204
    assert gatewayd.http("DELETE", f"{API}/users/api-user-1")[0] == 404


def test_banned(gatewayd: Gatewayd) -> None:
    body = gatewayd.get(f"{API}/banned")
    if body["status"] != "enabled":
        assert gatewayd.http("POST", f"{API}/banned",
                             body={"as": "clientid", "who": "x"})[0] == 501
        return
    status, _, created = gatewayd.http(
        "POST", f"{API}/banned",
        body={"as": "clientid", "who": "api-banned-1", "reason": "test"})
    assert status == 201
    assert json.loads(created)["who"] == "api-banned-1"
    listed = gatewayd.get(f"{API}/banned")["data"]
    assert {"as": "clientid", "who": "api-banned-1"}.items() <= next(
        b for b in listed if b["who"] == "api-banned-1").items()
    assert gatewayd.http("POST", f"{API}/banned", body={"as": "nope", "who": "x"})[0] == 400
    assert gatewayd.http("DELETE", f"{API}/banned/clientid/api-banned-1")[0] == 204
    assert gatewayd.http("DELETE", f"{API}/banned/clientid/api-banned-1")[0] == 404


def test_errors_are_json(gatewayd: Gatewayd) -> None:
    status, _, body = gatewayd.http("GET", f"{API}/no/such/thing")
    assert status == 404 and json.loads(body)["code"] == "NOT_FOUND"
    status, headers, body = gatewayd.http("POST", f"{API}/clients")
    assert status == 405 and json.loads(body)["code"] == "METHOD_NOT_ALLOWED"
    assert headers["allow"] == "GET"
    status, _, body = gatewayd.http("GET", f"{API}/clients?limit=0")
    assert status == 400 and "limit" in json.loads(body)["message"]
    status, _, body = gatewayd.http("GET", f"{API}/clients?conn_state=maybe")
    assert status == 400
    status, _, body = gatewayd.http("GET", f"{API}/trace")
    assert status == 400
    status, _, body = gatewayd.http("POST", f"{API}/users", body=None,
                                    headers={"Content-Type": "application/json"})
    assert status in (400, 501)
