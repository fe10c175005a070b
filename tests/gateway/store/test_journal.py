"""The journal against a real SQLite file and its journal log: rows, multi-row
statements, message bodies deleted with their last queue row; and the group committer's
writer thread (one thread, retry after a failure).

``count`` counts what is durable: SQLite with the journal log replayed over it (what a
start-up after kill -9 would load); ``sqlite_count`` only what SQLite holds."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from gateway.core.clock import VirtualScheduler
from gateway.store import bulk
from gateway.store.bulk import MAX_ROWS, MAX_VARIABLES, chunk_sizes, insert_rows, where_in
from gateway.store.db import ensure_schema, open_db
from gateway.store.journal_log import durable_copy
from gateway.store.sessions import INLINE_MAX
from gateway.store.writer import GroupCommitter, Op
from protocols.context import RESUBSCRIBED, ClientInfo, Message, SubOptions

from .test_sessions import committed, make_node, open_session


def count(db: Path, table: str) -> int:
    conn = durable_copy(db)
    try:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


def sqlite_count(db: Path, table: str) -> int:
    conn = open_db(db, readonly=True)
    try:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


def test_chunk_sizes_are_powers_of_two_within_the_limits() -> None:
    for width in (1, 2, 9, 10):
        for n in (0, 1, 2, 3, 7, 64, 100, 1000, 5000):
            sizes = list(chunk_sizes(n, width))
            assert sum(sizes) == n
            assert all(s & (s - 1) == 0 for s in sizes)
            assert all(s <= MAX_ROWS and s * width <= MAX_VARIABLES for s in sizes)
            assert sizes == sorted(sizes, reverse=True)


def test_multi_row_statements_keep_every_row_in_order() -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t(k INTEGER PRIMARY KEY, v TEXT)")
    rows = [(i, f"v{i}") for i in range(1, 2500)]
    for sql, params in insert_rows("INSERT INTO t(k, v)", 2, rows):
        conn.execute(sql, params)
    assert conn.execute("SELECT k, v FROM t ORDER BY rowid").fetchall() == rows
    for sql, params in where_in("DELETE FROM t WHERE k", list(range(1, 2500, 2))):
        conn.execute(sql, params)
    assert [r[0] for r in conn.execute("SELECT k FROM t")] == list(range(2, 2500, 2))


def test_delivery_acknowledged_within_the_turn_never_reaches_sqlite(tmp_path: Path) -> None:
    async def scenario() -> None:
        db = tmp_path / "gateway.db"
        node, committer = make_node(db, VirtualScheduler())
        sub, h = open_session(node, "sub", expiry=60)
        node.subscribe(sub, "t", SubOptions(qos=1))
        await committed(committer)
        node.publish(ClientInfo("p"), Message("t", b"x", qos=1, publisher="p"))
        node.sessions["sub"].puback(h.delivered[0].packet_id or 0)
        await committed(committer)
        assert count(db, "queue") == 0 and count(db, "messages") == 0
        committer.close()  # the last checkpoint: SQLite never saw the row
        assert sqlite_count(db, "queue") == 0 and sqlite_count(db, "messages") == 0

    asyncio.run(scenario())


def test_unacknowledged_copy_survives_when_another_is_acknowledged_in_the_turn(
    tmp_path: Path,
) -> None:
    """Fan-out to two persistent sessions; one acknowledges before the commit. The other
    copy (and the body it needs) must be on disk once the commit callback runs, i.e. by
    the time the publisher's PUBACK may leave."""

    async def scenario() -> None:
        db = tmp_path / "gateway.db"
        node, committer = make_node(db, VirtualScheduler())
        a, ha = open_session(node, "a", expiry=3600)
        b, _ = open_session(node, "b", expiry=3600)
        node.subscribe(a, "t", SubOptions(qos=1))
        node.subscribe(b, "t", SubOptions(qos=1))
        await committed(committer)
        for i in range(3):
            node.publish(ClientInfo("p"), Message("t", b"m%d" % i, qos=1, publisher="p"))
        for d in ha.delivered:  # a acknowledges everything at once, b nothing
            node.sessions["a"].puback(d.packet_id or 0)
        durable_at_ack: list[tuple[int, int]] = []
        committer.after_commit(
            lambda: durable_at_ack.append((count(db, "queue"), count(db, "messages")))
        )
        await committed(committer)
        assert durable_at_ack == [(3, 3)]
        # kill -9: nothing but what is on disk counts
        node2, committer2 = make_node(db, VirtualScheduler())
        assert [d.message.payload for d in node2.sessions["b"].inflight.values()] == [
            b"m0", b"m1", b"m2",
        ]
        assert not node2.sessions["a"].inflight and not node2.sessions["a"].mqueue
        committer2.close()
        committer.close()

    asyncio.run(scenario())


