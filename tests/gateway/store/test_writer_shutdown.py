"""GroupCommitter.flush_sync at shutdown, when the last batch was committed by the writer
thread but its completion has not run on the (stopping) event loop yet: the batch must not
be executed again (an INSERT of a fixed key would fail as a duplicate and take every
pending write down with it); and a second close() returns."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.store.db import open_db
from gateway.store.writer import GroupCommitter


def test_flush_sync_does_not_replay_a_committed_batch(tmp_path: Path) -> None:
    path = tmp_path / "gateway.db"
    setup = open_db(path)
    setup.execute("CREATE TABLE t(id INTEGER PRIMARY KEY)")
    loop = asyncio.new_event_loop()  # never run: completions stay queued, as at shutdown
    try:
        committer = GroupCommitter(open_db(path, check_same_thread=False), loop)
        committer.add("INSERT INTO t VALUES (?)", (1,))
        done: list[str] = []
        committer.after_commit(lambda: done.append("first"))
        committer._flush()  # the batch goes to the writer thread
        committer._wait_writer()  # committed; its _done waits on the loop
        committer.add("INSERT INTO t VALUES (?)", (2,))
        committer.after_commit(lambda: done.append("second"))
        committer.close()
        assert [r[0] for r in setup.execute("SELECT id FROM t ORDER BY id")] == [1, 2]
        assert done == ["first", "second"]
    finally:
        loop.close()


def test_a_second_close_returns(tmp_path: Path) -> None:
    """close() twice: the second finds the writer thread stopped and returns (its
    synchronous flush waits on a marker in the thread's queue, which a stopped thread
    would never set)."""
    loop = asyncio.new_event_loop()
    try:
        committer = GroupCommitter(open_db(tmp_path / "gateway.db", check_same_thread=False),
                                   loop)
        committer.close()
        committer.close()
    finally:
        loop.close()
