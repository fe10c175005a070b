"""Group commit: SQLite writes batched per event-loop turn, committed on a writer thread.

The event loop appends write operations with :meth:`GroupCommitter.add` (one statement)
or :meth:`GroupCommitter.add_segment` (a :class:`Segment`: an owner's writes kept in a
structure it may still change, e.g. cancel an INSERT whose row is already deleted, until
the batch leaves). At the end of a loop turn, or when the previous commit completes, the
accumulated batch goes to the one long-lived writer thread (fed by a queue), which runs
it in one transaction and commits (``synchronous=FULL``: durable on return). While that
commit is under way the next batch accumulates, so throughput holds however slow
``fsync`` is.

Acknowledgements wait for durability through :meth:`after_commit`: a transport shell
holding bytes that must not leave before the current writes are durable (a PUBACK, a
PUBREC, a QoS 2 delivery) registers a callback, which runs on the loop once every operation
added before the registration is committed.

Invariants:
- Batches commit in the order they were added, one at a time; within a batch,
  statements run in the order added (a run of one statement text goes to one
  ``executemany``), a segment's statements where the segment was added.
- A callback never runs before every operation added before it was registered is
  committed; callbacks run on the loop, in registration order.
- ``dirty`` is True while some added operation is not yet committed (a segment left
  empty by its owner's cancellations counts until its batch leaves).
- A failed commit is logged as an error and retried with the next batch; callbacks of
  the failed batch wait for that retry (an acknowledgement is never sent for data
  that is not on disk).
- A segment is changed by its owner only while it is the last item of the batch still
  accumulating (:meth:`is_open`); from then on it is the writer thread's to read.
- ``flush_sync`` (shutdown) never runs a batch again that the writer thread committed;
  ``close`` commits everything added, then stops the thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

log = logging.getLogger("gateway.store")

Op = tuple[str, Sequence[Any]]


class Segment(Protocol):
    """Writes an owner keeps in its own form until the batch leaves."""

    def empty(self) -> bool:
        """Nothing left to write (everything cancelled)."""
        ...

    def statements(self) -> list[Op]:
        """The statements, in the order to run them (called on the writer thread)."""
        ...


Item = Op | Segment


class _Batch:
    __slots__ = ("items", "callbacks", "ok", "error")

    def __init__(self, items: list[Item], callbacks: list[Callable[[], None]]) -> None:
        self.items = items
        self.callbacks = callbacks
        self.ok = False
        self.error: BaseException | None = None


class GroupCommitter:
    def __init__(self, conn: sqlite3.Connection, loop: asyncio.AbstractEventLoop) -> None:
        self._conn = conn
        self._loop = loop
        self._items: list[Item] = []
        self._callbacks: list[Callable[[], None]] = []
        self._inflight: _Batch | None = None
        self._scheduled = False
        self._closed = False
        self._queue: queue.SimpleQueue[_Batch | None] = queue.SimpleQueue()
        self._idle = threading.Event()  # clear while the writer thread holds a batch
        self._idle.set()
        self._thread = threading.Thread(
            target=self._writer, name="gateway-store-writer", daemon=True
        )
        self._thread.start()
        self.commits = 0
        self.ops_committed = 0

    @property
    def dirty(self) -> bool:
        return bool(self._items) or self._inflight is not None

    def add(self, sql: str, params: Sequence[Any] = ()) -> None:
        self._items.append((sql, params))
        self._schedule()

    def add_segment(self, segment: Segment) -> None:
        self._items.append(segment)
        self._schedule()

    def is_open(self, segment: Segment) -> bool:
        """May the owner still change ``segment`` (the last item of the batch not yet
        handed to the writer)?"""
        items = self._items
        return bool(items) and items[-1] is segment

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
        for cb in self._hand_off():
            cb()

    def _hand_off(self) -> list[Callable[[], None]]:
        """Send what accumulated to the writer; the callbacks that may run now instead
        (nothing left to write) are returned, for the caller to run."""
        items = [it for it in self._items if isinstance(it, tuple) or not it.empty()]
        callbacks = self._callbacks
        self._items = []
        self._callbacks = []
        if not items:
            return callbacks
        self._inflight = batch = _Batch(items, callbacks)
        self._idle.clear()
        self._queue.put(batch)
        return []

    # -- the writer thread -------------------------------------------------------------

    def _writer(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            try:
                self._commit(batch.items)
                batch.ok = True
            except Exception as exc:  # never let the thread die: the node would stall
                batch.error = exc
                log.exception(
                    "store commit failed (%d operations); will retry", len(batch.items)
                )
                with contextlib.suppress(sqlite3.Error):
                    self._conn.execute("ROLLBACK")
            self._idle.set()  # batch.ok is read by flush_sync once this is set
            if not self._closed:
                with contextlib.suppress(RuntimeError):  # the loop is closed
                    self._loop.call_soon_threadsafe(self._done, batch)

    def _commit(self, items: list[Item]) -> None:
        conn = self._conn
        conn.execute("BEGIN")
        n = len(items)
        i = 0
        while i < n:
            item = items[i]
            i += 1
            if not isinstance(item, tuple):
                for sql, params in item.statements():
                    conn.execute(sql, params)
                continue
            sql, params = item
            run = [params]
            while i < n:
                nxt = items[i]
                if not isinstance(nxt, tuple) or nxt[0] != sql:
                    break
                run.append(nxt[1])
                i += 1
            if len(run) == 1:
                conn.execute(sql, params)
            else:
                conn.executemany(sql, run)
        conn.execute("COMMIT")

    # -- back on the loop --------------------------------------------------------------

    def _done(self, batch: _Batch) -> None:
        if self._inflight is not batch:
            return  # flush_sync settled it already
        self._inflight = None
        if not batch.ok:
            self._items[:0] = batch.items
            self._callbacks[:0] = batch.callbacks
            self._schedule()
            return
        self.commits += 1
        self.ops_committed += len(batch.items)
        # the next batch leaves at once, so the writer commits it while this batch's
        # callbacks run; callbacks still run in registration order
        callbacks = batch.callbacks
        if self._items or self._callbacks:
            callbacks = callbacks + self._hand_off()
        for cb in callbacks:
            cb()

    def flush_sync(self) -> None:
        """Commit everything now and wait for it (shutdown; the loop need not run).
        Raises what the commit raised if it fails (the callbacks then do not run)."""
        self._idle.wait()
        items, self._items = self._items, []
        callbacks, self._callbacks = self._callbacks, []
        batch = self._inflight
        if batch is not None:
            # the writer thread finished it, but its _done has not run on the loop: run it
            # again only if it failed (a committed INSERT would fail as a duplicate, and
            # with it every write still pending)
            self._inflight = None
            if not batch.ok:
                items[:0] = batch.items
            callbacks[:0] = batch.callbacks
        items = [it for it in items if isinstance(it, tuple) or not it.empty()]
        if items:
            last = _Batch(items, [])
            self._idle.clear()
            self._queue.put(last)
            self._idle.wait()
            if not last.ok:
                assert last.error is not None
                raise last.error
            self.commits += 1
            self.ops_committed += len(items)
        for cb in callbacks:
            cb()

    def close(self) -> None:
        try:
            self.flush_sync()
        finally:
            self._closed = True
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._conn.close()
