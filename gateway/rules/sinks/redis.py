"""Redis sink (redis-py asyncio): commands from a template, pipelined.

An item is ``{"c": [command, arg, ...]}``; a batch is one pipeline (not a MULTI
transaction) whose replies are read one per command: an error reply (``WRONGTYPE``...) is
that item ``Refused``, except the replies that mean "not now" (``LOADING``, ``BUSY``,
``OOM``, ``READONLY``, ``MASTERDOWN``, ``TRYAGAIN``, ``NOPERM``...), which retry like a lost
connection or a timeout. redis-py's own retries are off, so a pipeline is never sent
twice behind our back: delivery is at least once (a pipeline the server ran whose replies
were lost is sent again).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as RedisRetry
from redis.backoff import NoBackoff
from redis.exceptions import (
    ClusterDownError,
    NoPermissionError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)

from gateway.config.connectors import RedisConnector, host_port
from gateway.rules.sinks.base import Outcome, Refused, Retry, Sink, client_ssl_context

__all__ = ["RedisSink"]

# error replies that say "not now" rather than "never": the item waits and is sent again
# (redis-py strips the code of the ones it has a class for; LOADING is a ConnectionError)
_TRANSIENT = ("BUSY", "NOREPLICAS", "MASTERDOWN")
_TRANSIENT_TYPES = (OutOfMemoryError, ReadOnlyError, TryAgainError, ClusterDownError,
                    NoPermissionError)


def _refused(reply: ResponseError) -> bool:
    return not isinstance(reply, _TRANSIENT_TYPES) and not str(reply).startswith(_TRANSIENT)


class RedisSink(Sink[RedisConnector]):
    kind = "redis"
    client: aioredis.Redis | None = None

    async def connect(self) -> None:
        cfg = self.cfg
        host, port = host_port(cfg.server, 6379)
        kw: dict[str, Any] = {}
        ctx = client_ssl_context(cfg.tls)
        if ctx is not None:
            kw = {"ssl": True, "ssl_cert_reqs": "required" if cfg.tls.verify == "verify_peer"
                  else "none", "ssl_ca_certs": cfg.tls.cacertfile,
                  "ssl_certfile": cfg.tls.certfile, "ssl_keyfile": cfg.tls.keyfile,
                  "ssl_check_hostname": cfg.tls.verify == "verify_peer"}
        client = aioredis.Redis(
            host=host, port=port, db=cfg.database, username=cfg.username,
            password=cfg.password.get_secret_value() if cfg.password else None,
            socket_connect_timeout=cfg.connect_timeout, socket_timeout=cfg.request_timeout,
            retry=RedisRetry(NoBackoff(), 0), client_name=f"gatewayd-{self.name}", **kw,
        )
        self.client = client
        await client.ping()

    async def close(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            await client.aclose()

    async def ping(self) -> None:
        assert self.client is not None
        await self.client.ping()

    async def deliver(self, items: Sequence[bytes]) -> list[Outcome]:
        assert self.client is not None
        pipe = self.client.pipeline(transaction=False)
        for item in items:
            pipe.execute_command(*json.loads(item)["c"])
        replies = await pipe.execute(raise_on_error=False)
        outcomes: list[Outcome] = []
        for reply in replies:
            if isinstance(reply, ResponseError) and _refused(reply):
                outcomes.append(Refused(f"{type(reply).__name__}: {reply}"))
            elif isinstance(reply, Exception):
                outcomes.append(Retry(f"{type(reply).__name__}: {reply}"))
            else:
                outcomes.append(None)
        return outcomes
