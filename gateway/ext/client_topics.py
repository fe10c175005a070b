"""The per-client auto-subscribe entries, held in memory: no SQL per CONNECT.

Every CONNECT asks :meth:`ClientTopics.for_client` for the client's own entries of the
``auto_subscribe`` table (``gateway.db``, written by the API / ``gatewayctl
auto-subscribe`` through :class:`~gateway.store.extensions.AutoSubscribeStore`, and by
other connections: the cluster's table replication, the other workers of the node). A
``SELECT`` per CONNECT was a tenth of the broker's CPU per connect; here a CONNECT costs a
dict lookup, and the table is read again only when it may have changed.

Invariants:
- ``for_client`` answers from the copy of the whole table read at the last load.
- A write through this object (:meth:`put`, :meth:`delete`: the management API, hence
  ``gatewayctl``) marks the copy stale: the next CONNECT after the write reloads it, so
  it sees the change.
- A write by another connection is seen by the first CONNECT that comes ``max_age``
  seconds (default 0.1) or more after the write: at most every ``max_age`` seconds, a
  CONNECT asks SQLite for ``PRAGMA data_version`` (changed by any commit of another
  connection to the file) and reloads the table when it changed. The file also holds
  the sessions, so during a reconnect storm of persistent sessions it changes all the
  time; the reload is then at most one per ``max_age`` (a ``SELECT`` of the whole table).
  Reading a large table takes time: the interval grows to 50 times the last reload's
  duration (at most 2 % of the loop), which bounds the staleness then instead.
- No CONNECT, no SQL: nothing runs on a timer.
- A failed read (the file locked past its busy timeout, ...) keeps the previous copy,
  logs one warning, and is tried again ``max_age`` later (with a reload).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable

from gateway.ext.auto_subscribe import TopicTemplate
from gateway.store.extensions import AutoSubscribeEntry, AutoSubscribeStore

__all__ = ["MAX_AGE", "ClientTopics"]

log = logging.getLogger("gateway.ext")

MAX_AGE = 0.1  # seconds: the staleness bound for writes made by other connections
_RELOAD_SHARE = 50  # the check interval is at least this many times the last reload


class ClientTopics:
    """The ``auto_subscribe`` table of ``store``, cached (module docstring)."""

    def __init__(
        self,
        store: AutoSubscribeStore,
        *,
        max_age: float = MAX_AGE,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.max_age = max_age
        self._monotonic = monotonic
        self._by_client: dict[str, tuple[TopicTemplate, ...]] = {}
        self._interval = max_age
        self._checked_at = 0.0
        self._due = True  # check at the next CONNECT, whenever the last check was
        self._data_version: int | None = None  # None: reload at the next check
        self.loads = 0  # how many times the table was read (tests, diagnostics)
        self._failing = False

    # -- reads ------------------------------------------------------------------------

    def for_client(self, clientid: str) -> tuple[TopicTemplate, ...]:
        """The client's own topics, in topic order (``()`` for most clients)."""
        now = self._monotonic()
        if self._due or not 0.0 <= now - self._checked_at < self._interval:
            self._check(now)
        return self._by_client.get(clientid, ())

    def _check(self, now: float) -> None:
        self._checked_at = now
        self._due = False
        conn = self.store.conn
        try:
            version = int(conn.execute("PRAGMA data_version").fetchone()[0])
            if version == self._data_version:
                return
            began = self._monotonic()
            table: dict[str, list[TopicTemplate]] = {}
            for clientid, topic, qos, rh, rap, nl in conn.execute(
                "SELECT clientid, topic, qos, rh, rap, nl FROM auto_subscribe "
                "ORDER BY clientid, topic"
            ):
                table.setdefault(clientid, []).append(TopicTemplate(topic, qos, rh, rap, nl))
            took = self._monotonic() - began
        except sqlite3.Error as exc:
            if not self._failing:
                log.warning("cannot read the per-client auto-subscribe topics: %s", exc)
            self._failing = True
            self._data_version = None
            return
        self._failing = False
        self._by_client = {cid: tuple(ts) for cid, ts in table.items()}
        self._data_version = version
        self._interval = max(self.max_age, _RELOAD_SHARE * took)
        self.loads += 1

    # -- writes (the API) -----------------------------------------------------------------

    def put(self, entry: AutoSubscribeEntry) -> None:
        self.store.put(entry)
        self._due = True
        self._data_version = None

    def delete(self, clientid: str, topic: str | None = None) -> int:
        n = self.store.delete(clientid, topic)
        self._due = True
        self._data_version = None
        return n