def test_body_is_deleted_with_its_last_queue_row_also_after_a_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        db = tmp_path / "gateway.db"
        node, committer = make_node(db, VirtualScheduler())
        a, ha = open_session(node, "a", expiry=3600)
        b, _ = open_session(node, "b", expiry=3600)
        node.subscribe(a, "t", SubOptions(qos=1))
        node.subscribe(b, "t", SubOptions(qos=1))
        node.publish(ClientInfo("p"), Message("t", b"x", qos=1, publisher="p"))
        await committed(committer)
        assert (count(db, "queue"), count(db, "messages")) == (2, 1)
        node.sessions["a"].puback(ha.delivered[0].packet_id or 0)
        await committed(committer)
        assert (count(db, "queue"), count(db, "messages")) == (1, 1)  # b still needs it
        committer.close()

        node2, committer2 = make_node(db, VirtualScheduler())
        _, hb2 = open_session(node2, "b", expiry=3600)
        assert [d.message.payload for d in hb2.delivered] == [b"x"]
        node2.sessions["b"].puback(hb2.delivered[0].packet_id or 0)
        await committed(committer2)
        assert (count(db, "queue"), count(db, "messages")) == (0, 0)
        committer2.close()

    asyncio.run(scenario())


def test_many_rows_in_one_turn_round_trip_in_order(tmp_path: Path) -> None:
    """Hundreds of deliveries queued in one turn (multi-row chunks), packet ids assigned
    in a later turn, some acknowledged: the restart sees exactly the rest, in order."""

    async def scenario() -> None:
        db = tmp_path / "gateway.db"
        node, committer = make_node(db, VirtualScheduler())
        sub, h = open_session(node, "sub", expiry=3600, rmax=100)
        node.subscribe(sub, "t/+", SubOptions(qos=1, subscription_id=3))
        node.close(sub, h, send_will=False)
        for i in range(900):  # < max_mqueue_len
            node.publish(ClientInfo("p"), Message(f"t/{i % 7}", b"%d" % i, qos=1, publisher="p"))
        await committed(committer)
        # one subscriber each: the bodies are inline in the queue rows
        assert (count(db, "queue"), count(db, "messages")) == (900, 0)
        _, h = open_session(node, "sub", expiry=3600, rmax=100)  # 100 assigned, sent
        await committed(committer)
        session = node.sessions["sub"]
        for d in h.delivered[:40]:
            session.puback(d.packet_id or 0)  # 40 more drained and assigned
        await committed(committer)
        committer.close()

        node2, committer2 = make_node(db, VirtualScheduler())
        s2 = node2.sessions["sub"]
        restored = [*s2.inflight.values(), *s2.mqueue]
        assert [d.message.payload for d in restored] == [b"%d" % i for i in range(40, 900)]
        assert [d.message.topic for d in restored[:3]] == ["t/5", "t/6", "t/0"]
        assert all(d.subscription_ids == (3,) for d in restored)
        assert sorted(d.packet_id or 0 for d in s2.inflight.values()) == sorted(
            session.inflight
        )
        assert (count(db, "queue"), count(db, "messages")) == (860, 0)
        # a message after the restart gets an id no loaded (inline) row has
        node2.publish(ClientInfo("p"), Message("t/1", b"new", qos=1, publisher="p"))
        assert s2.mqueue[-1].message.payload == b"new"
        assert (s2.mqueue[-1].message.store_id or 0) > max(
            d.message.store_id or 0 for d in restored
        )
        committer2.close()

    asyncio.run(scenario())


def test_awaiting_rel_keeps_the_last_state_of_the_turn(tmp_path: Path) -> None:
    async def scenario() -> None:
        db = tmp_path / "gateway.db"
        node, committer = make_node(db, VirtualScheduler())
        open_session(node, "s", expiry=3600)
        store = node.store
        assert store is not None
        store.awaiting_rel_added("s", 1)
        store.awaiting_rel_added("s", 2)
        await committed(committer)
        store.awaiting_rel_removed("s", 1)
        store.awaiting_rel_added("s", 1)  # removed and re-used within the turn
        store.awaiting_rel_removed("s", 2)
        store.awaiting_rel_added("s", 3)
        store.awaiting_rel_removed("s", 3)
        await committed(committer)
        conn = durable_copy(db)
        assert sorted(r[0] for r in conn.execute("SELECT packet_id FROM awaiting_rel")) == [1]
        conn.close()
        committer.close()

    asyncio.run(scenario())


