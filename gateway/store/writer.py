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

A :class:`~gateway.store.journal_log.LogSegment` item is not SQL: its records go to the
journal log (:attr:`log`), one frame per batch, written after the batch's SQLite
transaction commits and durable (``O_DSYNC``) before the batch counts as committed. A
segment that opens a new log generation carries the delta of the one before (a
checkpoint): the delta's statements run in the batch's transaction, records of that
older generation still in the batch are not written (the delta has them), and the old
log file is recycled only after the commit. A segment that opens a new generation as a
*compaction* (its records are the whole pending delta, journal_log) is written the same
way, and the older files are deleted only after its frame is durable.

Invariants:
- Batches commit in the order they were added, one at a time; within a batch,
  statements run in the order added (a run of one statement text goes to one
  ``executemany``), a segment's statements where the segment was added; log records
  in the order added (they touch no table a statement of the batch touches).
- A callback never runs before every operation added before it was registered is
  committed; callbacks run on the loop, in registration order.
- ``dirty`` is True while some added operation is not yet committed (a segment left
  empty by its owner's cancellations counts until its batch leaves).
- A failed commit puts the committer in *fault* mode (:attr:`fault`, a
  :class:`~gateway.store.faults.StoreFault`): its operations go back in front of the
  batch accumulating, in order, and are retried after a back-off (0.25 s doubling to
  5 s) or at once on :meth:`retry`; the first success ends the fault. Before a commit
  that failed for lack of space is reported, the writer thread calls ``release_space``
  (the reserve file, :mod:`gateway.store.space`) and, if that freed something, retries
  at once.
- An acknowledgement is never sent for data that is not on disk. Callbacks come in two
  sorts. *Strict* ones (``after_commit(cb)``) wait for the commit, however long the
  fault lasts. *Soft* ones (``after_commit(cb, on_fail)``: a connection's held output)
  are failed when a fault starts (``on_fail`` runs instead: the owner drops what it
  held and closes the connection, the peer re-sends), and while the fault lasts a new
  soft callback runs at once: whoever might acknowledge something that needs the disk
  refuses it before it gets that far (:attr:`gateway.core.node.Node.store_refusal`).
- ``on_fault`` (if set) is called on the loop with the new fault when one starts or
  changes kind, and with None when it ends.
- A segment is changed by its owner only while it is the last item of the batch still
  accumulating (:meth:`is_open`); from then on it is the writer thread's to read.
- ``probe`` (if set) runs on the writer thread after a successful commit, at most every
  ``probe_every`` seconds; its result reaches ``on_commit`` on the loop (None when it did
  not run). It is how :class:`~gateway.store.space.StoreGuard` measures the disk without
  ``statvfs``/``stat`` on the loop thread (each gave the GIL to the writer thread, and the
  loop then waited up to a switch interval to get it back).
- ``flush_sync`` (shutdown) never runs a batch again that the writer thread committed;
  ``close`` commits everything added, then stops the thread.

The writer thread runs under ``SCHED_BATCH`` (Linux): its wake-ups (a batch handed
off, its ``O_DSYNC`` write done) do not preempt the event loop's thread. Under the
default policy each commit cost about seven context switches on the loop's core: the
woken writer preempted the loop, then waited for the GIL the loop still held, and so
on. Now the writer runs when the loop blocks or idles, or when its time slice comes
(its weight is unchanged, so it is never starved), and more work piles into each
batch. Durable QoS 1 fan-in went from 46k to 58k msg/s with it (bench/README.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from gateway.store.faults import StoreFault, classify
from gateway.store.journal_log import JournalLog, LogSegment

log = logging.getLogger("gateway.store")

RETRY_FIRST = 0.25
RETRY_MAX = 5.0

Op = tuple[str, Sequence[Any]]


def _no_wakeup_preemption() -> None:
    """The calling thread to ``SCHED_BATCH`` (module docstring), where there is one."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError) as exc:  # not Linux, or a sandbox that forbids it
        log.info("store writer thread keeps its scheduling policy (no SCHED_BATCH: %s)", exc)


class Segment(Protocol):
    """Writes an owner keeps in its own form until the batch leaves."""

    def empty(self) -> bool:
        """Nothing left to write (everything cancelled)."""
        ...

    def statements(self) -> list[Op]:
        """The statements, in the order to run them (called on the writer thread)."""
        ...


Item = Op | Segment


class _Soft:
    """A callback that is failed, not delayed, when the store cannot write."""

    __slots__ = ("callback", "on_fail")

    def __init__(self, callback: Callable[[], None], on_fail: Callable[[], None]) -> None:
        self.callback = callback
        self.on_fail = on_fail

    def __call__(self) -> None:
        self.callback()


class Task:
    """Work for the writer thread between batches (checkpoint, vacuum): ``fn(conn)``
    runs there; ``done(result, error)`` then runs on the loop."""

    __slots__ = ("fn", "done", "replaces", "result", "error")

    def __init__(
        self,
        fn: Callable[[sqlite3.Connection], Any],
        done: Callable[[Any, BaseException | None], None] | None = None,
        *,
        replaces: bool = False,
    ) -> None:
        self.fn = fn
        self.done = done
        # fn closes the connection and returns the one to use from now on (a salvage)
        self.replaces = replaces
        self.result: Any = None
        self.error: BaseException | None = None


class _Batch:
    __slots__ = ("items", "callbacks", "ok", "error", "probed")

    def __init__(self, items: list[Item], callbacks: list[Callable[[], None]]) -> None:
        self.items = items
        self.callbacks = callbacks
        self.ok = False
        self.error: BaseException | None = None
        self.probed: Any = None  # what ``probe`` returned after this commit, if it ran


class GroupCommitter:
    def __init__(self, conn: sqlite3.Connection, loop: asyncio.AbstractEventLoop) -> None:
        self._conn = conn
        self._loop = self.loop = loop
        self._items: list[Item] = []
        self._callbacks: list[Callable[[], None]] = []
        self._inflight: _Batch | None = None
        self._scheduled = False
        self._closed = False
        # batches and tasks in order; a threading.Event is a marker: the writer sets it
        # once everything queued before it is done (flush_sync waits on one; a commit
        # costs the loop no lock of its own)
        self._queue: queue.SimpleQueue[_Batch | Task | threading.Event | None] = (
            queue.SimpleQueue())
        self._writer_thread = threading.Thread(
            target=self._writer, name="gateway-store-writer", daemon=True
        )
        self._writer_thread.start()
        self.commits = 0
        self.ops_committed = 0
        self.failures = 0  # commits that failed
        self.fault: StoreFault | None = None
        self.on_fault: Callable[[StoreFault | None], None] | None = None
        # on the loop after every successful commit, with the probe's result (or None)
        self.on_commit: Callable[[Any], None] | None = None
        # writer thread, after a commit, at most every probe_every seconds
        self.probe: Callable[[], Any] | None = None
        self.probe_every = 0.0
        self._probed_at = -1e9  # writer thread only
        # writer thread: free some space (the reserve file); True if it did
        self.release_space: Callable[[], bool] | None = None
        self._retry_delay = RETRY_FIRST
        self._retry_timer: asyncio.TimerHandle | None = None
        # the journal log (gateway.store.journal_log): LogSegment items append to it
        self.log: JournalLog | None = None
        # the journal log's checkpoints wait for room (set by the session store): the
        # space guard then does not make its reserve again, which would take that room
        self.log_waits_for_room = False
        # on the loop at the start of close(), before the last commit (a final checkpoint)
        self.before_close: Callable[[], None] | None = None
        self.checkpoints = 0

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

    def after_commit(
        self, callback: Callable[[], None], on_fail: Callable[[], None] | None = None
    ) -> None:
        """Run ``callback`` once everything added so far is committed. With ``on_fail``
        the callback is soft (see the module's invariants)."""
        if not self.dirty or (on_fail is not None and self.fault is not None):
            callback()
            return
        self._callbacks.append(callback if on_fail is None else _Soft(callback, on_fail))
        self._schedule()

    def submit(self, task: Task) -> None:
        """Run ``task`` on the writer thread after the batches handed to it so far."""
        self._queue.put(task)

    def retry(self) -> None:
        """During a fault: try the pending operations now (space may be back)."""
        if self.fault is None:
            return
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
        self._retry_delay = RETRY_FIRST
        if self._inflight is None:
            for cb in self._hand_off():
                cb()

    def _schedule(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        if self._inflight is not None:
            return  # the completion handler flushes again
        if self.fault is not None:
            return  # the retry timer (or retry()) hands the backlog off
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
        self._queue.put(batch)
        return []

    # -- the writer thread -------------------------------------------------------------

    def _writer(self) -> None:
        _no_wakeup_preemption()
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            if isinstance(batch, Task):
                self._run_task(batch)
                continue
            if isinstance(batch, threading.Event):
                batch.set()
                continue
            try:
                self._commit_or_release(batch.items)
                batch.ok = True
                probe = self.probe
                if probe is not None:
                    now = time.monotonic()
                    if now - self._probed_at >= self.probe_every:
                        self._probed_at = now
                        try:
                            batch.probed = probe()
                        except Exception as exc:  # the commit stands; the loop measures
                            log.debug("store probe failed: %s", exc)
            except Exception as exc:  # never let the thread die: the node would stall
                batch.error = exc
                self.failures += 1
                if self.fault is None:
                    log.error(
                        "store commit failed (%d operations), kept in memory to retry: %s",
                        len(batch.items), exc,
                    )
            if not self._closed:
                with contextlib.suppress(RuntimeError):  # the loop is closed
                    self._loop.call_soon_threadsafe(self._done, batch)

    def _commit_or_release(self, items: list[Item]) -> None:
        try:
            self._commit(items)
        except Exception as exc:
            self._rollback()
            release = self.release_space
            if classify(exc).space and release is not None and release():
                log.warning("store out of space: reserve released, commit retried")
                try:
                    self._commit(items)
                except Exception:
                    self._rollback()
                    raise
                return
            raise

    def _rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")

    def _run_task(self, task: Task) -> None:
        try:
            task.result = task.fn(self._conn)
            if task.replaces:
                self._conn = task.result
        except Exception as exc:
            task.error = exc
            self._rollback()
        done = task.done
        if done is not None and not self._closed:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(done, task.result, task.error)

    def _commit(self, items: list[Item]) -> None:
        """One batch: its SQL statements (and the deltas of the checkpoints in it) in one
        SQLite transaction, its log records in one frame of the journal log (fdatasync),
        the log frame last. Records of a generation a checkpoint of this batch covers
        are not written: its delta has them, and it commits with the transaction."""
        conn = self._conn
        chunks: list[list[Any]] = []
        deltas = []
        rotate_to = compact_to = -1
        recycle = True
        began = False
        n = len(items)
        i = 0
        while i < n:
            item = items[i]
            i += 1
            if type(item) is LogSegment:
                if item.checkpoint is not None:
                    deltas.append(item.checkpoint)
                    chunks.clear()  # the delta has them
                    rotate_to = item.generation
                    recycle = item.recycle
                    compact_to = -1  # this checkpoint covers an earlier compaction
                elif item.compaction:
                    chunks.clear()  # its records have them
                    rotate_to = compact_to = item.generation
                if item.records:
                    chunks.append(item.records)
                continue
            if not began:
                conn.execute("BEGIN")
                began = True
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
        if deltas:
            if not began:
                conn.execute("BEGIN")
                began = True
            for delta in deltas:
                for sql, params in delta.statements():
                    conn.execute(sql, params)
        if began:
            conn.execute("COMMIT")
        jlog = self.log
        if jlog is None:
            return
        if rotate_to >= 0:
            jlog.rotate(rotate_to)
            if compact_to < 0:
                jlog.remove_before(rotate_to, recycle)
            self.checkpoints += 1
        if chunks:
            jlog.append(chunks)
        if compact_to >= 0:  # the older files only once the compacted frame is durable
            jlog.remove_before(compact_to, False)

    # -- back on the loop --------------------------------------------------------------

    def _done(self, batch: _Batch) -> None:
        if self._inflight is not batch:
            return  # flush_sync settled it already
        self._inflight = None
        if not batch.ok:
            assert batch.error is not None
            self._items[:0] = batch.items
            self._callbacks[:0] = batch.callbacks
            self._failed(classify(batch.error))
            return
        self.commits += 1
        self.ops_committed += len(batch.items)
        if self.fault is not None:
            log.warning("store writes again (%d operations caught up)", len(batch.items))
            self.fault = None
            self._retry_delay = RETRY_FIRST
            if self.on_fault is not None:
                self.on_fault(None)
        # the next batch leaves at once, so the writer commits it while this batch's
        # callbacks run; callbacks still run in registration order
        callbacks = batch.callbacks
        if self._items or self._callbacks:
            callbacks = callbacks + self._hand_off()
        for cb in callbacks:
            cb()
        if self.on_commit is not None:
            self.on_commit(batch.probed)

    def _failed(self, fault: StoreFault) -> None:
        """A commit failed: fail the soft callbacks, keep the strict ones, retry later."""
        changed = self.fault is None or self.fault.kind != fault.kind
        self.fault = fault
        strict: list[Callable[[], None]] = []
        failed: list[_Soft] = []
        for cb in self._callbacks:
            if isinstance(cb, _Soft):
                failed.append(cb)
            else:
                strict.append(cb)
        self._callbacks = strict
        if changed and self.on_fault is not None:
            self.on_fault(fault)
        for soft in failed:
            soft.on_fail()
        if self._retry_timer is None and not self._closed:
            delay = self._retry_delay
            self._retry_delay = min(RETRY_MAX, delay * 2)
            self._retry_timer = self._loop.call_later(delay, self._retry_due)

    def _retry_due(self) -> None:
        self._retry_timer = None
        if self.fault is not None and self._inflight is None:
            for cb in self._hand_off():
                cb()

    def flush_sync(self) -> None:
        """Commit everything now and wait for it (shutdown; the loop need not run).
        Raises what the commit raised if it fails (the callbacks then do not run)."""
        self._wait_writer()
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
            self._queue.put(last)
            self._wait_writer()
            if not last.ok:
                assert last.error is not None
                raise last.error
            self.commits += 1
            self.ops_committed += len(items)
        for cb in callbacks:
            cb()

    def _wait_writer(self) -> None:
        """Until the writer thread has done everything queued so far (``ok`` of the
        batches among it is then final); at once if the thread has stopped (a second
        ``close``)."""
        if not self._writer_thread.is_alive():
            return
        done = threading.Event()
        self._queue.put(done)
        done.wait()

    def close(self) -> None:
        """Commit what is pending and stop the thread. A commit that still fails (the
        disk is full) is logged, not raised: what it held was never acknowledged."""
        if self._retry_timer is not None:
            self._retry_timer.cancel()
            self._retry_timer = None
        if self.before_close is not None:
            self.before_close()
        try:
            self.flush_sync()
        except Exception as exc:
            log.error("store: pending writes lost at shutdown (not acknowledged): %s", exc)
        finally:
            self._closed = True
            self._queue.put(None)
            self._writer_thread.join(timeout=30)
            self._conn.close()
            if self.log is not None:
                self.log.close()
