"""Webhooks end to end: a real gatewayd, paho publishers and a real local aiohttp server.

A request the durable queue accepted is delivered after an HTTP outage and after
``kill -9`` of gatewayd; a full queue refuses requests with a counter and an alarm that
clears once the queue drained."""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.gateway.admin.gatewayd import WAIT, Client, Gatewayd, free_port

API = "/api/v5"
pytestmark = pytest.mark.rules


class HookServer:
    """An aiohttp server on its own loop and thread; start/stop at will on one port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.received: queue.Queue[tuple[str, str, dict[str, str], bytes]] = queue.Queue()
        self.status = 200
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.received.put((request.method, request.path, dict(request.headers), body))
        return web.Response(status=self.status)

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT)

    def start(self) -> None:
        async def go() -> None:
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", self._handle)
            self.runner = web.AppRunner(app, access_log=None)
            await self.runner.setup()
            await web.TCPSite(self.runner, "127.0.0.1", self.port, reuse_address=True).start()

        self._run(go())

    def stop(self) -> None:
        async def go() -> None:
            if self.runner is not None:
                await self.runner.cleanup()
                self.runner = None

        self._run(go())

    def close(self) -> None:
        self.stop()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)

    def take(self, n: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < n:
            left = deadline - time.monotonic()
            assert left > 0, f"got {len(out)} of {n} requests"
            method, path, headers, body = self.received.get(timeout=left)
            out.append({"method": method, "path": path, "headers": headers,
                        "body": json.loads(body)})
        return out


@pytest.fixture
def server() -> Iterator[HookServer]:
    s = HookServer()
    s.start()
    yield s
    s.close()


def env_for(server: HookServer) -> dict[str, str]:
    url = f"http://127.0.0.1:{server.port}/hook"
    return {
        "GATEWAY_WEBHOOKS__SINK__URL": url,
        "GATEWAY_WEBHOOKS__SINK__METHOD": "PUT",
        "GATEWAY_WEBHOOKS__SINK__HEADERS": '{content-type = "application/json", '
                                          'x-client = "${clientid}"}',
        "GATEWAY_WEBHOOKS__SINK__BODY": '{"n": ${n}, "c": "${clientid}", "t": "${topic}"}',
        "GATEWAY_WEBHOOKS__SINK__RETRY_INTERVAL": "100ms",
        "GATEWAY_WEBHOOKS__SINK__MAX_RETRY_INTERVAL": "300ms",
        "GATEWAY_WEBHOOKS__SINK__CONCURRENCY": "4",
        "GATEWAY_WEBHOOKS__TINY__URL": url,
        "GATEWAY_WEBHOOKS__TINY__MAX_QUEUE_BYTES": "1KB",
        "GATEWAY_WEBHOOKS__TINY__RETRY_INTERVAL": "100ms",
        "GATEWAY_WEBHOOKS__TINY__MAX_RETRY_INTERVAL": "300ms",
        "GATEWAY_RULE_ENGINE__RULES__TO_SINK__SQL":
            'SELECT payload.n AS n, clientid, topic FROM "wh/#"',
        "GATEWAY_RULE_ENGINE__RULES__TO_SINK__ACTIONS":
            '[{function = "webhook:sink", args = {path = "n/${n}"}}]',
        "GATEWAY_RULE_ENGINE__RULES__TO_TINY__SQL": 'SELECT payload.n AS n FROM "tiny/#"',
        "GATEWAY_RULE_ENGINE__RULES__TO_TINY__ACTIONS": '[{function = "webhook:tiny"}]',
    }


def hooks(gw: Gatewayd) -> dict[str, dict[str, Any]]:
    return {w["name"]: w for w in gw.get(f"{API}/webhooks")["data"]}


def wait_until(gw: Gatewayd, pred: Any, what: str) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + 30
    while True:
        h = hooks(gw)
        if pred(h):
            return h
        assert time.monotonic() < deadline, f"{what}: {h}"
        time.sleep(0.05)  # bounded poll of the node's counters


def publish_all(gw: Gatewayd, topic: str, numbers: range) -> None:
    pub = Client(gw, f"pub-{topic}-{numbers.start}")
    for n in numbers:
        pub.publish(f"{topic}/{n}", json.dumps({"n": n}), 1)
    pub.c.disconnect()


@pytest.mark.slow
def test_delivered_through_an_outage_and_a_kill_9(tmp_path: Path, server: HookServer) -> None:
    gw = Gatewayd(tmp_path / "gw", env_for(server))
    gw.start()
    try:
        # 1. the server is up: requests arrive as rendered
        publish_all(gw, "wh", range(0, 5))
        got = server.take(5)
        first = min(got, key=lambda r: r["body"]["n"])
        assert first["method"] == "PUT" and first["path"] == "/hook/n/0"
        assert first["body"] == {"n": 0, "c": "pub-wh-0", "t": "wh/0"}
        assert first["headers"]["x-client"] == "pub-wh-0"
        wait_until(gw, lambda h: h["sink"]["success"] == 5, "5 delivered")

        # 2. an outage: requests wait in the queue, retried with backoff
        server.stop()
        publish_all(gw, "wh", range(5, 10))
        wait_until(gw, lambda h: h["sink"]["queue"]["depth"] == 5
                   and h["sink"]["queue"]["retried"] > 0, "5 queued and retried")
        server.start()
        got = server.take(5)
        assert sorted(r["body"]["n"] for r in got) == list(range(5, 10))
        wait_until(gw, lambda h: h["sink"]["queue"]["depth"] == 0, "queue drained")

        # 3. another outage, then kill -9 with requests queued (committed to disk)
        server.stop()
        publish_all(gw, "wh", range(10, 30))
        wait_until(gw, lambda h: h["sink"]["queue"]["depth"] == 20
                   and h["sink"]["queue"]["committed"] >= 30, "20 queued and committed")
        assert gw.proc is not None
        gw.proc.kill()
        gw.proc.wait(WAIT)
    finally:
        gw.stop()
    server.start()
    gw.start()
    try:
        got = server.take(20)
        numbers = sorted(r["body"]["n"] for r in got)
        assert numbers == list(range(10, 30))
        wait_until(gw, lambda h: h["sink"]["queue"]["depth"] == 0, "queue drained after restart")
        assert "20 queued request(s) from before the restart" in gw.log()
    finally:
        gw.stop()
    assert server.received.empty()  # nothing delivered twice here


@pytest.mark.slow
def test_a_full_queue_refuses_counts_and_alarms(tmp_path: Path, server: HookServer) -> None:
    gw = Gatewayd(tmp_path / "gw", env_for(server))
    gw.start()
    try:
        server.stop()
        publish_all(gw, "tiny", range(100))
        h = wait_until(gw, lambda h: h["tiny"]["dropped"] > 0, "overflow")
        queued = h["tiny"]["queue"]["depth"]
        assert 0 < queued < 100 and h["tiny"]["queue"]["bytes"] <= 1024
        r = gw.get(f"{API}/rules/to_tiny")
        assert r["metrics"]["actions.failed"] == h["tiny"]["dropped"]
        assert r["action_metrics"][0]["queue_depth"] == queued
        assert r["metrics"]["actions.success"] + r["metrics"]["actions.failed"] == 100
        alarms = {a["name"] for a in gw.get(f"{API}/alarms")["data"]}
        assert "webhook_queue_full:tiny" in alarms
        status, _, body = gw.http("GET", "/metrics", auth=False)
        assert status == 200
        assert f'gateway_webhook_requests_total{{result="dropped",webhook="tiny"}} ' \
               f'{float(h["tiny"]["dropped"])}' in body.decode()
        server.start()
        server.take(queued)
        wait_until(gw, lambda h: h["tiny"]["queue"]["depth"] == 0, "drained")
        deadline = time.monotonic() + WAIT
        while "webhook_queue_full:tiny" in {a["name"] for a in gw.get(f"{API}/alarms")["data"]}:
            assert time.monotonic() < deadline, "alarm not cleared"
            time.sleep(0.05)  # bounded poll
    finally:
        gw.stop()


@pytest.mark.slow
def test_a_4xx_answer_drops_the_request_and_counts_it(tmp_path: Path,
                                                      server: HookServer) -> None:
    server.status = 400
    gw = Gatewayd(tmp_path / "gw", env_for(server))
    gw.start()
    try:
        publish_all(gw, "wh", range(3))
        server.take(3)
        h = wait_until(gw, lambda h: h["sink"]["failed"] == 3, "3 failed")
        assert h["sink"]["queue"]["depth"] == 0 and h["sink"]["last_error"] == "HTTP 400"
    finally:
        gw.stop()
