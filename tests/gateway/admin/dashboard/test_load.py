"""The dashboard with 10,000 clients connected: the overview shows its numbers and the
clients page its first (server-paged) page in under a second each, in Debian's chromium.

10,000 real MQTT 3.1.1 connections (asyncio streams: CONNECT, wait for CONNACK) from this
process to a real gatewayd. Times are wall clock on whatever machine runs the test
(contended CI included), so the bound is the issue's 1 s per page.
"""

from __future__ import annotations

import asyncio
import resource
import statistics
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.gateway.admin.dashboard.test_browser import ARGS, CHROMIUM, poll
from tests.gateway.admin.dashboard.web import WebSession, setup_tokens
from tests.gateway.admin.gatewayd import Gatewayd

pytestmark = [pytest.mark.slow, pytest.mark.interop, pytest.mark.dashboard]

CLIENTS = 10_000
PASSWORD = "load-admin-pw"


def connect_packet(client_id: str) -> bytes:
    cid = client_id.encode()
    var = b"\x00\x04MQTT\x04\x02\x00\x3c" + struct.pack("!H", len(cid)) + cid
    return bytes([0x10, len(var)]) + var


async def open_clients(port: int, n: int) -> list[asyncio.StreamWriter]:
    sem = asyncio.Semaphore(200)
    writers: list[asyncio.StreamWriter] = []

    async def one(i: int) -> None:
        async with sem:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(connect_packet(f"load-{i:05d}"))
            assert await reader.readexactly(4) == b"\x20\x02\x00\x00"  # CONNACK accepted
            writers.append(writer)

    await asyncio.gather(*(one(i) for i in range(n)))
    return writers


async def close_all(writers: list[asyncio.StreamWriter]) -> None:
    for w in writers:
        w.close()
    await asyncio.gather(*(w.wait_closed() for w in writers), return_exceptions=True)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Gatewayd, Any]]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < CLIENTS + 2048:
        pytest.skip(f"open-file hard limit {hard} is below {CLIENTS + 2048}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, CLIENTS + 2048), hard))
    gw = Gatewayd(tmp_path_factory.mktemp("load"), {
        "GATEWAY_LISTENERS__TCP__DEFAULT__MAX_CONNECTIONS": str(CLIENTS * 2)})
    gw.start()
    loop = asyncio.new_event_loop()
    started = time.monotonic()
    writers = loop.run_until_complete(open_clients(gw.mqtt_port, CLIENTS))
    print(f"{CLIENTS} clients connected in {time.monotonic() - started:.1f} s")
    try:
        yield gw, writers
    finally:
        # really close the 10,000 sockets (the loop must run for that): left open, they
        # push later sockets of this process past FD_SETSIZE, where paho's select() fails
        loop.run_until_complete(close_all(writers))
        loop.close()
        gw.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_pages_load_in_under_a_second_with_10000_clients(
    loaded: tuple[Gatewayd, Any], tmp_path: Path
) -> None:
    import os

    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed")
    sync_api = pytest.importorskip("playwright.sync_api")
    gw, _ = loaded
    assert gw.get("/api/v5/stats")["connections.count"] == CLIENTS
    web = WebSession(gw)
    assert web.setup(setup_tokens(gw.log())[-1], "root", PASSWORD)[0] == 200
    api: list[float] = []
    for _ in range(5):
        t0 = time.monotonic()
        status, _, _ = web.request("GET", "/api/v5/clients?page=1&limit=20")
        api.append(time.monotonic() - t0)
        assert status == 200
    rounds: dict[str, list[float]] = {"overview": [], "clients": []}
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 860})
            context.add_cookies([{"name": k, "value": v, "url": f"http://127.0.0.1:{gw.api_port}"}
                                 for k, v in web.cookies.items()])
            page = context.new_page()
            page.set_default_timeout(30_000)
            base = f"http://127.0.0.1:{gw.api_port}/dashboard/"
            for _ in range(4):  # the first round warms caches; the median of the rest
                t0 = time.monotonic()
                page.goto(base + "#/overview")
                poll(page, "#v-connections", lambda v: v == CLIENTS)
                rounds["overview"].append(time.monotonic() - t0)
                t0 = time.monotonic()
                page.goto(base + "#/clients")
                page.wait_for_selector("button[data-kick='load-00019']")
                rounds["clients"].append(time.monotonic() - t0)
                assert "of 500" in page.inner_text("#client-list")  # 10,000 / 20 a page
            page.screenshot(path=str(tmp_path / "clients-10000.png"), full_page=True)
        finally:
            browser.close()
    timings = {k: statistics.median(v[1:]) for k, v in rounds.items()}
    print(f"with {CLIENTS} clients: GET /api/v5/clients (20 a page) median "
          f"{statistics.median(api) * 1000:.0f} ms; page loads (median of 3): " +
          ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in timings.items()) +
          f"; all rounds: {rounds}")
    assert timings["overview"] < 1.0 and timings["clients"] < 1.0, timings
