"""What every sink shares: the durable buffer, one delivery task, health and counters.

A :class:`Sink` owns one :class:`~gateway.store.queue.DurableQueue` (``KIND:NAME`` in
``{node.data_dir}/rules.db``) and one asyncio task. The task connects (with a backoff that
starts at ``retry_interval`` and doubles up to ``max_retry_interval``), takes up to
``buffer.batch_size`` items in queue order and hands them to :meth:`Sink.deliver`, which
answers one :class:`Outcome` per item:

- ``None``: delivered; the item leaves the buffer (``success``).
- :class:`Refused` (the server refused this item and would refuse it again: a constraint
  violation, a wrong type, an unroutable message): the item leaves the buffer, counted
  ``failed`` with the server's error in ``last_error`` (WARNING: a misbehaving peer).
  It never blocks the items behind it.
- :class:`Retry` for an item, or any exception out of ``deliver`` (connection lost,
  timeout, server shutting down): that item and every later one of the batch go back to
  the head of the buffer in their order, the connection is closed and re-made after the
  backoff. Nothing leaves the buffer that the server did not take or refuse.

So items leave in order, one batch at a time, and after a restart the buffer is loaded
again from disk: a ``kill -9`` of gatewayd loses nothing the buffer accepted (items in a
batch the server took but whose removal was not yet on disk are sent again: at least
once). A full buffer refuses new items: the rule's action fails, ``dropped`` is counted and
the alarm ``sink_buffer_full:KIND:NAME`` is active until the buffer is below half its size.

Health: ``status`` is ``connected``, ``connecting`` or ``disconnected``; while idle the task
pings the server every ``health_check_interval`` (:meth:`Sink.ping`) and a failed ping
closes the connection like a failed delivery.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gateway.config.connectors import ConnectorBase, ConnectorTls
from gateway.config.rules import WebhookTls
from gateway.store.queue import DurableQueue, QueueDb, QueueEntry

__all__ = ["Outcome", "Refused", "Retry", "Sink", "client_ssl_context"]

log = logging.getLogger("gateway.rules.sinks")

C = TypeVar("C", bound=ConnectorBase)


@dataclass(frozen=True, slots=True)
class Refused:
    error: str


@dataclass(frozen=True, slots=True)
class Retry:
    error: str


Outcome = Refused | Retry | None


def client_ssl_context(tls: ConnectorTls) -> ssl.SSLContext | None:
    """The client TLS context of a connector, None when TLS is off."""
    return tls_context(tls) if tls.enable else None


def tls_context(tls: WebhookTls) -> ssl.SSLContext:
    """A client TLS context from a webhook's or a connector's ``tls`` settings."""
    ctx = ssl.create_default_context(cafile=tls.cacertfile)
    if tls.verify == "verify_none":
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if tls.certfile:
        ctx.load_cert_chain(tls.certfile, tls.keyfile)
    return ctx


class Sink(abc.ABC, Generic[C]):
    """One connector and its buffer (see the module docstring)."""

    kind: str = ""

    def __init__(
        self,
        name: str,
        cfg: C,
        db: QueueDb,
        *,
        alarm: Callable[[str, str | None], None] = lambda name, message: None,
    ) -> None:
        self.name = name
        self.cfg = cfg
        self.id = f"{self.kind}:{name}"
        self.queue: DurableQueue = db.queue(self.id, cfg.buffer.max_bytes,
                                            on_overflow=self._overflow)
        self._alarm = alarm
        self._alarm_on = False
        self._wake = asyncio.Event()
        self.queue.on_put = self._wake.set
        self._task: asyncio.Task[None] | None = None
        self.connected = False
        self.status = "disconnected"
        self.success = 0
        self.failed = 0
        self.dropped = 0
        self.batches = 0
        self.connects = 0
        self.last_error: str | None = None
        self.last_health_check: float | None = None

    # -- producing (rule actions, loop thread) --------------------------------------------

    def put(self, item: bytes) -> None:
        """Buffer one rendered item; ValueError when the buffer has no room."""
        if self.queue.put(item) is None:
            raise ValueError(f"{self.id}: buffer full ({self.queue.bytes} of "
                             f"{self.queue.max_bytes} bytes)")

    def _overflow(self, size: int) -> None:
        self.dropped += 1
        if not self._alarm_on:
            self._alarm_on = True
            log.warning("%s: buffer full (%d bytes), new items are refused", self.id,
                        self.queue.max_bytes)
            self._alarm(f"sink_buffer_full:{self.id}",
                        f"{self.id}: buffer full ({self.queue.max_bytes} bytes), items refused")

    # -- what each kind provides -------------------------------------------------------

    @abc.abstractmethod
    async def connect(self) -> None:
        """Open the connection (raise on failure)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close the connection; never raises."""

    @abc.abstractmethod
    async def deliver(self, items: Sequence[bytes]) -> list[Outcome]:
        """Send ``items`` in order; one outcome per item, or raise to retry them all."""

    @abc.abstractmethod
    async def ping(self) -> None:
        """A cheap round trip to the server (raise when it does not answer)."""

    # -- the task --------------------------------------------------------------------------

    async def start(self) -> None:
        loaded = self.queue.load()
        if loaded:
            log.info("%s: %d buffered item(s) from before the restart", self.id, loaded)
        self._task = asyncio.create_task(self._run(), name=f"sink:{self.id}")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._disconnect()

    async def _disconnect(self) -> None:
        if self.connected:
            self.connected = False
            with contextlib.suppress(Exception):
                await self.close()
        self.status = "disconnected"

    async def _run(self) -> None:
        backoff = 0.0
        cfg = self.cfg
        while True:
            if not self.connected:
                self.status = "connecting"
                try:
                    await asyncio.wait_for(self.connect(), cfg.connect_timeout)
                except Exception as exc:
                    with contextlib.suppress(Exception):
                        await self.close()
                    self.status = "disconnected"
                    self._error(f"connect: {type(exc).__name__}: {exc}")
                    backoff = min(cfg.max_retry_interval, max(cfg.retry_interval, backoff * 2))
                    await asyncio.sleep(backoff)  # the backoff itself
                    continue
                self.connected = True
                self.status = "connected"
                self.connects += 1
                log.info("%s: connected to %s", self.id, cfg.server)
            batch = self._take()
            if not batch:
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), cfg.health_check_interval)
                except TimeoutError:
                    await self._health_check()
                continue
            ok = await self._deliver(batch)
            if ok:
                backoff = 0.0
            else:
                await self._disconnect()
                backoff = min(cfg.max_retry_interval, max(cfg.retry_interval, backoff * 2))
                await asyncio.sleep(backoff)  # the backoff itself

    def _take(self) -> list[QueueEntry]:
        batch: list[QueueEntry] = []
        for _ in range(self.cfg.buffer.batch_size):
            e = self.queue.take()
            if e is None:
                break
            batch.append(e)
        return batch

    async def _health_check(self) -> None:
        self.last_health_check = time.time()
        try:
            await asyncio.wait_for(self.ping(), self.cfg.request_timeout)
        except Exception as exc:
            self._error(f"health check: {type(exc).__name__}: {exc}")
            await self._disconnect()

    async def _deliver(self, batch: list[QueueEntry]) -> bool:
        """Deliver one batch; False when the rest of it went back to the buffer."""
        self.batches += 1
        try:
            outcomes = await asyncio.wait_for(self.deliver([e.item for e in batch]),
                                              self.cfg.request_timeout)
        except asyncio.CancelledError:
            for e in reversed(batch):
                self.queue.retry(e)
            raise
        except Exception as exc:
            self._error(f"{type(exc).__name__}: {exc}")
            outcomes = [Retry(self.last_error or "")] * len(batch)
        assert len(outcomes) == len(batch)
        retry_from = len(batch)
        for i, (e, outcome) in enumerate(zip(batch, outcomes, strict=True)):
            if isinstance(outcome, Retry):
                self._error(outcome.error)
                retry_from = i
                break
            if isinstance(outcome, Refused):
                self.failed += 1
                self._error(outcome.error)
                log.warning("%s: the server refused an item: %s", self.id, outcome.error)
            else:
                self.success += 1
            self._finish(e)
        for e in reversed(batch[retry_from:]):
            self.queue.retry(e)
        return retry_from == len(batch)

    def _error(self, error: str) -> None:
        if error != self.last_error:
            log.info("%s: %s", self.id, error)
        self.last_error = error

    def _finish(self, entry: QueueEntry) -> None:
        self.queue.done(entry)
        if self._alarm_on and self.queue.bytes < self.queue.max_bytes // 2:
            self._alarm_on = False
            self._alarm(f"sink_buffer_full:{self.id}", None)

    def stats(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.kind,
            "name": self.name,
            "server": self.cfg.server,
            "status": self.status,
            "success": self.success,
            "failed": self.failed,
            "dropped": self.dropped,
            "batches": self.batches,
            "connects": self.connects,
            "last_error": self.last_error,
            "last_health_check": self.last_health_check,
            "buffer": self.queue.stats(),
        }
