"""PostgreSQL sink (psycopg 3): batched INSERTs with bound parameters.

An item is ``{"s": sql, "p": params}`` (:class:`~gateway.rules.sinks.templates.SqlTemplate`):
the SQL text has ``%s`` where the template had ``${...}`` and the values travel apart, as
text or NULL that the server casts to the column's type; nothing from a message is ever
part of the SQL text.

A batch runs in one transaction (consecutive items with the same SQL through one
``executemany``, which psycopg pipelines). If the server refuses the transaction for a
row (SQLSTATE other than the transient classes 08 connection, 40 rollback, 53 resources,
57 operator intervention, 58 system, XX internal), the batch is run again one row at a
time, each in its own transaction, so only the refused rows fail (``Refused``, with the
SQLSTATE and message) and the others are stored. A transient error retries the batch.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

import psycopg

from gateway.config.connectors import PostgresqlConnector, host_port
from gateway.rules.sinks.base import Outcome, Refused, Retry, Sink

__all__ = ["PostgresqlSink"]

_TRANSIENT = {"08", "40", "53", "57", "58", "XX"}


def _transient(exc: psycopg.Error) -> bool:
    state = exc.sqlstate
    return state is None or state[:2] in _TRANSIENT or isinstance(exc, psycopg.InterfaceError)


def _describe(exc: psycopg.Error) -> str:
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{exc.sqlstate or type(exc).__name__}: {first}"


class PostgresqlSink(Sink[PostgresqlConnector]):
    kind = "postgresql"
    conn: psycopg.AsyncConnection[Any] | None = None

    def _params(self) -> dict[str, Any]:
        cfg = self.cfg
        host, port = host_port(cfg.server, 5432)
        kw: dict[str, Any] = {
            "host": host, "port": port, "dbname": cfg.database, "user": cfg.username,
            "connect_timeout": max(1, int(cfg.connect_timeout)), "autocommit": True,
            "application_name": f"gatewayd:{self.name}",
        }
        if cfg.password is not None:
            kw["password"] = cfg.password.get_secret_value()
        tls = cfg.tls
        if tls.enable:
            kw["sslmode"] = "verify-full" if tls.verify == "verify_peer" else "require"
            if tls.cacertfile:
                kw["sslrootcert"] = tls.cacertfile
            if tls.certfile:
                kw["sslcert"] = tls.certfile
                kw["sslkey"] = tls.keyfile
        else:
            kw["sslmode"] = "disable"
        return kw

    async def connect(self) -> None:
        self.conn = await psycopg.AsyncConnection.connect(**self._params())

    async def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            await conn.close()

    async def ping(self) -> None:
        assert self.conn is not None
        await self.conn.execute("SELECT 1")

    async def deliver(self, items: Sequence[bytes]) -> list[Outcome]:
        conn = self.conn
        assert conn is not None
        rows = [json.loads(i) for i in items]
        try:
            async with conn.transaction(), conn.cursor() as cur:
                for sql, group in itertools.groupby(rows, key=lambda r: r["s"]):
                    await cur.executemany(sql, [r["p"] for r in group])
            return [None] * len(rows)
        except psycopg.Error as exc:
            if _transient(exc):
                raise
        # some row was refused: find it (them) one row at a time
        outcomes: list[Outcome] = []
        for i, row in enumerate(rows):
            try:
                await conn.execute(row["s"], row["p"])
            except psycopg.Error as exc:
                if _transient(exc):
                    outcomes.extend([Retry(_describe(exc))] * (len(rows) - i))
                    break
                outcomes.append(Refused(_describe(exc)))
            else:
                outcomes.append(None)
        return outcomes
