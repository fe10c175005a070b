"""The dashboard in a real browser: Debian's chromium driven by Playwright (no browser
download), against a real gatewayd with paho clients.

Set up the first administrator through the one-time link, see the overview's numbers
move while a client publishes, kick a client, delete a retained message, visit every
page without a script error or a request to anywhere but the gateway. Screenshots go to
the test's tmp dir; with ``DASHBOARD_SCREENSHOTS=DIR`` also to DIR (docs/dashboard/
holds the committed ones).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.gateway.admin.dashboard.web import setup_tokens
from tests.gateway.admin.gatewayd import Client, Gatewayd, clients

pytestmark = [pytest.mark.slow, pytest.mark.interop, pytest.mark.dashboard]

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]
PASSWORD = "browser-admin-pw"
TIMEOUT_MS = 30_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


class Publisher:
    """A paho client publishing on ``dash/live`` every 50 ms until stopped."""

    def __init__(self, gw: Gatewayd) -> None:
        self.client = Client(gw, "dash-live-publisher")
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        n = 0
        while not self.stop.wait(0.05):  # the publishing rate, not a wait for an event
            self.client.c.publish("dash/live", f"m{n}", qos=0)
            n += 1

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.client.close()


def poll(page: Any, selector: str, ok: Callable[[float | None], bool]) -> float | None:
    """Bounded poll of a number shown on the page (the page's CSP forbids the eval that
    ``wait_for_function`` needs, rightly). Returns the number that satisfied ``ok``."""
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while True:
        text = page.inner_text(selector).replace(",", "")
        try:
            value: float | None = float(text)
        except ValueError:
            value = None
        if ok(value):
            return value
        assert time.monotonic() < deadline, f"{selector} stayed at {text!r}"
        page.wait_for_timeout(200)


def kickable(gw: Gatewayd, client_id: str) -> tuple[mqtt.Client, threading.Event]:
    """A paho client that does not reconnect once kicked; its disconnect is an event."""
    gone = threading.Event()
    connected = threading.Event()
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5,
                    reconnect_on_failure=False)
    c.on_connect = lambda *a: connected.set()
    c.on_disconnect = lambda *a: gone.set()
    c.connect("127.0.0.1", gw.mqtt_port)
    c.loop_start()
    assert connected.wait(10)
    return c, gone


def test_setup_live_overview_kick_and_retained_delete(
    gatewayd: Gatewayd, browser: Any, tmp_path: Path
) -> None:
    shots = tmp_path / "screenshots"
    shots.mkdir()
    errors: list[str] = []
    foreign: list[str] = []
    base = f"http://127.0.0.1:{gatewayd.api_port}"
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.on("pageerror", lambda e: errors.append(str(e)))
    # a CSP refusal (an inline style or script) shows as a console error; failed fetches
    # (the 401 of the session probe before login) are expected
    page.on("console", lambda m: errors.append(m.text) if m.type == "error"
            and not m.text.startswith("Failed to load resource") else None)
    page.on("request", lambda r: None if r.url.startswith(base) else foreign.append(r.url))
    page.on("dialog", lambda d: d.accept())

    def shot(name: str) -> None:
        page.screenshot(path=str(shots / f"{name}.png"), full_page=True)

    # no administrator: the page asks for a login and says where the setup link is
    page.goto(f"{base}/dashboard/")
    page.wait_for_selector("#login-submit")
    assert "gatewayctl admin setup" in page.inner_text("form.login")
    shot("login")
    token = setup_tokens(gatewayd.log())[-1]
    page.goto(f"{base}/dashboard/#/setup/{token}")
    page.wait_for_selector("#setup-submit")
    page.fill("#setup-user", "root")
    page.fill("#setup-password", PASSWORD)
    page.fill("#setup-password2", PASSWORD)
    shot("setup")
    page.click("#setup-submit")
    page.wait_for_selector("nav#nav a.active[data-page=overview]")
    assert "root (administrator)" in page.inner_text("#who")

    with clients() as made:
        made.append(Client(gatewayd, "dash-live-subscriber").subscribe("dash/#"))
        publisher = Publisher(gatewayd)
        try:
            first = poll(page, "#v-received", lambda v: v is not None)
            # the numbers move while the client publishes (the page polls every 2 s)
            poll(page, "#v-received", lambda v: v is not None and v > (first or 0))
            poll(page, "#v-rate-in", lambda v: v is not None and v > 0)
            assert int(page.inner_text("#v-connections")) >= 2
            shot("overview")
        finally:
            publisher.close()

    # clients: search, kick
    victim, gone = kickable(gatewayd, "dash-kick-victim")
    try:
        page.click("nav a[data-page=clients]")
        page.fill("#client-search", "dash-kick")
        page.press("#client-search", "Enter")
        page.wait_for_selector("button[data-kick='dash-kick-victim']")
        shot("clients")
        page.click("button[data-kick='dash-kick-victim']")
        assert gone.wait(15), "the kicked client was not disconnected"
        page.wait_for_selector("#toast:has-text('dash-kick-victim kicked')")
    finally:
        victim.loop_stop()
    assert "DELETE /api/v5/clients/dash-kick-victim -> 200" in gatewayd.log()

    # retained messages: browse, show, delete
    with clients() as made:
        pub = Client(gatewayd, "dash-retainer")
        made.append(pub)
        pub.publish("dash/retained/keep", "stays", qos=1, retain=True)
        pub.publish("dash/retained/drop", "goes", qos=1, retain=True)
    page.click("nav a[data-page=retained]")
    page.fill("#retained-filter", "dash/retained/#")
    page.click("text=Filter")
    page.wait_for_selector("button[data-delete='dash/retained/drop']")
    shot("retained")
    page.click("button[data-delete='dash/retained/drop']")
    page.wait_for_selector("#toast:has-text('deleted dash/retained/drop')")
    page.wait_for_selector("button[data-delete='dash/retained/drop']", state="detached")
    status, _, _ = gatewayd.http("GET", "/api/v5/retainer/messages/dash%2Fretained%2Fdrop")
    assert status == 404
    assert gatewayd.http("GET", "/api/v5/retainer/messages/dash%2Fretained%2Fkeep")[0] == 200

    # rules: list with metrics, disable, test SQL (the rule made through the API)
    status, _, _ = gatewayd.http("POST", "/api/v5/rules", body={
        "id": "hot", "sql": 'SELECT payload.temp AS t FROM "sensors/#" WHERE payload.temp > 20',
        "actions": [{"function": "republish", "args": {"topic": "alerts/hot"}}]})
    assert status == 201
    page.click("nav a[data-page=rules]")
    page.wait_for_selector("button[data-toggle='hot']:has-text('Disable')")
    page.click("button[data-toggle='hot']")
    page.wait_for_selector("button[data-toggle='hot']:has-text('Enable')")
    assert gatewayd.get("/api/v5/rules/hot")["enable"] is False
    page.click("#rule-test")
    page.wait_for_selector("#rule-output:has-text('\"t\": 25')")
    shot("rules")

    # trace: a topic trace shows a publish as it happens
    page.click("nav a[data-page=trace]")
    page.select_option("#trace-kind", "topic")
    page.fill("#trace-what", "dash/trace/#")
    page.click("#trace-start")
    page.wait_for_selector("#trace-out:has-text('trace.started')")
    with clients() as made:
        tracer = Client(gatewayd, "dash-traced")
        made.append(tracer)
        tracer.publish("dash/trace/t1", "seen-in-trace", qos=1)
        page.wait_for_selector("#trace-out:has-text('message.publish')")
        assert "dash/trace/t1" in page.inner_text("#trace-out")
    shot("trace")

    # every other page renders without a script error
    for name in ("subscriptions", "listeners", "alarms", "users", "bridges", "cluster"):
        page.click(f"nav a[data-page={name}]")
        page.wait_for_selector(f"nav a.active[data-page={name}]")
        page.wait_for_selector("main h1")
        page.wait_for_load_state("networkidle")
        assert not page.query_selector("main p.error"), (name, page.inner_text("main"))
        shot(name)
    page.click("nav a[data-page=overview]")
    poll(page, "#v-received", lambda v: v is not None)
    shot("overview-after")
    assert errors == [] and foreign == []
    context.close()

    copy_to = os.environ.get("DASHBOARD_SCREENSHOTS")
    if copy_to:
        Path(copy_to).mkdir(parents=True, exist_ok=True)
        for name in ("overview", "clients", "retained", "setup", "listeners"):
            shutil.copy(shots / f"{name}.png", Path(copy_to) / f"{name}.png")
    print(f"screenshots in {shots}")
