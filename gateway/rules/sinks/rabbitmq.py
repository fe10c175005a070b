"""RabbitMQ sink (aio-pika, AMQP 0.9.1): publisher confirms, persistent messages.

An item is ``{"e": exchange, "k": routing key, "b": body, "p": persistent, "m":
mandatory}``. The channel is in confirm mode: a batch is published in order and an item is
done only when the broker's ``Basic.Ack`` for it arrived (for a persistent message on a
durable queue that means it is on the broker's disk). ``Basic.Nack`` or a lost
connection retries that item and the rest of the batch (at least once: a message whose ack
was lost is published again). With ``mandatory = true`` an unroutable message is returned
by the broker: ``Refused``. The exchange is the user's (not declared here); publishing to
one that does not exist closes the channel, which is retried with the error shown.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import aio_pika
from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractExchange
from aio_pika.exceptions import DeliveryError, PublishError

from gateway.config.connectors import RabbitmqConnector, host_port
from gateway.rules.sinks.base import Outcome, Refused, Retry, Sink, client_ssl_context

__all__ = ["RabbitmqSink"]


class RabbitmqSink(Sink[RabbitmqConnector]):
    kind = "rabbitmq"
    connection: AbstractConnection | None = None
    channel: AbstractChannel | None = None

    async def connect(self) -> None:
        cfg = self.cfg
        host, port = host_port(cfg.server, 5671 if cfg.tls.enable else 5672)
        ctx = client_ssl_context(cfg.tls)
        kw: dict[str, Any] = {"ssl": True, "ssl_context": ctx} if ctx is not None else {}
        self.connection = await aio_pika.connect(
            host=host, port=port, login=cfg.username,
            password=cfg.password.get_secret_value(), virtualhost=cfg.virtual_host,
            timeout=cfg.connect_timeout, heartbeat=int(cfg.heartbeat),
            client_properties={"connection_name": f"gatewayd:{self.name}"}, **kw,
        )
        self.channel = await self.connection.channel(publisher_confirms=True,
                                                     on_return_raises=True)
        self._exchanges: dict[str, AbstractExchange] = {}

    async def close(self) -> None:
        conn, self.connection, self.channel = self.connection, None, None
        if conn is not None:
            await conn.close()

    async def ping(self) -> None:
        conn = self.connection
        if conn is None or conn.is_closed or self.channel is None or self.channel.is_closed:
            raise ConnectionError("the AMQP connection or channel is closed")

    async def _exchange(self, name: str) -> AbstractExchange:
        assert self.channel is not None
        ex = self._exchanges.get(name)
        if ex is None:
            ex = (self.channel.default_exchange if name == ""
                  else await self.channel.get_exchange(name, ensure=False))
            self._exchanges[name] = ex
        return ex

    async def deliver(self, items: Sequence[bytes]) -> list[Outcome]:
        msgs = [json.loads(i) for i in items]
        pending = []
        for m in msgs:
            ex = await self._exchange(m["e"])
            message = aio_pika.Message(
                m["b"].encode(), content_type="application/json" if m["b"][:1] in "{[" else
                None, delivery_mode=aio_pika.DeliveryMode.PERSISTENT if m["p"]
                else aio_pika.DeliveryMode.NOT_PERSISTENT,
            )
            pending.append(asyncio.ensure_future(
                ex.publish(message, m["k"], mandatory=m["m"])))
        results = await asyncio.gather(*pending, return_exceptions=True)
        outcomes: list[Outcome] = []
        for r in results:
            if isinstance(r, PublishError):
                outcomes.append(Refused(f"unroutable: returned by the broker ({r})"))
            elif isinstance(r, DeliveryError):
                outcomes.append(Retry(f"nack from the broker: {r}"))
            elif isinstance(r, BaseException):
                outcomes.append(Retry(f"{type(r).__name__}: {r}"))
            else:
                outcomes.append(None)
        return outcomes
