"""Making the sink of a connector (imports the client library of its kind only then)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from gateway.config.connectors import ConnectorBase
from gateway.rules.sinks.base import Sink
from gateway.store.queue import QueueDb

__all__ = ["CLIENT_MODULES", "make_sink"]

# the client library each kind needs (the ``sinks`` extra installs them all)
CLIENT_MODULES = {"postgresql": "psycopg", "redis": "redis", "rabbitmq": "aio_pika",
                  "influxdb": "aiohttp"}
_CLASSES = {"postgresql": "PostgresqlSink", "redis": "RedisSink", "rabbitmq": "RabbitmqSink",
            "influxdb": "InfluxdbSink"}


def make_sink(kind: str, name: str, cfg: ConnectorBase, db: QueueDb, *,
              alarm: Callable[[str, str | None], None]) -> Sink[Any]:
    module = importlib.import_module(f"gateway.rules.sinks.{kind}")
    cls: type[Sink[Any]] = getattr(module, _CLASSES[kind])
    return cls(name, cfg, db, alarm=alarm)
