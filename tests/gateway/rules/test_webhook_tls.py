"""A webhook over HTTPS (aiohttp server with a certificate from our CA), in process: the
CA file verifies the server, a client certificate is presented when configured, and an
unknown CA is refused (the request stays queued and is retried, never sent in clear)."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.config.rules import WebhookConfig
from gateway.rules.webhook import Webhook
from gateway.security.pki import init_ca, issue
from gateway.store.queue import QueueDb
from tests.gateway.admin.gatewayd import free_port


async def _serve(certs: Path, port: int, seen: list[dict[str, Any]],
                 require_client: bool) -> web.AppRunner:
    async def handle(request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        seen.append({"body": await request.json(), "peer": peer})
        return web.Response(status=204)

    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certs / "ca.crt"))
    ctx.load_cert_chain(certs / "server.crt", certs / "server.key")
    if require_client:
        ctx.verify_mode = ssl.CERT_REQUIRED
    app = web.Application()
    app.router.add_post("/hook", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, ssl_context=ctx).start()
    return runner


def _run(tmp_path: Path, tls: dict[str, Any], require_client: bool) -> tuple[
        list[dict[str, Any]], dict[str, Any]]:
    certs = tmp_path / "certs"
    if not certs.exists():
        init_ca(certs)
        issue(certs, "server", sans=["IP:127.0.0.1", "DNS:localhost"])
        issue(certs, "edge", server=False, client=True)
    port = free_port()
    seen: list[dict[str, Any]] = []

    async def go() -> dict[str, Any]:
        runner = await _serve(certs, port, seen, require_client)
        db = QueueDb.open(tmp_path / "rules.db", asyncio.get_running_loop())
        cfg = WebhookConfig(url=f"https://127.0.0.1:{port}/hook", retry_interval=0.05,
                            max_retry_interval=0.1, tls={"enable": True, **tls})
        hook = Webhook("secure", cfg, db)
        await hook.start()
        hook.send({"x": 1}, {})
        for _ in range(100):  # bounded wait for the outcome
            if hook.success or hook.queue.retried >= 3:
                break
            await asyncio.sleep(0.05)
        stats = hook.stats()
        await hook.stop()
        db.close()
        await runner.cleanup()
        return stats

    return seen, asyncio.run(go())


def test_https_with_our_ca_and_a_client_certificate(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    seen, stats = _run(tmp_path, {"cacertfile": str(certs / "ca.crt"),
                                  "certfile": str(certs / "edge.crt"),
                                  "keyfile": str(certs / "edge.key")}, require_client=True)
    assert stats["success"] == 1 and stats["queue"]["depth"] == 0
    assert seen[0]["body"] == {"x": 1}
    subject = dict(x[0] for x in seen[0]["peer"]["subject"])
    assert subject["commonName"] == "edge"


def test_an_unknown_server_certificate_is_refused_and_the_request_kept(tmp_path: Path) -> None:
    seen, stats = _run(tmp_path, {}, require_client=False)  # system CAs: ours is unknown
    assert seen == [] and stats["success"] == 0
    assert stats["queue"]["depth"] == 1 and stats["queue"]["retried"] >= 3
    assert "certificate verify failed" in (stats["last_error"] or "").lower() or \
        "ssl" in (stats["last_error"] or "").lower()


def test_verify_none_accepts_any_certificate(tmp_path: Path) -> None:
    seen, stats = _run(tmp_path, {"verify": "verify_none"}, require_client=False)
    assert stats["success"] == 1 and seen[0]["body"] == {"x": 1}
