"""Multi-row SQL statements: many rows per ``execute`` call.

The writer thread gives up the GIL for every ``sqlite3_step`` and must win it back from
the busy event loop afterwards (up to a switch interval, 5 ms, each time): a statement
per row makes a batch of N rows wait N times. These helpers turn N rows into a few
statements, ``INSERT ... VALUES (...),(...)``, ``DELETE ... WHERE key IN (...)`` and
``UPDATE ... FROM (VALUES ...)``, each binding many rows.

Invariants:
- The rows are split into chunks whose sizes are powers of two (largest first), so a
  table sees at most ``MAX_ROWS.bit_length()`` distinct statement texts and the
  connection's statement cache keeps them prepared.
- No statement binds more than ``MAX_VARIABLES`` parameters (SQLite's default limit
  since 3.32; 999 before).
- Rows are bound in the order given.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any

Statement = tuple[str, Sequence[Any]]

MAX_VARIABLES = 32766 if sqlite3.sqlite_version_info >= (3, 32, 0) else 999
MAX_ROWS = 1024
# UPDATE ... FROM arrived in SQLite 3.33; older libraries update row by row
HAVE_UPDATE_FROM = sqlite3.sqlite_version_info >= (3, 33, 0)


def chunk_sizes(n: int, width: int) -> Iterator[int]:
    """Powers of two summing to ``n``, each at most ``MAX_ROWS`` rows of ``width``
    values and ``MAX_VARIABLES`` values in all, largest first."""
    cap = 1
    while cap * 2 <= MAX_ROWS and cap * 2 * width <= MAX_VARIABLES:
        cap *= 2
    while n >= cap:
        yield cap
        n -= cap
    size = cap
    while n:
        size //= 2
        if n >= size:
            yield size
            n -= size


@lru_cache(maxsize=256)
def _tuples(width: int, count: int) -> str:
    one = "(" + ",".join("?" * width) + ")"
    return ",".join([one] * count)


@lru_cache(maxsize=256)
def _marks(count: int) -> str:
    return ",".join("?" * count)


def insert_rows(
    head: str, width: int, rows: Sequence[Sequence[Any]], tail: str = ""
) -> list[Statement]:
    """``head`` is ``INSERT INTO t(a, b)`` (or ``INSERT OR IGNORE ...``); each row has
    ``width`` values; ``tail`` follows the values (an ``ON CONFLICT`` clause)."""
    out: list[Statement] = []
    i = 0
    for size in chunk_sizes(len(rows), width):
        params: list[Any] = []
        for row in rows[i : i + size]:
            params.extend(row)
        out.append((f"{head} VALUES {_tuples(width, size)}{tail}", params))
        i += size
    return out


def where_in(head: str, keys: Sequence[Any]) -> list[Statement]:
    """``head`` is e.g. ``DELETE FROM t WHERE key`` or ``UPDATE t SET c=1 WHERE key``: it
    applies to the rows whose key is in ``keys``."""
    out: list[Statement] = []
    i = 0
    for size in chunk_sizes(len(keys), 1):
        out.append((f"{head} IN ({_marks(size)})", list(keys[i : i + size])))
        i += size
    return out


def delete_pairs(
    table: str, cols: tuple[str, str], pairs: Sequence[Sequence[Any]]
) -> list[Statement]:
    """Delete the rows of ``table`` whose two columns ``cols`` are one of ``pairs``."""
    out: list[Statement] = []
    i = 0
    a, b = cols
    for size in chunk_sizes(len(pairs), 2):
        params: list[Any] = []
        for p in pairs[i : i + size]:
            params.extend(p)
        out.append(
            (f"DELETE FROM {table} WHERE ({a}, {b}) IN (VALUES {_tuples(2, size)})", params)
        )
        i += size
    return out


def update_column(
    table: str, key: str, column: str, pairs: Sequence[tuple[Any, Any]]
) -> list[Statement]:
    """``UPDATE table SET column=value WHERE key=k`` for each ``(k, value)``."""
    if not HAVE_UPDATE_FROM:
        return [(f"UPDATE {table} SET {column}=? WHERE {key}=?", (v, k)) for k, v in pairs]
    out: list[Statement] = []
    i = 0
    for size in chunk_sizes(len(pairs), 2):
        params: list[Any] = []
        for k, v in pairs[i : i + size]:
            params.append(k)
            params.append(v)
        out.append(
            (
                f"UPDATE {table} SET {column}=v.column2 FROM (VALUES {_tuples(2, size)}) AS v "
                f"WHERE {table}.{key}=v.column1",
                params,
            )
        )
        i += size
    return out
