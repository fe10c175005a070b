"""Durable outboxes: numbering across restarts, sent only once committed, freed on ack."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.cluster.outbox import ClusterStore
from gateway.store.db import open_db
from gateway.store.writer import GroupCommitter


def test_memory_only_outbox() -> None:
    store = ClusterStore(None, None)
    box = store.outbox("b", 3)
    ready = []
    for i in range(5):
        box.append(b"m%d" % i, lambda: ready.append(1))
    assert [s for s, _ in box.records] == [3, 4, 5] and box.dropped == 2
    assert [s for s, _ in box.unsent()] == [3, 4, 5]
    box.sent = 5
    assert box.unsent() == []
    assert box.ack(4) == 2 and len(box) == 1
    box.rewind()
    assert [s for s, _ in box.unsent()] == [5]


def test_durable_outbox_survives_a_restart(tmp_path: Path) -> None:
    db = tmp_path / "gateway.db"

    async def first() -> str:
        loop = asyncio.get_running_loop()
        committer = GroupCommitter(open_db(db, check_same_thread=False), loop)
        store = ClusterStore(open_db(db), committer)
        box = store.outbox("b", 0)
        durable = asyncio.Event()
        for i in range(4):
            box.append(b"m%d" % i, durable.set)
        assert box.unsent() == []  # nothing goes out before it is committed
        await asyncio.wait_for(durable.wait(), 10)
        assert [s for s, _ in box.unsent()] == [1, 2, 3, 4]
        box.ack(2)
        store.applied_saved("c", "e1", 7)
        committer.close()
        return store.epoch

    epoch = asyncio.run(first())

    async def second() -> None:
        loop = asyncio.get_running_loop()
        committer = GroupCommitter(open_db(db, check_same_thread=False), loop)
        store = ClusterStore(open_db(db), committer)
        assert store.epoch == epoch
        box = store.outbox("b", 0)
        assert [(s, b) for s, b in box.records] == [(3, b"m2"), (4, b"m3")]
        assert box.next_seq == 5
        assert store.inbox() == {"c": ("e1", 7)}
        box.ack(4)
        committer.close()
        again = ClusterStore(open_db(db), None).outbox("b", 0)
        assert len(again) == 0 and again.next_seq == 5  # numbering never goes back

    asyncio.run(second())