class _Flaky:
    """A segment whose first commit fails (anything raised, not only sqlite3.Error)."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.tries = 0
        self.threads: list[int] = []

    def empty(self) -> bool:
        return False

    def statements(self) -> list[Op]:
        self.tries += 1
        self.threads.append(threading.get_ident())
        if self.tries == 1:
            raise ValueError("first try fails")
        return [("INSERT INTO t VALUES (?)", (self.value,))]


def test_writer_is_one_thread_and_retries_a_failed_batch(tmp_path: Path) -> None:
    async def scenario() -> None:
        db = tmp_path / "gateway.db"
        conn = open_db(db)
        ensure_schema(conn, "CREATE TABLE t(v INTEGER);")
        committer = GroupCommitter(open_db(db, check_same_thread=False), asyncio.get_running_loop())
        done: list[int] = []
        segs = [_Flaky(i) for i in range(3)]
        for seg in segs:
            committer.add_segment(seg)
            committer.add("INSERT INTO t VALUES (?)", (10 + seg.value,))
            committer.after_commit(lambda v=seg.value: done.append(v))  # type: ignore[misc]
            await committed(committer)
        assert done == [0, 1, 2]  # each only after its retry committed
        assert [s.tries for s in segs] == [2, 2, 2]
        assert len({t for s in segs for t in s.threads}) == 1  # the same writer thread
        assert [r[0] for r in conn.execute("SELECT v FROM t ORDER BY rowid")] == [
            0, 10, 1, 11, 2, 12,
        ]
        committer.close()

    asyncio.run(scenario())


def test_a_batch_behind_a_failed_one_waits_for_its_retry(tmp_path: Path) -> None:
    """Two batches in the pipeline; the first fails. The second must not be committed
    before the first's retry (order), and no callback runs before its writes are in."""

    async def scenario() -> None:
        db = tmp_path / "gateway.db"
        conn = open_db(db)
        ensure_schema(conn, "CREATE TABLE t(v INTEGER);")
        committer = GroupCommitter(open_db(db, check_same_thread=False), asyncio.get_running_loop())
        seen: list[tuple[str, list[int]]] = []

        def rows() -> list[int]:
            return [r[0] for r in conn.execute("SELECT v FROM t ORDER BY rowid")]

        committer.add_segment(_Flaky(1))
        committer.after_commit(lambda: seen.append(("first", rows())))
        committer._flush()  # in flight
        committer.add("INSERT INTO t VALUES (?)", (2,))
        committer.after_commit(lambda: seen.append(("second", rows())))
        committer._flush()  # in flight behind it
        await committed(committer)
        assert rows() == [1, 2]
        assert seen == [("first", [1, 2]), ("second", [1, 2])] or seen == [
            ("first", [1]),
            ("second", [1, 2]),
        ]
        committer.close()

    asyncio.run(scenario())


def test_update_column_with_and_without_update_from(monkeypatch: pytest.MonkeyPatch) -> None:
    for have in (True, False):
        monkeypatch.setattr(bulk, "HAVE_UPDATE_FROM", have)
        conn = sqlite3.connect(":memory:")
        conn.execute("CREATE TABLE q(ref INTEGER PRIMARY KEY, pid INTEGER)")
        conn.executemany("INSERT INTO q VALUES (?, NULL)", [(i,) for i in range(1, 301)])
        pairs = [(i, 1000 + i) for i in range(1, 301, 3)]
        for sql, params in bulk.update_column("q", "ref", "pid", pairs):
            conn.execute(sql, params)
        got = dict(conn.execute("SELECT ref, pid FROM q").fetchall())
        assert got == {i: (1000 + i if i % 3 == 1 else None) for i in range(1, 301)}


