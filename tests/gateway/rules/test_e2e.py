"""The rule engine end to end: a real gatewayd, paho clients, the management API and
gatewayctl. Rules come from the configuration (as GATEWAY_* values, conftest) and from
the API."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.gateway.admin.gatewayd import WAIT, Client, Gatewayd, clean_environ
from tests.gateway.rules.conftest import CONFIG_RULES

API = "/api/v5"
pytestmark = pytest.mark.rules


def rule(gw: Gatewayd, rule_id: str) -> dict[str, Any]:
    result: dict[str, Any] = gw.get(f"{API}/rules/{rule_id}")
    return result


def wait_metric(gw: Gatewayd, rule_id: str, key: str, value: int) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT
    while True:
        r = rule(gw, rule_id)
        if r["metrics"][key] >= value:
            return r
        assert time.monotonic() < deadline, r["metrics"]
        time.sleep(0.05)  # bounded poll of the node's counters


def no_message(c: Client, timeout: float = 0.5) -> None:
    with pytest.raises(queue.Empty):
        m = c.next_message(timeout)
        raise AssertionError(f"unexpected message {m.topic} {m.payload!r}")


def test_republish_with_templates_and_user_properties(gatewayd: Gatewayd) -> None:
    sub = Client(gatewayd, "alert-sub", version=5).subscribe("alerts/#", 1)
    pub = Client(gatewayd, "dev-1")
    pub.publish("sensors/a/temp", json.dumps({"t": 20, "unit": "C"}), 1)
    pub.publish("sensors/a/temp", json.dumps({"t": 35.5, "unit": "C"}), 1)
    m = sub.next_message()
    assert (m.topic, m.payload, m.qos, m.retain) == ("alerts/dev-1", b"35.5", 1, False)
    assert sorted(m.properties.UserProperty) == [("src", "rule"), ("unit", "C")]
    no_message(sub)
    r = wait_metric(gatewayd, "high_temp", "passed", 1)
    assert r["metrics"]["matched"] >= 2 and r["metrics"]["failed.no_result"] >= 1
    assert r["action_metrics"][0]["success"] >= 1 and r["origin"] == "config"
    assert "rule high_temp: {" in gatewayd.log()  # the console action
    sub.c.disconnect()
    pub.c.disconnect()


def test_foreach_over_an_array(gatewayd: Gatewayd) -> None:
    sub = Client(gatewayd, "split-sub").subscribe("split/#", 0)
    pub = Client(gatewayd, "batcher")
    sensors = [{"name": "a", "value": 5}, {"name": "b", "value": 10}, {"name": "c", "value": 99}]
    pub.publish("batch/1", json.dumps({"sensors": sensors}), 1)
    got = sorted((m.topic, json.loads(m.payload)) for m in (sub.next_message(),
                                                           sub.next_message()))
    assert got == [("split/b", {"name": "b", "value": 10, "clientid": "batcher"}),
                   ("split/c", {"name": "c", "value": 99, "clientid": "batcher"})]
    no_message(sub)


def test_case_when(gatewayd: Gatewayd) -> None:
    sub = Client(gatewayd, "lvl-sub").subscribe("levels/#", 0)
    pub = Client(gatewayd, "lvl-pub")
    for t in (40, 20, 1):
        pub.publish(f"level/{t}", json.dumps({"t": t}), 1)
        m = sub.next_message()
        assert m.payload == f"level/{t}".encode()
        assert m.topic == {40: "levels/hot", 20: "levels/warm", 1: "levels/cold"}[t]


def test_a_failing_rule_counts_and_never_disturbs_delivery(gatewayd: Gatewayd) -> None:
    sub = Client(gatewayd, "div-sub").subscribe("div/#", 1)
    out = Client(gatewayd, "divout-sub").subscribe("divout", 0)
    pub = Client(gatewayd, "div-pub")
    before = rule(gatewayd, "div")["metrics"]["failed.exception"]
    for payload in (b'{"x": 0}', b"not json", b'{"x": 4}'):
        pub.publish("div/1", payload, 1)
        assert sub.next_message().payload == payload  # delivered whatever the rule does
    assert out.next_message().payload == b"2.5"
    r = wait_metric(gatewayd, "div", "failed.exception", before + 2)
    assert "division by zero" in r["last_error"] or "not a number" in r["last_error"]


EVENTS = ["client_connected", "client_connack", "client_disconnected", "session_subscribed",
          "session_unsubscribed", "message_delivered", "message_acked", "message_dropped"]


def test_every_event_source(gatewayd: Gatewayd) -> None:
    where = {
        "message_delivered": "topic = 'evt/x'", "message_acked": "topic = 'evt/x'",
        "message_dropped": "topic = 'evt/nobody'",
    }
    for ev in EVENTS:
        cond = where.get(ev, "clientid = 'evc'")
        body = {"id": f"ev_{ev}",
                "sql": f'SELECT * FROM "$events/{ev}" WHERE {cond}',
                "actions": [{"function": "republish",
                             "args": {"topic": f"ev/{ev}", "payload": ""}}]}
        status, _, raw = gatewayd.http("POST", f"{API}/rules", body=body)
        assert status == 201, raw
    watch = Client(gatewayd, "watcher").subscribe("ev/#", 0)
    evc = Client(gatewayd, "evc", username="alice").subscribe("evt/x", 1)
    evp = Client(gatewayd, "evp", username="bob")
    evp.publish("evt/x", b"hello", 1)
    assert evc.next_message().payload == b"hello"
    evp.publish("evt/nobody", b"lost", 0)
    evc.c.unsubscribe("evt/x")
    seen: dict[str, dict[str, Any]] = {}
    deadline = time.monotonic() + WAIT
    while len(seen) < len(EVENTS) - 1 and time.monotonic() < deadline:
        m = watch.next_message()
        seen[m.topic.split("/", 1)[1]] = json.loads(m.payload)
    evc.c.disconnect()
    m = watch.wait_for("ev/client_disconnected")
    seen["client_disconnected"] = json.loads(m.payload)
    assert set(seen) == set(EVENTS)
    c = seen["client_connected"]
    assert c["event"] == "client.connected" and c["clientid"] == "evc"
    assert c["username"] == "alice" and c["proto_name"] == "MQTT" and c["proto_ver"] == 4
    assert c["keepalive"] == 60 and c["peername"].startswith("127.0.0.1:")
    assert c["clean_start"] is True and abs(c["connected_at"] / 1000 - time.time()) < 60
    assert c["node"] == gatewayd.node_name
    assert seen["client_connack"]["reason_code"] == "success"
    d = seen["client_disconnected"]
    assert d["event"] == "client.disconnected" and d["reason"] == "normal"
    assert d["disconnected_at"] >= c["connected_at"]
    s = seen["session_subscribed"]
    assert (s["event"], s["topic"], s["qos"]) == ("session.subscribed", "evt/x", 1)
    assert seen["session_unsubscribed"]["topic"] == "evt/x"
    for name in ("message_delivered", "message_acked"):
        e = seen[name]
        assert e["event"] == name.replace("_", ".", 1)
        assert (e["from_clientid"], e["from_username"]) == ("evp", "bob")
        assert (e["clientid"], e["username"], e["payload"], e["qos"]) == ("evc", "alice",
                                                                           "hello", 1)
        assert e["flags"] == {"retain": False, "dup": False} and len(e["id"]) == 32
    dr = seen["message_dropped"]
    assert (dr["reason"], dr["clientid"], dr["payload"]) == ("no_subscribers", "evp", "lost")
    for ev in EVENTS:
        assert gatewayd.http("DELETE", f"{API}/rules/ev_{ev}")[0] == 204
    watch.c.disconnect()
    evp.c.disconnect()


def test_bad_rules_at_the_api_are_refused_and_the_old_rule_stays(gatewayd: Gatewayd) -> None:
    for sql, msg in [
        ('SELECT a FORM "t"', "line 1, column 10: unexpected 'FORM'"),
        ('SELECT nope(1) FROM "t"', "line 1, column 8: unknown function 'nope'"),
        ('SELECT * FROM "$events/nope"', "unknown event source"),
        ("SELECT 'a\\x' AS y FROM \"t\"",
         "line 1, column 8: bad escape in string 'a\\x': truncated \\xXX escape"),
    ]:
        status, _, raw = gatewayd.http("POST", f"{API}/rules", body={"id": "bad", "sql": sql})
        assert status == 400, raw
        assert msg in json.loads(raw)["message"]
    status, _, raw = gatewayd.http("POST", f"{API}/rules", body={
        "id": "bad", "sql": 'SELECT * FROM "t"',
        "actions": [{"function": "republish", "args": {"topic": "a/#"}}]})
    assert status == 400 and "not a valid topic name" in json.loads(raw)["message"]
    status, _, raw = gatewayd.http("PUT", f"{API}/rules/level", body={"sql": "SELECT oops"})
    assert status == 400
    assert rule(gatewayd, "level")["sql"] == CONFIG_RULES[
        "GATEWAY_RULE_ENGINE__RULES__LEVEL__SQL"]
    assert gatewayd.http("GET", f"{API}/rules/bad")[0] == 404
    status, _, raw = gatewayd.http("POST", f"{API}/rules",
                                   body={"id": "level", "sql": 'SELECT * FROM "t"'})
    assert status == 409


def test_rule_test_endpoint(gatewayd: Gatewayd) -> None:
    status, _, raw = gatewayd.http("POST", f"{API}/rule_test", body={
        "sql": 'SELECT upper(payload.msg) AS m, clientid FROM "t/#" WHERE payload.n > 1',
        "context": {"topic": "t/1", "clientid": "c9", "payload": '{"msg": "hi", "n": 2}'}})
    assert status == 200 and json.loads(raw) == {"m": "HI", "clientid": "c9"}
    status, _, raw = gatewayd.http("POST", f"{API}/rule_test", body={
        "sql": 'SELECT * FROM "t/#" WHERE payload.n > 5',
        "context": {"topic": "t/1", "payload": '{"n": 2}'}})
    assert status == 412 and json.loads(raw)["code"] == "SQL_NOT_MATCH"
    status, _, raw = gatewayd.http("POST", f"{API}/rule_test", body={
        "sql": 'SELECT clientid, reason FROM "$events/client_disconnected"',
        "context": {"event_type": "client_disconnected", "clientid": "x", "reason": "kicked"}})
    assert status == 200 and json.loads(raw) == {"clientid": "x", "reason": "kicked"}
    status, _, raw = gatewayd.http("POST", f"{API}/rule_test", body={
        "sql": 'FOREACH payload.l FROM "t/#"', "context": {"payload": '{"l": [1, 2]}'}})
    assert status == 200 and [o["item"] for o in json.loads(raw)] == [1, 2]
    status, _, raw = gatewayd.http("POST", f"{API}/rule_test", body={"sql": "SELECT"})
    assert status == 400 and "line 1" in json.loads(raw)["message"]


def test_prometheus_series(gatewayd: Gatewayd) -> None:
    status, _, body = gatewayd.http("GET", "/metrics", auth=False)
    text = body.decode()
    assert status == 200
    assert 'gateway_rule_matched_total{rule="high_temp"}' in text
    assert 'gateway_rule_actions_total{action="0:republish",result="success",rule="high_temp"}' \
        in text
    assert "gateway_rules_pending 0.0" in text


def ctl(gw: Gatewayd, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gateway.cli.gatewayctl", *args],
                          env={**clean_environ(), **gw.env}, capture_output=True, text=True,
                          timeout=60, check=False)


def test_gatewayctl_rules(gatewayd: Gatewayd) -> None:
    r = ctl(gatewayd, "rules", "create", "ctl_rule", "--sql",
            'SELECT payload AS p FROM "ctl/#"', "--action",
            '{"function": "republish", "args": {"topic": "ctlout", "payload": "${p}!"}}',
            "--action", "console")
    assert r.returncode == 0 and "rule ctl_rule created (from ctl/#)" in r.stdout, r.stderr
    sub = Client(gatewayd, "ctl-sub").subscribe("ctlout", 0)
    Client(gatewayd, "ctl-pub").publish("ctl/1", b"yo", 1)
    assert sub.next_message().payload == b"yo!"
    r = ctl(gatewayd, "rules", "list")
    assert r.returncode == 0 and "ctl_rule" in r.stdout and "high_temp" in r.stdout
    wait_metric(gatewayd, "ctl_rule", "actions.success", 2)
    r = ctl(gatewayd, "rules", "show", "ctl_rule")
    assert r.returncode == 0
    assert "matched=1" in r.stdout and "action 0: republish" in r.stdout, r.stdout
    r = ctl(gatewayd, "rules", "create", "bad", "--sql", 'SELECT x FROM "t" WHERE')
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "line 1, column 24: unexpected end of statement" in r.stderr
    r = ctl(gatewayd, "rules", "test", "--sql", 'SELECT payload.a + 1 AS b FROM "t"',
            "--context", '{"payload": "{\\"a\\": 1}", "topic": "t"}')
    assert r.returncode == 0 and json.loads(r.stdout) == {"b": 2}, r.stderr
    r = ctl(gatewayd, "rules", "disable", "ctl_rule")
    assert r.returncode == 0 and rule(gatewayd, "ctl_rule")["enable"] is False
    r = ctl(gatewayd, "rules", "delete", "ctl_rule")
    assert r.returncode == 0 and gatewayd.http("GET", f"{API}/rules/ctl_rule")[0] == 404
    r = ctl(gatewayd, "rules", "show", "ctl_rule")
    assert r.returncode == 1 and "no rule 'ctl_rule'" in r.stderr


@pytest.mark.parametrize(("env", "msg"), [
    ({"GATEWAY_RULE_ENGINE__RULES__R1__SQL": 'SELECT a FROM "t" WHERE a >> 1'},
     "rule_engine.rules.r1.sql: line 1, column 28: unexpected '>'"),
    ({"GATEWAY_RULE_ENGINE__RULES__R1__SQL": 'SELECT\n lower(a, b) FROM "t"'},
     "rule_engine.rules.r1.sql: line 2, column 2: function 'lower' takes 1 arguments, got 2"),
    ({"GATEWAY_RULE_ENGINE__RULES__R1__SQL": 'SELECT a FROM "t"',
      "GATEWAY_RULE_ENGINE__RULES__R1__ACTIONS": '[{function = "republish", args = {qos = 1}}]'},
     "rule_engine.rules.r1.actions[0]: republish: args.topic (a template) is required"),
    ({"GATEWAY_RULE_ENGINE__RULES__R1__SQL": 'SELECT a FROM "t"',
      "GATEWAY_RULE_ENGINE__RULES__R1__ACTIONS": '[{function = "webhook:nope"}]'},
     "rules.r1.actions[0]: no [webhooks.nope] configured"),
    ({"GATEWAY_RULE_ENGINE__RULES__R1__SQL": 'SELECT a FROM "t"',
      "GATEWAY_RULE_ENGINE__RULES__R1__ACTIONS": '[{function = "bridge:nope", '
                                                 'args = {topic = "x"}}]'},
     "rules.r1.actions[0]: no [bridges.mqtt.nope] configured"),
    ({"GATEWAY_RULE_ENGINE__RULES__R1__SQL": 'SELECT a FROM "t"',
      "GATEWAY_RULE_ENGINE__RULES__R1__ACTIONS": '[{function = "mail"}]'},
     "unknown action function 'mail'"),
])
def test_gatewayd_check_refuses_bad_rules(env: dict[str, str], msg: str) -> None:
    r = subprocess.run([sys.executable, "-m", "gateway.cli.gatewayd", "--check"],
                       env={**clean_environ(), **env}, capture_output=True, text=True,
                       timeout=60, check=False)
    assert r.returncode == 2, r.stderr
    assert msg in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_runtime_rules_persist_across_restarts(tmp_path_factory: pytest.TempPathFactory) -> None:
    gw = Gatewayd(tmp_path_factory.mktemp("persist"), dict(CONFIG_RULES))
    gw.start()
    try:
        status, _, raw = gw.http("POST", f"{API}/rules", body={
            "id": "kept", "sql": 'SELECT payload AS p FROM "keep/#"',
            "actions": [{"function": "republish", "args": {"topic": "kept", "payload": "${p}"}}],
            "description": "made at run time"})
        assert status == 201, raw
        assert gw.http("DELETE", f"{API}/rules/div")[0] == 204  # a configured rule
        status, _, raw = gw.http("PUT", f"{API}/rules/level", body={"enable": False})
        assert status == 200 and json.loads(raw)["enable"] is False
    finally:
        gw.stop()
    gw.start()
    try:
        ids = {r["id"]: r for r in gw.get(f"{API}/rules")["data"]}
        assert "div" not in ids and ids["kept"]["origin"] == "api"
        assert ids["kept"]["description"] == "made at run time"
        assert ids["level"]["enable"] is False and ids["high_temp"]["enable"] is True
        sub = Client(gw, "k-sub").subscribe("kept", 0)
        Client(gw, "k-pub").publish("keep/1", b"still here", 1)
        assert sub.next_message().payload == b"still here"
    finally:
        gw.stop()


def test_bridge_action_forwards_through_the_outbox(
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A rule output sent upstream through ``[bridges.mqtt.up]`` (another gatewayd)."""
    upstream = Gatewayd(tmp_path_factory.mktemp("upstream"), node_name="up@127.0.0.1")
    upstream.start()
    edge = Gatewayd(tmp_path_factory.mktemp("edge"), {
        "GATEWAY_BRIDGES__MQTT__UP__SERVER": f"127.0.0.1:{upstream.mqtt_port}",
        "GATEWAY_RULE_ENGINE__RULES__UP__SQL":
            'SELECT payload.v * 2 AS v2, clientid FROM "local/#" WHERE payload.v > 0',
        "GATEWAY_RULE_ENGINE__RULES__UP__ACTIONS":
            '[{function = "bridge:up", args = {topic = "cloud/${clientid}", '
            'payload = "${v2}", qos = 1}}]',
    })
    try:
        sub = Client(upstream, "cloud-sub").subscribe("cloud/#", 1)
        edge.start()
        pub = Client(edge, "edge-dev")
        pub.publish("local/x", json.dumps({"v": 0}), 1)  # WHERE false: nothing goes up
        pub.publish("local/x", json.dumps({"v": 21}), 1)
        m = sub.next_message()
        assert (m.topic, m.payload, m.qos) == ("cloud/edge-dev", b"42", 1)
        no_message(sub)
        assert rule(edge, "up")["action_metrics"][0]["success"] == 1
        # nodes keep no rules.db until they have something to keep there
        assert not (upstream.data_dir / "rules.db").exists()
        assert not (edge.data_dir / "rules.db").exists()
    finally:
        edge.stop()
        upstream.stop()


