"""Rules made or changed at run time, kept across restarts (table ``rules`` of ``rules.db``).

One row per rule id: its spec as JSON (``sql``, ``actions``, ``enable``, ``description``,
``created_at``), or a tombstone (``spec`` NULL) for a rule of the configuration file that
was deleted through the API. At start-up the configuration's rules are applied first, then
these rows over them. Writes are rare (an operator's action): each commits at once.

With ``node.workers > 1`` every worker uses the node's own ``{data_dir}/rules.db`` for
this table (the webhook queues stay in each worker's file): a change made through any
worker's API is committed there, and the others notice it through
:meth:`RuleStore.data_version` (SQLite's counter of other connections' commits).
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS rules(
    id TEXT PRIMARY KEY,
    spec TEXT
);
"""


class RuleStore:
    def __init__(self, conn: sqlite3.Connection) -> None:
        conn.executescript(SCHEMA)
        self.conn = conn

    def data_version(self) -> int:
        """Changes when another connection commits (not for this one's own writes)."""
        return int(self.conn.execute("PRAGMA data_version").fetchone()[0])

    def load(self) -> list[tuple[str, dict[str, Any] | None]]:
        rows = self.conn.execute("SELECT id, spec FROM rules ORDER BY rowid").fetchall()
        return [(rid, None if spec is None else json.loads(spec)) for rid, spec in rows]

    def save(self, rule_id: str, spec: dict[str, Any] | None) -> None:
        text = None if spec is None else json.dumps(spec, separators=(",", ":"))
        self.conn.execute(
            "INSERT INTO rules(id, spec) VALUES (?, ?) "
            "ON CONFLICT(id) DO UPDATE SET spec=excluded.spec",
            (rule_id, text),
        )
