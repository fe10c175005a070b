"""The node's embedded SQLite database: one file, ``{node.data_dir}/gateway.db``, in WAL mode.

Every part that persists something (sessions, retained messages, users, banned clients,
the bridge outbox) keeps its tables in this one file, each module creating its own tables
with ``CREATE TABLE IF NOT EXISTS`` through :func:`ensure_schema`. ``gatewayctl`` may open
the same file while ``gatewayd`` runs (WAL allows one writer and many readers; writers
wait up to ``busy_timeout``).

Invariants:
- ``synchronous=FULL`` in WAL mode: a committed transaction survives power loss, so
  anything acknowledged after a commit is durable.
- Connections are used from one thread (the event loop's) unless a module says otherwise.
- A file created here has ``auto_vacuum=INCREMENTAL`` (pages freed by deletes can be given
  back to the file system: :mod:`gateway.store.space`); the WAL is truncated to
  ``JOURNAL_SIZE_LIMIT`` after checkpoints.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

DB_NAME = "gateway.db"
JOURNAL_SIZE_LIMIT = 1024 * 1024


def db_path(data_dir: str | Path) -> Path:
    return Path(data_dir) / DB_NAME


def open_db(
    path: str | Path, *, readonly: bool = False, check_same_thread: bool = True
) -> sqlite3.Connection:
    """Open (creating if needed) the database with the project's pragmas."""
    p = Path(path)
    if readonly:
        conn = sqlite3.connect(
            f"file:{p}?mode=ro", uri=True, isolation_level=None,
            check_same_thread=check_same_thread,
        )
    else:
        p.parent.mkdir(parents=True, exist_ok=True)
        # autocommit mode; transactions are explicit BEGIN/COMMIT
        conn = sqlite3.connect(p, isolation_level=None, check_same_thread=check_same_thread)
        # before WAL: a new file only takes auto_vacuum before its first page is written
        # (an existing file keeps its mode until a VACUUM: gatewayctl store vacuum)
        conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        # Debian builds SQLite with SECURE_DELETE: every freed page is zeroed through the
        # WAL, so a delete would need as much free space as the data it removes (on a
        # full disk: none). FAST zeroes only what costs no extra I/O.
        conn.execute("PRAGMA secure_delete=FAST")
        # the WAL is cut back to this after a checkpoint (else it keeps its largest size)
        conn.execute(f"PRAGMA journal_size_limit={JOURNAL_SIZE_LIMIT}")
        # checkpoint at 1 MiB of WAL (SQLite's default is 4 MiB): on a small card the WAL
        # and the pages it carries into the main file need room at the same time
        conn.execute(f"PRAGMA wal_autocheckpoint={JOURNAL_SIZE_LIMIT // 4096}")
    conn.execute("PRAGMA busy_timeout=5000")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def ensure_schema(conn: sqlite3.Connection, ddl: str) -> None:
    """Run a module's ``CREATE TABLE IF NOT EXISTS ...`` statements."""
    conn.executescript(ddl)
