"""Rules on a multi-worker node (``node.workers = 2``, a real supervisor and workers):
a configured rule runs once per message, not once per worker, whichever worker the
publisher is on; an event rule fires once per connection; a rule made through one
worker's API runs in the other worker too, and deleting it through the other worker's
API stops it in both; every worker's API and /metrics show the node's rule metrics (the
sum over the workers), and a reset through one worker zeroes them all."""

from __future__ import annotations

import http.client
import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.cluster.harness import WAIT, Client, wait_until
from tests.gateway.workers.harness import WorkerNode

pytestmark = [pytest.mark.slow, pytest.mark.rules]

RULES = {
    "GATEWAY_RULE_ENGINE__RULES__COPY__SQL": 'SELECT payload FROM "in/#"',
    "GATEWAY_RULE_ENGINE__RULES__COPY__ACTIONS":
        '[{function = "republish", args = {topic = "out/${topic}", payload = "${payload}", '
        "qos = 1}}]",
    "GATEWAY_RULE_ENGINE__RULES__HELLO__SQL":
        "SELECT clientid FROM \"$events/client_connected\" WHERE clientid = 'hello'",
    "GATEWAY_RULE_ENGINE__RULES__LOST__SQL":
        "SELECT topic, reason FROM \"$events/message_dropped\" WHERE topic = 'nobody/x'",
    "GATEWAY_RULE_ENGINE__RULES__LOST__ACTIONS":
        '[{function = "republish", args = {topic = "ev/lost", payload = "${reason}", '
        "qos = 1}}]",
    "GATEWAY_RULE_ENGINE__RULES__HELLO__ACTIONS":
        '[{function = "republish", args = {topic = "ev/${clientid}", payload = "up", '
        "qos = 1}}]",
}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerNode]:
    n = WorkerNode(Path(tmp_path_factory.mktemp("rules-workers")), extra=dict(RULES))
    try:
        n.start()
        yield n
    finally:
        code = n.stop()
    assert code == 0, n.log()[-4000:]


def api(node: WorkerNode, i: int, method: str, path: str, body: Any = None
        ) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", node.api_port + i, timeout=10)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Authorization": f"Bearer {node.token}",
                              "Content-Type": "application/json"})
        r = conn.getresponse()
        raw = r.read()
        return r.status, json.loads(raw) if raw else None
    finally:
        conn.close()


def drained(c: Any, timeout: float = 1.0) -> list[Any]:
    """Whatever else arrives within ``timeout`` (to show nothing came twice)."""
    out = []
    while True:
        try:
            out.append(c.next_message(timeout))
        except queue.Empty:
            return out


def matched(node: WorkerNode, rule: str) -> list[int]:
    return [api(node, i, "GET", f"/api/v5/rules/{rule}")[1]["metrics"]["matched"]
            for i in (0, 1)]


def test_a_rule_runs_once_per_message_and_event(node: WorkerNode) -> None:
    sub = node.client_on(0, "sub").subscribe("out/#", 1).subscribe("ev/#", 1)
    wait_until(lambda: node.routes_of(1, 0) >= 1, what="worker 1 knows sub's routes")
    pubs = [node.client_on(i, f"pub{i}") for i in (0, 1)]
    for i, p in enumerate(pubs):
        for k in range(10):
            p.publish(f"in/{i}", f"m{i}-{k}", qos=1)
    got = sorted(m.payload.decode() for m in sub.collect(20))
    assert got == sorted(f"m{i}-{k}" for i in (0, 1) for k in range(10))
    assert drained(sub) == []  # no copies: each message ran through the rule once
    # counted on the publisher's worker; every worker shows the node's total
    wait_until(lambda: matched(node, "copy") == [20, 20], WAIT, "node totals of copy")
    # one connection (on whichever worker), one event
    hello = Client(node, "hello")  # type: ignore[arg-type]
    wait_until(lambda: node.where("hello") is not None, what="hello listed")
    m = sub.next_message()
    assert (m.topic, m.payload) == ("ev/hello", b"up")
    assert drained(sub) == []
    # a message nobody (on any worker) subscribes to: one message_dropped event
    hello.publish("nobody/x", "void", qos=1)
    m = sub.next_message()
    assert (m.topic, m.payload) == ("ev/lost", b"no_subscribers")
    assert drained(sub) == []
    for c in (*pubs, hello, sub):
        c.close()