def test_answers_match_the_openapi_document(gatewayd: Gatewayd) -> None:
    import jsonschema

    from gateway.admin.openapi_doc import openapi_document

    doc = openapi_document("0")

    def check(method: str, doc_path: str, url: str, status: int, body: Any = None) -> None:
        got, _, raw = gatewayd.http(method, url, body=body)
        assert got == status, (url, got, raw)
        content = doc["paths"][doc_path][method.lower()]["responses"][str(status)].get(
            "content", {})
        if "application/json" in content:
            schema = {**content["application/json"]["schema"], "components": doc["components"]}
            errors = list(jsonschema.Draft202012Validator(schema).iter_errors(json.loads(raw)))
            assert not errors, (url, [e.message for e in errors[:5]])

    check("GET", f"{API}/rules", f"{API}/rules", 200)
    check("POST", f"{API}/rules", f"{API}/rules", 201,
          {"id": "oas", "sql": 'SELECT * FROM "oas/#"', "actions": ["console"]})
    check("POST", f"{API}/rules", f"{API}/rules", 409, {"id": "oas", "sql": 'SELECT * FROM "t"'})
    check("POST", f"{API}/rules", f"{API}/rules", 400, {"id": "x", "sql": "SELECT"})
    check("GET", f"{API}/rules/{{id}}", f"{API}/rules/oas", 200)
    check("PUT", f"{API}/rules/{{id}}", f"{API}/rules/oas", 200, {"enable": False})
    check("GET", f"{API}/rules/{{id}}/metrics", f"{API}/rules/oas/metrics", 200)
    check("PUT", f"{API}/rules/{{id}}/metrics/reset", f"{API}/rules/oas/metrics/reset", 204)
    check("POST", f"{API}/rule_test", f"{API}/rule_test", 200,
          {"sql": 'SELECT 1 AS one FROM "t/#"', "context": {"topic": "t/1"}})
    check("POST", f"{API}/rule_test", f"{API}/rule_test", 412,
          {"sql": 'SELECT 1 FROM "t/#" WHERE 1 = 2', "context": {}})
    check("GET", f"{API}/webhooks", f"{API}/webhooks", 200)
    check("DELETE", f"{API}/rules/{{id}}", f"{API}/rules/oas", 204)
    check("GET", f"{API}/rules/{{id}}", f"{API}/rules/oas", 404)


