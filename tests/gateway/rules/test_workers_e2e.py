"""Rules on a multi-worker node (``node.workers = 2``, a real supervisor and workers):
a configured rule runs once per message, not once per worker, whichever worker the
publisher is on; an event rule fires once per connection; a rule made through one
worker's API runs in the other worker too, and deleting it through the other worker's
API stops it in both."""

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
    assert sum(matched(node, "copy")) == 20  # counted on the publisher's worker
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
