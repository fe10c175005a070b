"""Data-integration sinks: rule actions that write to PostgreSQL, Redis, RabbitMQ and
InfluxDB through one durable buffer each (docs/integrations.md).

- :mod:`.templates`: the per-action templates (checked when a rule loads, rendered when it
  fires; values are bound or escaped, never spliced).
- :mod:`.base`: the buffer, the delivery task, health and counters every sink shares.
- :mod:`.postgresql`, :mod:`.redis`, :mod:`.rabbitmq`, :mod:`.influxdb`: the clients
  (psycopg 3, redis-py, aio-pika, aiohttp), imported only when such a connector runs.

- :mod:`.registry`: makes the sink of a connector (the service calls it).

A rule action ``function = "KIND:NAME"`` names the connector ``[connectors.KIND.NAME]``.
This package's ``__init__`` imports only :mod:`.templates`, which imports nothing of
``gateway.config``: the configuration checks actions through it (no import cycle).
"""

from __future__ import annotations

from gateway.rules.sinks.templates import SINK_KINDS, TEMPLATES, check_args, make_action

__all__ = ["SINK_KINDS", "TEMPLATES", "check_args", "make_action"]
