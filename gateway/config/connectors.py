"""Configuration of the data-integration connectors (pydantic models, plain data).

Shapes (EMQX 5's connector/action split, reduced to what a sink needs)::

    [connectors.postgresql.pg1]
    server = "127.0.0.1:5432"
    database = "iot"
    username = "gateway"
    password = ""            # or GATEWAY_CONNECTORS__POSTGRESQL__PG1__PASSWORD=...

    [[rule_engine.rules.store.actions]]
    function = "postgresql:pg1"
    args = { sql = "INSERT INTO t(clientid, v) VALUES (${clientid}, ${payload.v})" }

One section per server: ``[connectors.postgresql.NAME]``, ``[connectors.redis.NAME]``,
``[connectors.rabbitmq.NAME]``, ``[connectors.influxdb.NAME]``. Every connector has a
durable buffer (``buffer.max_bytes``), a batch size, a retry backoff and a health check
interval; credentials are plain keys, meant to come from the environment
(``GATEWAY_CONNECTORS__<KIND>__<NAME>__PASSWORD``, see docs/configuration.md) and never
shown by the API (``SecretStr``). :mod:`gateway.config.schema` imports this module.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator

from gateway.config.rules import Duration, Size, WebhookTls, _Section

__all__ = [
    "CONNECTOR_KINDS", "ConnectorBuffer", "ConnectorBase", "ConnectorTls", "ConnectorsConfig",
    "InfluxdbConnector", "PostgresqlConnector", "RabbitmqConnector", "RedisConnector",
]

CONNECTOR_KINDS = ("postgresql", "redis", "rabbitmq", "influxdb")
_NAME_RE = re.compile(r"[A-Za-z0-9_\-]{1,64}")
_SERVER_RE = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+)(:(\d{1,5}))?")


def host_port(server: str, default_port: int) -> tuple[str, int]:
    """``"host[:port]"`` (``[v6]:port`` too) as (host, port)."""
    m = _SERVER_RE.fullmatch(server)
    assert m is not None
    host = m.group(1).strip("[]")
    return host, int(m.group(3)) if m.group(3) else default_port


def _server(value: str) -> str:
    m = _SERVER_RE.fullmatch(value)
    if m is None or (m.group(3) and not 0 < int(m.group(3)) < 65536):
        raise ValueError('expected "host" or "host:port" with a port in 1..65535')
    return value


class ConnectorTls(WebhookTls):
    """TLS to the server (PostgreSQL, Redis, RabbitMQ and InfluxDB all speak it): the
    same settings as a webhook's."""


class ConnectorBuffer(_Section):
    """The durable buffer (a queue in ``{node.data_dir}/rules.db``)."""

    max_bytes: Annotated[Size, Field(gt=0)] = 64 << 20
    batch_size: Annotated[int, Field(ge=1, le=10_000)] = 100


class ConnectorBase(_Section):
    enable: bool = True
    server: str
    connect_timeout: Duration = 10.0
    request_timeout: Duration = 15.0
    health_check_interval: Duration = 15.0
    retry_interval: Duration = 1.0  # first backoff; doubles up to max_retry_interval
    max_retry_interval: Duration = 30.0
    buffer: ConnectorBuffer = Field(default_factory=ConnectorBuffer)
    tls: ConnectorTls = Field(default_factory=ConnectorTls)

    @field_validator("server")
    @classmethod
    def _server_ok(cls, v: str) -> str:
        return _server(v)


class PostgresqlConnector(ConnectorBase):
    """``[connectors.postgresql.NAME]`` (psycopg 3)."""

    database: str
    username: str = "postgres"
    password: SecretStr | None = None


class RedisConnector(ConnectorBase):
    """``[connectors.redis.NAME]`` (redis-py asyncio, one server)."""

    database: Annotated[int, Field(ge=0)] = 0
    username: str | None = None
    password: SecretStr | None = None


class RabbitmqConnector(ConnectorBase):
    """``[connectors.rabbitmq.NAME]`` (aio-pika, AMQP 0.9.1, publisher confirms)."""

    username: str = "guest"
    password: SecretStr = SecretStr("guest")
    virtual_host: str = "/"
    heartbeat: Duration = 30.0


class InfluxdbConnector(ConnectorBase):
    """``[connectors.influxdb.NAME]`` (InfluxDB 1.x HTTP ``/write``, line protocol)."""

    database: str
    username: str | None = None
    password: SecretStr | None = None
    precision: Literal["ns", "us", "ms", "s"] = "ms"


class ConnectorsConfig(_Section):
    """``[connectors]``: every kind is a table of named connectors."""

    postgresql: dict[str, PostgresqlConnector] = Field(default_factory=dict)
    redis: dict[str, RedisConnector] = Field(default_factory=dict)
    rabbitmq: dict[str, RabbitmqConnector] = Field(default_factory=dict)
    influxdb: dict[str, InfluxdbConnector] = Field(default_factory=dict)

    @field_validator("postgresql", "redis", "rabbitmq", "influxdb")
    @classmethod
    def _names(cls, v: dict[str, ConnectorBase]) -> dict[str, ConnectorBase]:
        for name in v:
            if not _NAME_RE.fullmatch(name):
                raise ValueError(f"connector name {name!r}: letters, digits, '_' and '-', "
                                 "at most 64")
        return v

    def enabled(self) -> dict[str, ConnectorBase]:
        """Every enabled connector by ``"kind:name"`` (the rule action's function name)."""
        out: dict[str, ConnectorBase] = {}
        for kind in CONNECTOR_KINDS:
            for name, cfg in getattr(self, kind).items():
                if cfg.enable:
                    out[f"{kind}:{name}"] = cfg
        return out
