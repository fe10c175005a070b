"""GroupCommitter in fault mode, against a real SQLite file made "full" with
``PRAGMA max_page_count`` (SQLite answers SQLITE_FULL exactly as on ENOSPC): soft
callbacks are failed at once, strict ones wait, new soft ones run at once during the
fault, the pending writes are kept in order and committed when the store can write
again, and the reserve hook is asked before a space fault is reported."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from gateway.store.db import open_db
from gateway.store.faults import StoreFault, classify
from gateway.store.writer import GroupCommitter, Task


def _setup(path: Path) -> int:
    conn = open_db(path)
    conn.execute("CREATE TABLE t(id INTEGER PRIMARY KEY, body BLOB)")
    pages: int = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.close()
    return pages


async def _until(cond: object, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():  # type: ignore[operator]
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)  # bounded poll of the committer's state


def test_full_store_fails_soft_keeps_strict_and_resumes(tmp_path: Path) -> None:
    db = tmp_path / "gateway.db"
    pages = _setup(db)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        writer = open_db(db, check_same_thread=False)
        writer.execute(f"PRAGMA max_page_count={pages + 2}")
        c = GroupCommitter(writer, loop)
        faults: list[StoreFault | None] = []
        c.on_fault = faults.append
        events: list[str] = []
        c.add("INSERT INTO t VALUES (?, ?)", (1, b"x" * 100))
        c.after_commit(lambda: events.append("small"))
        await _until(lambda: "small" in events)
        c.add("INSERT INTO t VALUES (?, ?)", (2, b"y" * 200_000))  # > max_page_count
        c.after_commit(lambda: events.append("soft-ran"), lambda: events.append("soft-failed"))
        c.after_commit(lambda: events.append("strict"))
        await _until(lambda: c.fault is not None)
        assert c.fault is not None and c.fault.kind == "full"
        assert faults and faults[0] is not None and faults[0].kind == "full"
        assert events == ["small", "soft-failed"]
        # during the fault a soft callback runs at once, writes are kept
        c.add("DELETE FROM t WHERE id=?", (1,))
        c.after_commit(lambda: events.append("soft-now"), lambda: events.append("x"))
        assert events[-1] == "soft-now"
        assert c.dirty
        # room again: raise the limit on the writer thread, retry
        done = asyncio.Event()
        c.submit(Task(lambda conn: conn.execute("PRAGMA max_page_count=100000").fetchall(),
                      lambda r, e: done.set()))
        await done.wait()
        c.retry()
        await _until(lambda: "strict" in events)
        assert c.fault is None and faults[-1] is None
        assert not c.dirty
        c.close()
        check = sqlite3.connect(db)
        assert [r[0] for r in check.execute("SELECT id FROM t")] == [2]  # in order
        check.close()

    asyncio.run(run())


def test_reserve_is_released_before_a_space_fault(tmp_path: Path) -> None:
    """``release_space`` (the reserve) is called on the writer thread at SQLITE_FULL; if
    it freed something the commit is retried at once (here the hook raises the page
    limit, as deleting the reserve file gives room back) and no fault is reported."""
    db = tmp_path / "gateway.db"
    pages = _setup(db)

    async def run() -> None:
        loop = asyncio.get_running_loop()
        writer = open_db(db, check_same_thread=False)
        writer.execute(f"PRAGMA max_page_count={pages + 2}")
        c = GroupCommitter(writer, loop)
        calls: list[int] = []

        def release() -> bool:
            calls.append(1)
            writer.execute("PRAGMA max_page_count=100000").fetchall()
            return True

        c.release_space = release
        acked = asyncio.Event()
        c.add("INSERT INTO t VALUES (?, ?)", (2, b"y" * 200_000))
        c.after_commit(acked.set, lambda: None)
        await asyncio.wait_for(acked.wait(), 5)
        assert calls == [1] and c.fault is None and c.failures == 0
        c.close()

    asyncio.run(run())


def test_classify() -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("PRAGMA max_page_count=1")
    try:
        conn.execute("CREATE TABLE a(x)")
        conn.execute("CREATE TABLE b(x)")
        conn.execute("INSERT INTO b VALUES (randomblob(100000))")
    except sqlite3.Error as exc:
        assert classify(exc).kind == "full"
    assert classify(sqlite3.DatabaseError("database disk image is malformed")).kind == "corrupt"
    assert classify(sqlite3.OperationalError("attempt to write a readonly database")).kind \
        == "readonly"
    assert classify(OSError(28, "No space left on device")).kind == "full"
    assert classify(ValueError("x")).kind == "other"
