"""Webhooks: rule outputs sent as HTTP requests (aiohttp) through a durable queue.

``send`` renders the request (URL, method, headers, body) at once and puts it on the
webhook's :class:`~gateway.store.queue.DurableQueue`; ``concurrency`` workers take
requests off the queue and send them. So a request the queue accepted is delivered even
if the HTTP server is down for a while or ``gatewayd`` is killed: the queue is on disk.

Outcome of one attempt:

- 2xx: delivered (``success``), the request leaves the queue.
- 4xx other than 408 and 429: the server refused this request and will refuse it again:
  it leaves the queue, counted ``failed`` and logged (WARNING: a misbehaving peer).
- anything else (connection refused, timeout, 5xx, 408, 429): retried after a backoff
  that starts at ``retry_interval`` and doubles up to ``max_retry_interval`` per worker;
  after ``max_retries`` retries (0: never give up) it leaves the queue as ``failed``.

A full queue refuses the request (the rule's action counts a failure), counts
``dropped`` and activates the alarm ``webhook_queue_full:NAME`` until the queue is below
half its size again: never a silent drop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp

from gateway.config.rules import WebhookConfig
from gateway.rules.functions import to_json
from gateway.rules.sinks.base import tls_context
from gateway.rules.template import Template
from gateway.store.queue import DurableQueue, QueueDb, QueueEntry

__all__ = ["QueueFull", "Webhook"]

log = logging.getLogger("gateway.rules.webhook")


class QueueFull(RuntimeError):
    pass


def ssl_context(cfg: WebhookConfig) -> ssl.SSLContext | bool:
    if not cfg.tls.enable and not cfg.url.startswith("https://"):
        return False
    return tls_context(cfg.tls)


class Webhook:
    """One ``[webhooks.NAME]`` (see the module docstring)."""

    def __init__(
        self,
        name: str,
        cfg: WebhookConfig,
        db: QueueDb,
        *,
        alarm: Callable[[str, str | None], None] = lambda name, message: None,
    ) -> None:
        self.name = name
        self.cfg = cfg
        self.queue: DurableQueue = db.queue(f"webhook:{name}", cfg.max_queue_bytes,
                                            on_overflow=self._overflow)
        self._alarm = alarm
        self._alarm_on = False
        self._body = Template(cfg.body) if cfg.body else None
        self._headers = {k: Template(v) for k, v in cfg.headers.items()}
        self._wake = asyncio.Event()
        self.queue.on_put = self._wake.set
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self.success = 0
        self.failed = 0
        self.dropped = 0
        self.last_error: str | None = None

    # -- producing (rule actions, loop thread) --------------------------------------------

    def send(
        self,
        output: dict[str, Any],
        columns: Mapping[str, Any],
        *,
        body: Template | None = None,
        path: Template | None = None,
    ) -> None:
        """Render one request and queue it; :class:`QueueFull` when there is no room."""
        tpl = body or self._body
        text = tpl.render(output, columns) if tpl is not None else to_json(output)
        url = self.cfg.url
        if path is not None:
            url = url.rstrip("/") + "/" + path.render(output, columns).lstrip("/")
        request = {
            "method": self.cfg.method.upper(),
            "url": url,
            "headers": {k: t.render(output, columns) for k, t in self._headers.items()},
            "body": text,
        }
        if self.queue.put(json.dumps(request, ensure_ascii=False).encode()) is None:
            raise QueueFull(f"webhook {self.name}: queue full ({self.queue.bytes} bytes)")

    def _overflow(self, size: int) -> None:
        self.dropped += 1
        if not self._alarm_on:
            self._alarm_on = True
            log.warning("webhook %s: queue full (%d bytes), requests are refused",
                        self.name, self.queue.max_bytes)
            self._alarm(f"webhook_queue_full:{self.name}",
                        f"webhook {self.name}: queue full ({self.queue.max_bytes} bytes), "
                        f"{self.dropped} request(s) refused")

    # -- consuming -----------------------------------------------------------------------

    async def start(self) -> None:
        loaded = self.queue.load()
        if loaded:
            log.info("webhook %s: %d queued request(s) from before the restart",
                     self.name, loaded)
        connector = aiohttp.TCPConnector(limit=self.cfg.concurrency, ssl=ssl_context(self.cfg))
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self.cfg.timeout)
        )
        self._tasks = [
            asyncio.create_task(self._worker(), name=f"webhook:{self.name}:{i}")
            for i in range(self.cfg.concurrency)
        ]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _worker(self) -> None:
        backoff = 0.0
        while True:
            entry = self.queue.take()
            if entry is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            try:
                outcome = await self._attempt(entry)
            except asyncio.CancelledError:
                self.queue.retry(entry)
                raise
            if outcome == "retry":
                cfg = self.cfg
                if cfg.max_retries and entry.attempts >= cfg.max_retries:
                    self.failed += 1
                    log.warning("webhook %s: giving up on a request after %d attempts: %s",
                                self.name, entry.attempts + 1, self.last_error)
                    self._finish(entry)
                    continue
                self.queue.retry(entry)
                backoff = min(cfg.max_retry_interval, max(cfg.retry_interval, backoff * 2))
                await asyncio.sleep(backoff)  # the backoff itself, not a wait for an event
            else:
                backoff = 0.0
                self._finish(entry)

    def _finish(self, entry: QueueEntry) -> None:
        self.queue.done(entry)
        if self._alarm_on and self.queue.bytes < self.queue.max_bytes // 2:
            self._alarm_on = False
            self._alarm(f"webhook_queue_full:{self.name}", None)

    async def _attempt(self, entry: QueueEntry) -> str:
        req = json.loads(entry.item)
        session = self._session
        assert session is not None
        kwargs: dict[str, Any] = {}
        if self.cfg.tls.server_name_indication:
            kwargs["server_hostname"] = self.cfg.tls.server_name_indication
        try:
            async with session.request(
                req["method"], req["url"], headers=req["headers"],
                data=req["body"].encode(), **kwargs,
            ) as resp:
                await resp.read()
                status = resp.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            return "retry"
        if 200 <= status < 300:
            self.success += 1
            return "done"
        self.last_error = f"HTTP {status}"
        if 400 <= status < 500 and status not in (408, 429):
            self.failed += 1
            log.warning("webhook %s: %s %s answered %d; request dropped",
                        self.name, req["method"], req["url"], status)
            return "done"
        return "retry"

    def stats(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self.cfg.url,
            "success": self.success,
            "failed": self.failed,
            "dropped": self.dropped,
            "last_error": self.last_error,
            "queue": self.queue.stats(),
        }
