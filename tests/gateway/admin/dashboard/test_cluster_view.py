"""A real two-node cluster: ``gateway_cluster_peer_up`` (what the GatewayClusterLinkDown
alert of docs/monitoring/alerts.yml watches) is 1 while the links are up and 0 once the
peer is killed, and the dashboard's cluster page shows both members and their links."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.admin.dashboard.test_browser import ARGS, CHROMIUM
from tests.gateway.admin.dashboard.web import WebSession, setup_tokens
from tests.gateway.cluster.harness import Node, make_pki, wait_mesh, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.dashboard]


def cluster_gauges(node: Node) -> dict[str, float]:
    status, body = node.http("GET", "/metrics", auth=False)
    assert status == 200
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            if s.name.startswith("gateway_cluster_"):
                key = s.name + (f"{{{s.labels['peer']}}}" if "peer" in s.labels else "")
                out[key] = s.value
    return out


def test_peer_up_gauge_and_cluster_page(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki", ["a@127.0.0.1", "b@127.0.0.1"])
    a = Node(tmp_path, "a", pki)
    b = Node(tmp_path, "b", pki, seeds=[a])
    try:
        a.start()
        b.start()
        wait_mesh([a, b])
        assert cluster_gauges(a) == {"gateway_cluster_peer_up{b@127.0.0.1}": 1.0,
                                     "gateway_cluster_nodes_up": 2.0,
                                     "gateway_cluster_nodes_total": 2.0}
        if os.path.exists(CHROMIUM):
            sync_api = pytest.importorskip("playwright.sync_api")
            web = WebSession(a)  # type: ignore[arg-type]  # has api_port and log()
            assert web.setup(setup_tokens(a.log())[-1], "root", "cluster-admin-pw")[0] == 200
            with sync_api.sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS,
                                            headless=True)
                try:
                    ctx = browser.new_context(viewport={"width": 1280, "height": 600})
                    ctx.add_cookies([{"name": k, "value": v,
                                      "url": f"http://127.0.0.1:{a.api_port}"}
                                     for k, v in web.cookies.items()])
                    page = ctx.new_page()
                    page.goto(f"http://127.0.0.1:{a.api_port}/dashboard/#/cluster")
                    page.wait_for_selector("main td:has-text('b@127.0.0.1')")
                    page.wait_for_selector("main .badge.ok:has-text('control out up')")
                    page.screenshot(path=str(tmp_path / "cluster.png"), full_page=True)
                finally:
                    browser.close()
        b.kill()
        wait_until(lambda: cluster_gauges(a).get("gateway_cluster_peer_up{b@127.0.0.1}") == 0,
                   30, "peer_up of b to drop to 0")
        assert cluster_gauges(a)["gateway_cluster_nodes_up"] == 1.0
    finally:
        b.stop()
        a.stop()
