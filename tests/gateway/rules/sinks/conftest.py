"""Session fixtures: one real server of each kind per test run (started on first use,
stopped and removed at the end), with the schema the sink tests write into."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.gateway.rules.sinks.servers import InfluxServer, PgServer, RabbitServer, RedisServer

PG_SCHEMA = """
CREATE TABLE readings(
    seq bigserial PRIMARY KEY,
    msgid text UNIQUE NOT NULL,
    clientid text NOT NULL,
    topic text,
    t double precision,
    n integer CHECK (n >= 0),
    note text,
    payload jsonb
);
"""


@pytest.fixture(scope="session")
def pg() -> Iterator[PgServer]:
    s = PgServer()
    try:
        s.start()
        s.psql(f"CREATE DATABASE {s.database}")
        s.psql(PG_SCHEMA, s.database)
        yield s
    finally:
        s.close()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    s = RedisServer()
    try:
        s.start()
        yield s
    finally:
        s.close()


async def _declare(url: str) -> None:
    import aio_pika

    conn = await aio_pika.connect(url)
    async with conn:
        ch = await conn.channel()
        ex = await ch.declare_exchange("sinks", aio_pika.ExchangeType.TOPIC, durable=True)
        q = await ch.declare_queue("q_all", durable=True)
        await q.bind(ex, "#")


@pytest.fixture(scope="session")
def rabbit() -> Iterator[RabbitServer]:
    s = RabbitServer()
    try:
        s.start()
        asyncio.run(_declare(s.url()))
        yield s
    finally:
        s.close()


@pytest.fixture(scope="session")
def influx() -> Iterator[InfluxServer]:
    s = InfluxServer()
    try:
        s.start()
        s.query(f"CREATE DATABASE {s.database}")
        yield s
    finally:
        s.close()
