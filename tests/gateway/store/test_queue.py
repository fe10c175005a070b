"""The durable byte-bounded queue (gateway.store.queue) on a real SQLite file with the
real group-commit writer: order, bounds, retry, and survival of a crash (a process
killed with SIGKILL after its puts were committed)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gateway.store.queue import QueueDb


async def _committed(db: QueueDb) -> None:
    done = asyncio.get_running_loop().create_future()
    db.committer.after_commit(lambda: done.set_result(None))
    await asyncio.wait_for(done, 10)


def test_fifo_bounds_retry_and_reload(tmp_path: Path) -> None:
    path = tmp_path / "q.db"

    async def first() -> None:
        db = QueueDb.open(path, asyncio.get_running_loop())
        overflows: list[int] = []
        q = db.queue("webhook:a", max_bytes=10, on_overflow=overflows.append)
        other = db.queue("webhook:b", max_bytes=100)
        assert [q.put(b"aaa") is not None, q.put(b"bbb") is not None] == [True, True]
        assert other.put(b"zz") is not None
        assert q.put(b"cccccc") is None and overflows == [6] and q.overflowed == 1
        assert q.put(b"ccc") is not None and q.bytes == 9 and q.depth == 3
        e1 = q.take()
        e2 = q.take()
        assert e1 is not None and e2 is not None and (e1.item, e2.item) == (b"aaa", b"bbb")
        q.done(e1)
        q.retry(e2)  # back at the head
        again = q.take()
        assert again is e2 and again.attempts == 1
        q.retry(again)
        await _committed(db)
        assert q.committed == 3 and q.bytes == 6
        db.close()

    async def second() -> None:
        db = QueueDb.open(path, asyncio.get_running_loop())
        q = db.queue("webhook:a", max_bytes=10)
        assert q.load() == 2
        items = [q.take(), q.take(), q.take()]
        assert [e.item if e else None for e in items] == [b"bbb", b"ccc", None]
        assert items[0] is not None and items[0].attempts == 2
        b = db.queue("webhook:b", max_bytes=100)
        assert b.load() == 1
        n = q.put(b"ddd")
        assert n is not None and n.id > max(e.id for e in items if e)  # ids keep ascending
        db.close()

    asyncio.run(first())
    asyncio.run(second())


_CHILD = textwrap.dedent("""
    import asyncio, os, sys
    from gateway.store.queue import QueueDb

    async def main():
        db = QueueDb.open(sys.argv[1], asyncio.get_running_loop())
        q = db.queue("sink", max_bytes=1 << 20)
        for i in range(500):
            q.put(b"item-%d" % i)
        done = asyncio.get_running_loop().create_future()
        db.committer.after_commit(lambda: done.set_result(None))
        await done
        print(q.committed, flush=True)
        await asyncio.sleep(3600)  # killed here, without any shutdown

    asyncio.run(main())
""")


def test_committed_items_survive_sigkill(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE,
                             cwd=Path(__file__).parents[3], env={**os.environ})
    assert child.stdout is not None
    line = child.stdout.readline()
    assert line.strip() == b"500"
    child.send_signal(signal.SIGKILL)
    child.wait(10)

    async def reload() -> list[bytes]:
        db = QueueDb.open(path, asyncio.get_running_loop())
        q = db.queue("sink", max_bytes=1 << 20)
        q.load()
        out = []
        while (e := q.take()) is not None:
            out.append(e.item)
        db.close()
        return out

    assert asyncio.run(reload()) == [b"item-%d" % i for i in range(500)]


@pytest.mark.parametrize("size", [0, 1, 100])
def test_item_larger_than_the_queue_is_refused(tmp_path: Path, size: int) -> None:
    async def go() -> None:
        db = QueueDb.open(tmp_path / "q.db", asyncio.get_running_loop())
        q = db.queue("x", max_bytes=size)
        assert q.put(b"x" * (size + 1)) is None and q.depth == 0 and q.overflowed == 1
        db.close()

    asyncio.run(go())