def test_pubrec_after_the_commit_is_restored(tmp_path: Path) -> None:
    async def scenario() -> None:
        db = tmp_path / "gateway.db"
        node, committer = make_node(db, VirtualScheduler())
        sub, h = open_session(node, "sub", expiry=3600)
        node.subscribe(sub, "t", SubOptions(qos=2))
        node.publish(ClientInfo("p"), Message("t", b"a", qos=2, publisher="p"))
        node.publish(ClientInfo("p"), Message("t", b"b", qos=2, publisher="p"))
        await committed(committer)
        first = h.delivered[0].packet_id or 0
        assert node.sessions["sub"].pubrec(first)  # the row is on disk: an UPDATE
        await committed(committer)
        committer.close()
        node2, committer2 = make_node(db, VirtualScheduler())
        s2 = node2.sessions["sub"]
        assert list(s2.released) == [first]
        assert sorted(s2.inflight) == sorted(d.packet_id or 0 for d in h.delivered)
        committer2.close()

    asyncio.run(scenario())


def test_body_of_a_fanned_out_message_stays_until_its_last_copy_goes(tmp_path: Path) -> None:
    async def scenario() -> None:
        db = tmp_path / "gateway.db"
        node, committer = make_node(db, VirtualScheduler())
        handles = {}
        for cid in ("a", "b", "c", "d"):
            info, handles[cid] = open_session(node, cid, expiry=3600)
            node.subscribe(info, "t", SubOptions(qos=1))
        node.publish(ClientInfo("p"), Message("t", b"x", qos=1, publisher="p"))
        await committed(committer)
        for cid in ("a", "b"):
            node.sessions[cid].puback(handles[cid].delivered[0].packet_id or 0)
            await committed(committer)
            assert count(db, "messages") == 1
        committer.close()

        node2, committer2 = make_node(db, VirtualScheduler())  # c and d hold it
        for cid in ("c", "d"):
            _, h = open_session(node2, cid, expiry=3600)
            assert count(db, "messages") == 1
            node2.sessions[cid].puback(h.delivered[0].packet_id or 0)
            await committed(committer2)
        assert (count(db, "queue"), count(db, "messages")) == (0, 0)
        committer2.close()

    asyncio.run(scenario())


def test_inline_body_gets_a_messages_row_when_a_later_turn_queues_it_again(
    tmp_path: Path,
) -> None:
    """A retained QoS 1 message goes to one persistent session (body inline in its row,
    committed); in a later batch a second session subscribes and gets the same message:
    its body is written to ``messages`` with that row. Each copy survives a restart on
    its own: the inline one acknowledged first, then the other."""

    async def scenario() -> None:
        db = tmp_path / "gateway.db"
        node, committer = make_node(db, VirtualScheduler())
        a, ha = open_session(node, "a", expiry=3600)
        node.subscribe(a, "t", SubOptions(qos=1))
        node.publish(ClientInfo("p"), Message("t", b"kept", qos=1, retain=True, publisher="p"))
        await committed(committer)
        assert (count(db, "queue"), count(db, "messages")) == (1, 0)
        b, hb = open_session(node, "b", expiry=3600)
        existed = node.subscribe(b, "t", SubOptions(qos=1))
        node.deliver_retained(b, "t", SubOptions(qos=1), existed == RESUBSCRIBED)
        await committed(committer)
        assert [d.message.payload for d in hb.delivered] == [b"kept"]
        assert hb.delivered[0].message is ha.delivered[0].message  # the same message
        assert (count(db, "queue"), count(db, "messages")) == (2, 1)
        committer.close()  # both unacknowledged: a restart must give both their body

        node2, committer2 = make_node(db, VirtualScheduler())
        _, ha2 = open_session(node2, "a", expiry=3600)
        _, hb2 = open_session(node2, "b", expiry=3600)
        assert [d.message.payload for d in ha2.delivered] == [b"kept"]
        assert [d.message.payload for d in hb2.delivered] == [b"kept"]
        node2.sessions["a"].puback(ha2.delivered[0].packet_id or 0)  # the inline copy
        await committed(committer2)
        assert (count(db, "queue"), count(db, "messages")) == (1, 1)
        committer2.close()

        node3, committer3 = make_node(db, VirtualScheduler())
        _, hb3 = open_session(node3, "b", expiry=3600)
        assert [d.message.payload for d in hb3.delivered] == [b"kept"]
        node3.sessions["b"].puback(hb3.delivered[0].packet_id or 0)
        await committed(committer3)
        assert (count(db, "queue"), count(db, "messages")) == (0, 0)
        # new messages after a restart never reuse an id of an inline row
        node3.publish(ClientInfo("p"), Message("t", b"new", qos=1, publisher="p"))
        await committed(committer3)
        committer3.close()

    asyncio.run(scenario())