def test_every_rules_route_needs_the_token(gatewayd: Gatewayd) -> None:
    from gateway.admin.rules_api import ROUTES

    for method, path, _ in ROUTES:
        assert gatewayd.http(method, path.replace("{id}", "high_temp"), auth=False)[0] == 401


@pytest.mark.storage
def test_a_corrupt_rules_db_is_salvaged_at_start(tmp_path_factory: pytest.TempPathFactory) -> None:
    """rules.db (rules made at run time, webhook queues) is checked at start like
    gateway.db: a torn header does not stop the node, the rule survives, an alarm says so."""
    from tests.fsfaults import corrupt

    gw = Gatewayd(tmp_path_factory.mktemp("torn"), dict(CONFIG_RULES))
    gw.start()
    try:
        status, _, raw = gw.http("POST", f"{API}/rules", body={
            "id": "survivor", "sql": 'SELECT payload AS p FROM "s/#"',
            "actions": [{"function": "republish", "args": {"topic": "s-out", "payload": "${p}"}}]})
        assert status == 201, raw
    finally:
        gw.stop()
    corrupt(gw.data_dir / "rules.db", 0, 100)  # the file header: "file is not a database"
    gw.start()
    try:
        alarms = {a["name"]: a for a in gw.get(f"{API}/alarms")["data"]}
        assert "store_salvaged" in alarms, alarms
        assert "rules.db" in alarms["store_salvaged"]["message"]
        assert "survivor" in {r["id"] for r in gw.get(f"{API}/rules")["data"]}
        assert list(gw.data_dir.glob("rules.db.corrupt-*")), "the damaged file is kept"
    finally:
        gw.stop()
