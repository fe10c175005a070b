"""The group committer's writer thread runs under SCHED_BATCH, so that its wake-ups do
not preempt the event loop's thread (gateway.store.writer's docstring); the thread that
made the committer keeps its own policy."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from gateway.store.db import open_db
from gateway.store.writer import GroupCommitter


def test_the_writer_thread_is_sched_batch_and_the_caller_is_not(tmp_path: Path) -> None:
    loop = asyncio.new_event_loop()
    try:
        committer = GroupCommitter(open_db(tmp_path / "gateway.db", check_same_thread=False),
                                   loop)
        try:
            committer._wait_writer()  # the thread has run past its start
            tid = committer._writer_thread.native_id
            assert tid is not None
            assert os.sched_getscheduler(tid) == os.SCHED_BATCH
            assert os.sched_getscheduler(0) == os.SCHED_OTHER
        finally:
            committer.close()
    finally:
        loop.close()
