"""Data-integration sinks: rule actions that write to PostgreSQL, Redis, RabbitMQ and
InfluxDB through one durable buffer each (docs/data-integration.md).

- :mod:`.templates`: the per-action templates (checked when a rule loads, rendered when it
  fires; values are bound or escaped, never spliced).
- :mod:`.base`: the buffer, the delivery task, health and counters every sink shares.
- :mod:`.postgresql`, :mod:`.redis`, :mod:`.rabbitmq`, :mod:`.influxdb`: the clients
  (psycopg 3, redis-py, aio-pika, aiohttp), imported only when such a connector runs.

A rule action ``function = "KIND:NAME"`` names the connector ``[connectors.KIND.NAME]``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

from gateway.config.connectors import CONNECTOR_KINDS, ConnectorBase
from gateway.rules.sinks.base import Sink
from gateway.rules.sinks.templates import TEMPLATES
from gateway.store.queue import QueueDb

__all__ = ["CLIENT_MODULES", "SINK_KINDS", "check_args", "make_action", "make_sink"]

SINK_KINDS = CONNECTOR_KINDS
# the client library each kind needs (the ``sinks`` extra installs them all)
CLIENT_MODULES = {"postgresql": "psycopg", "redis": "redis", "rabbitmq": "aio_pika",
                  "influxdb": "aiohttp"}
_CLASSES = {"postgresql": "PostgresqlSink", "redis": "RedisSink", "rabbitmq": "RabbitmqSink",
            "influxdb": "InfluxdbSink"}


def check_args(kind: str, args: Mapping[str, Any]) -> None:
    """ValueError (one line) when ``args`` cannot make a ``kind`` action."""
    TEMPLATES[kind](args)


def make_action(function: str, args: Mapping[str, Any], sinks: Callable[[], Mapping[str, Any]]
                ) -> Callable[[dict[str, Any], Mapping[str, Any]], None]:
    """The rule action ``KIND:NAME``: render the item now, buffer it in the sink."""
    kind = function.partition(":")[0]
    template = TEMPLATES[kind](args)
    if function not in sinks():
        kind, _, name = function.partition(":")
        raise ValueError(f"no [connectors.{kind}.{name}] configured")

    def sink_action(output: dict[str, Any], columns: Mapping[str, Any]) -> None:
        sink = sinks().get(function)
        if sink is None:
            raise ValueError(f"{function} is not running")
        sink.put(template.render(output, columns))

    return sink_action


def make_sink(kind: str, name: str, cfg: ConnectorBase, db: QueueDb, *,
              alarm: Callable[[str, str | None], None]) -> Sink[Any]:
    module = importlib.import_module(f"gateway.rules.sinks.{kind}")
    cls: type[Sink[Any]] = getattr(module, _CLASSES[kind])
    return cls(name, cfg, db, alarm=alarm)