def test_run_time_rule_changes_reach_every_worker(node: WorkerNode) -> None:
    status, body = api(node, 0, "POST", "/api/v5/rules", {
        "id": "rt", "sql": 'SELECT payload FROM "rt/#"',
        "actions": [{"function": "republish",
                     "args": {"topic": "rtout/${topic}", "payload": "${payload}"}}]})
    assert status == 201, body
    # worker 1 sees the rule in its own API, and runs it
    wait_until(lambda: api(node, 1, "GET", "/api/v5/rules/rt")[0] == 200, WAIT,
               "rule rt on worker 1")
    sub = node.client_on(0, "rtsub").subscribe("rtout/#", 1)
    wait_until(lambda: node.routes_of(1, 0) >= 1, what="routes")
    pub1 = node.client_on(1, "rtpub1")
    pub1.publish("rt/a", "via-w1", qos=1)
    assert sub.next_message().payload == b"via-w1"
    # an update through worker 1 reaches worker 0
    status, body = api(node, 1, "PUT", "/api/v5/rules/rt", {
        "actions": [{"function": "republish",
                     "args": {"topic": "rtout/v2/${topic}", "payload": "${payload}"}}]})
    assert status == 200, body

    def updated_on_0() -> bool:
        r = api(node, 0, "GET", "/api/v5/rules/rt")[1]
        return bool(r["actions"][0]["args"]["topic"].startswith("rtout/v2/"))

    wait_until(updated_on_0, WAIT, "the update on worker 0")
    pub0 = node.client_on(0, "rtpub0")
    pub0.publish("rt/b", "via-w0", qos=1)
    m = sub.next_message()
    assert (m.topic, m.payload) == ("rtout/v2/rt/b", b"via-w0")
    # deleted through worker 1: gone from worker 0 as well
    assert api(node, 1, "DELETE", "/api/v5/rules/rt")[0] == 204
    wait_until(lambda: api(node, 0, "GET", "/api/v5/rules/rt")[0] == 404, WAIT,
               "rule rt gone from worker 0")
    pub0.publish("rt/c", "after-delete", qos=1)
    pub1.publish("rt/c", "after-delete", qos=1)
    assert drained(sub) == []
    for c in (sub, pub0, pub1):
        c.close()


def test_metrics_are_node_totals_and_reset_everywhere(node: WorkerNode) -> None:
    status, body = api(node, 0, "POST", "/api/v5/rules", {
        "id": "cnt", "sql": 'SELECT payload FROM "cnt/#" WHERE payload = \'yes\'',
        "actions": [{"function": "console"}]})
    assert status == 201, body
    wait_until(lambda: api(node, 1, "GET", "/api/v5/rules/cnt")[0] == 200, WAIT,
               "rule cnt on worker 1")
    pubs = [node.client_on(i, f"cntpub{i}") for i in (0, 1)]
    for i, p in enumerate(pubs):  # worker 0: 3 pass, 1 not; worker 1: 2 pass, 2 not
        for k in range(4):
            p.publish(f"cnt/{i}", "yes" if k < 3 - i else "no", qos=1)

    def metrics(i: int) -> tuple[Any, ...]:
        r = api(node, i, "GET", "/api/v5/rules/cnt/metrics")[1]
        m = r["metrics"]
        return (m["matched"], m["passed"], m["failed.no_result"],
                r["action_metrics"][0]["success"])

    wait_until(lambda: metrics(0) == metrics(1) == (8, 5, 3, 5), WAIT, "node totals")
    for i in (0, 1):
        status, raw = node.http(i, "GET", "/metrics")
        text = raw.decode()
        assert 'gateway_rule_matched_total{rule="cnt"} 8.0' in text, text
        assert 'gateway_rule_actions_total{action="0:console",result="success",' \
               'rule="cnt"} 5.0' in text
    assert api(node, 1, "PUT", "/api/v5/rules/cnt/metrics/reset")[0] == 204
    assert metrics(1)[0] == 0 and metrics(0)[0] == 0
    pubs[0].publish("cnt/0", "yes", qos=1)
    wait_until(lambda: metrics(0) == metrics(1) == (1, 1, 0, 1), WAIT, "counts after reset")
    assert api(node, 0, "DELETE", "/api/v5/rules/cnt")[0] == 204
    for p in pubs:
        p.close()
