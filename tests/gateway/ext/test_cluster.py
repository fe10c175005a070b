"""The extensions across a two-node cluster (real gatewayd nodes over mutual TLS): an
exclusive subscription held on one node is refused on the other, and released there when
its holder leaves; a delayed message published on one node reaches a subscriber of the
other; auto-subscribe and rewrite apply on both (the same configuration)."""

from __future__ import annotations

import json
import queue
from collections.abc import Callable
from typing import Any

import pytest
from paho.mqtt.reasoncodes import ReasonCode

from tests.gateway.cluster.conftest import nodes, pki  # noqa: F401 (fixtures)
from tests.gateway.cluster.harness import WAIT, Client, Node, wait_mesh, wait_until

pytestmark = [pytest.mark.ext, pytest.mark.slow]

EXTRA = {
    "GATEWAY_MQTT__EXCLUSIVE_SUBSCRIPTION": "true",
    "GATEWAY_AUTO_SUBSCRIBE__TOPICS": '[{topic = "cmd/${clientid}", qos = 1}]',
}


def suback(c: Client, topic: str, qos: int = 0) -> int:
    got: queue.Queue[list[Any]] = queue.Queue()
    c.c.on_subscribe = lambda cl, u, mid, rcs, p: got.put(rcs)
    c.c.subscribe(topic, qos)
    rc = got.get(timeout=WAIT)[0]
    return int(rc.value) if isinstance(rc, ReasonCode) else int(rc)


def test_exclusive_across_two_nodes_and_delayed_between_them(
    nodes: Callable[..., Node],  # noqa: F811
) -> None:
    a = nodes("a", extra=EXTRA)
    b = nodes("b", seeds=[a], extra=EXTRA)
    wait_mesh([a, b])
    ca = Client(a, "holder-a")
    cb = Client(b, "other-b")
    try:
        assert suback(ca, "$exclusive/plant/valve", 1) == 1
        # b learns of the hold with a's routes (streamed over the control link)
        wait_until(lambda: _held_on(b, "plant/valve") == a.name, WAIT,
                   "b to see a's exclusive route")
        assert suback(cb, "$exclusive/plant/valve", 1) == 0x97
        # auto-subscribe works on b too; a delayed message from a reaches b's client
        ca.publish("$delayed/1/cmd/other-b", b"later", qos=1)
        m = cb.next_message(WAIT)
        assert (m.topic, m.payload) == ("cmd/other-b", b"later")
        # released on a when its holder leaves: b may take it
        ca.close()
        wait_until(lambda: _held_on(b, "plant/valve") is None, WAIT,
                   "a's exclusive route to go")
        assert suback(cb, "$exclusive/plant/valve", 1) == 1
    finally:
        ca.close()
        cb.close()


def _held_on(node: Node, topic: str) -> str | None:
    """The node holding ``topic`` as ``node``'s API sees it."""
    status, body = node.http("GET", "/api/v5/mqtt/exclusive?limit=10000")
    assert status == 200, body
    found = [h["node"] for h in json.loads(body)["data"] if h["topic"] == topic]
    return found[0] if found else None