def test_a_large_body_goes_to_messages_not_inline(tmp_path: Path) -> None:
    """A body over INLINE_MAX is not inline (a later packet-id update would rewrite it):
    its row references a messages row, which goes with the row."""

    async def scenario() -> None:
        db = tmp_path / "gateway.db"
        node, committer = make_node(db, VirtualScheduler())
        a, _ = open_session(node, "a", expiry=3600)
        node.subscribe(a, "t", SubOptions(qos=1))
        node.close(a, _, send_will=False)
        big = b"b" * (INLINE_MAX + 1)
        node.publish(ClientInfo("p"), Message("t", big, qos=1, publisher="p"))
        node.publish(ClientInfo("p"), Message("t", b"small", qos=1, publisher="p"))
        await committed(committer)
        assert (count(db, "queue"), count(db, "messages")) == (2, 1)
        committer.close()
        node2, committer2 = make_node(db, VirtualScheduler())
        _, h = open_session(node2, "a", expiry=3600)
        assert [d.message.payload for d in h.delivered] == [big, b"small"]
        for d in h.delivered:
            node2.sessions["a"].puback(d.packet_id or 0)
        await committed(committer2)
        assert (count(db, "queue"), count(db, "messages")) == (0, 0)
        committer2.close()

    asyncio.run(scenario())


def test_a_file_of_the_previous_layout_is_upgraded_and_its_rows_load(tmp_path: Path) -> None:
    """A queue table without the inline columns (bodies in ``messages`` only) gets them
    at start-up; its rows load with their bodies, and new rows go inline beside them."""
    db = tmp_path / "gateway.db"
    old = open_db(db)
    ensure_schema(old, OLD_SCHEMA)
    old.execute("INSERT INTO sessions VALUES ('s', 3600, 1.0, 1.0)")
    old.execute("INSERT INTO subscriptions VALUES ('s', 't', 1, 0, 0, 0, NULL)")
    old.execute("INSERT INTO messages VALUES (7, 't', x'6f6c64', 1, 0, NULL, 'p', NULL, 1.0, NULL)")
    old.execute("INSERT INTO queue(ref, client_id, msg_id, qos, retain) VALUES (3, 's', 7, 1, 0)")
    old.close()

    async def scenario() -> None:
        node, committer = make_node(db, VirtualScheduler())
        node.publish(ClientInfo("p"), Message("t", b"new", qos=1, publisher="p"))
        await committed(committer)
        committer.close()
        node2, committer2 = make_node(db, VirtualScheduler())
        _, h = open_session(node2, "s", expiry=3600)
        assert [d.message.payload for d in h.delivered] == [b"old", b"new"]
        assert len({d.message.store_id for d in h.delivered}) == 2
        for d in h.delivered:
            node2.sessions["s"].puback(d.packet_id or 0)
        await committed(committer2)
        assert (count(db, "queue"), count(db, "messages")) == (0, 0)
        committer2.close()

    asyncio.run(scenario())


# the session tables as the release before inline bodies made them
OLD_SCHEMA = """
CREATE TABLE sessions(client_id TEXT PRIMARY KEY, expiry_interval INTEGER NOT NULL,
    disconnected_at REAL, created_at REAL NOT NULL);
CREATE TABLE subscriptions(client_id TEXT NOT NULL, filter TEXT NOT NULL,
    qos INTEGER NOT NULL, no_local INTEGER NOT NULL, rap INTEGER NOT NULL,
    rh INTEGER NOT NULL, sid INTEGER, PRIMARY KEY (client_id, filter)) WITHOUT ROWID;
CREATE TABLE messages(id INTEGER PRIMARY KEY, topic TEXT NOT NULL, payload BLOB NOT NULL,
    qos INTEGER NOT NULL, retain INTEGER NOT NULL, props TEXT, publisher TEXT,
    username TEXT, ts REAL, expires_at REAL);
CREATE TABLE queue(ref INTEGER PRIMARY KEY, client_id TEXT NOT NULL,
    msg_id INTEGER NOT NULL, qos INTEGER NOT NULL, retain INTEGER NOT NULL, sub_ids TEXT,
    packet_id INTEGER, released INTEGER NOT NULL DEFAULT 0, share TEXT);
"""
