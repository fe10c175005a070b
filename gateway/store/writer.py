"""Group commit: SQLite writes batched per event-loop turn, committed on a writer thread.

The event loop appends write operations with :meth:`GroupCommitter.add`; once per loop
turn the accumulated batch goes to a single writer thread, which runs it in one
transaction and commits (``synchronous=FULL``: durable on return). While that commit is
under way the next batch accumulates, so throughput holds however slow ``fsync`` is.

Acknowledgements wait for durability through :meth:`after_commit`: a transport shell
holding bytes that must not leave before the current writes are durable (a PUBACK, a
PUBREC, a delivery) registers a callback, which runs on the loop once every operation
added before the registration is committed.

Invariants:
- Batches commit in the order they were added; a callback never runs before every
  operation added before it was registered is committed.
- ``dirty`` is True exactly while some added operation is not yet committed.
- A failed commit is logged as an error and retried with the next batch; callbacks of
  the failed batch wait for that retry (an acknowledgement is never sent for data
  that is not on disk).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any

log = logging.getLogger("gateway.store")

Op = tuple[str, Sequence[Any]]


class GroupCommitter:
    def __init__(self, conn: sqlite3.Connection, loop: asyncio.AbstractEventLoop) -> None:
        self._conn = conn
        self._loop = loop
        self._ops: list[Op] = []
        self._callbacks: list[Callable[[], None]] = []
        self._inflight: list[Op] | None = None
        self._inflight_callbacks: list[Callable[[], None]] = []
        self._scheduled = False
        self._closed = False
        self._idle = threading.Event()
        self._idle.set()
        self._last_write_ok = True
        self.commits = 0
        self.ops_committed = 0

    @property
    def dirty(self) -> bool:
        return bool(self._ops) or self._inflight is not None

    def add(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._ops.append((sql, params))
        self._schedule()

    def after_commit(self, callback: Callable[[], None]) -> None:
        if not self.dirty:
            callback()
            return
        self._callbacks.append(callback)
        self._schedule()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if self._inflight is not None:
            return  # the completion handler flushes again
        if not self._ops:
            callbacks, self._callbacks = self._callbacks, []
            for cb in callbacks:
                cb()
            return
        self._inflight, self._ops = self._ops, []
        self._inflight_callbacks, self._callbacks = self._callbacks, []
        self._idle.clear()
        threading.Thread(target=self._write, args=(self._inflight,), daemon=True).start()

    def _write(self, ops: list[Op]) -> None:
        ok = True
        try:
            conn = self._conn
            conn.execute("BEGIN")
            for sql, params in ops:
                conn.execute(sql, params)
            conn.execute("COMMIT")
        except sqlite3.Error:
            ok = False
            log.exception("store commit failed (%d operations); will retry", len(ops))
            with contextlib.suppress(sqlite3.Error):
                self._conn.execute("ROLLBACK")
        finally:
            self._last_write_ok = ok  # read by flush_sync once _idle is set
            self._idle.set()
        if not self._closed:
            self._loop.call_soon_threadsafe(self._done, ok, len(ops))

    def _done(self, ok: bool, n: int) -> None:
        ops = self._inflight or []
        self._inflight = None
        if ok:
            self.commits += 1
            self.ops_committed += n
            callbacks, self._inflight_callbacks = self._inflight_callbacks, []
            for cb in callbacks:
                cb()
        else:
            self._ops[:0] = ops
            self._callbacks[:0] = self._inflight_callbacks
            self._inflight_callbacks = []
        if self._ops or self._callbacks:
            self._schedule()

    def flush_sync(self) -> None:
        """Commit everything now, on the calling thread (shutdown)."""
        self._idle.wait()
        ops, self._ops = self._ops, []
        if self._inflight is not None:
            # the writer thread finished it, but its _done has not run on the loop: run it
            # again only if it failed (a committed INSERT would fail as a duplicate, and
            # with it every write still pending)
            if not self._last_write_ok:
                ops[:0] = self._inflight
            self._inflight = None
        if ops:
            conn = self._conn
            conn.execute("BEGIN")
            for sql, params in ops:
                conn.execute(sql, params)
            conn.execute("COMMIT")
        for cb in self._inflight_callbacks + self._callbacks:
            cb()
        self._inflight_callbacks = []
        self._callbacks = []

    def close(self) -> None:
        self.flush_sync()
        self._closed = True
        self._conn.close()
