"""The journal log (gateway/store/journal_log.py) against real files: replay after a
crash, a torn tail, a damaged middle frame, checkpoints while traffic flows, rows pending
across checkpoints, a log left by a crash during a checkpoint; the frame parser under
hypothesis; and kill -9 of a real gatewayd with paho clients.

A crash is a copy of the data directory taken while the store is open, after a commit
(:func:`crash_copy`): the files as the disk holds them, the running store's later
writes (its close, its last checkpoint) not included."""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.clock import VirtualScheduler
from gateway.core.node import Node
from gateway.store.journal_log import JournalLog, log_dir, log_files, read_frames
from gateway.store.writer import GroupCommitter
from protocols.context import ClientInfo, Message, SubOptions
from tests.fsfaults import can_mount, fill, free_bytes, sized_tmpfs

from .test_journal import count, sqlite_count
from .test_sessions import committed, make_node, open_session


class Alarms:
    """Records what the store reports (the admin's alarm list and salvage reports)."""

    def __init__(self) -> None:
        self.active: dict[str, str] = {}
        self.salvage_reports: list[dict[str, Any]] = []

    @property
    def alarms(self) -> Alarms:
        return self

    def activate(self, name: str, message: str, details: dict[str, Any] | None = None) -> None:
        self.active[name] = message

    def deactivate(self, name: str) -> bool:
        return self.active.pop(name, None) is not None


def crash_copy(src: Path, dst: Path) -> Path:
    """The data directory as a kill -9 would leave it (the store is open; everything
    committed is in its files)."""
    shutil.copytree(src, dst)
    return dst / "gateway.db"


def offline_subscriber(node: Node, cid: str = "s") -> None:
    info, h = open_session(node, cid, expiry=3600)
    node.subscribe(info, "t/#", SubOptions(qos=1))
    node.close(info, h, send_will=False)


def publish(node: Node, *payloads: bytes) -> None:
    for p in payloads:
        node.publish(ClientInfo("p"), Message("t/x", p, qos=1, publisher="p"))


def queued(node: Node, cid: str = "s") -> list[bytes]:
    s = node.sessions[cid]
    return [d.message.payload for d in [*s.inflight.values(), *s.mqueue]]


def restart(db: Path, reporting: Alarms | None = None) -> tuple[Node, GroupCommitter]:
    if reporting is None:
        return make_node(db, VirtualScheduler())
    # make_node with a reporting object
    from gateway.core.node import CoreSettings
    from gateway.store.db import ensure_schema, open_db
    from gateway.store.sessions import SCHEMA, SessionStore

    reader = open_db(db)
    ensure_schema(reader, SCHEMA)
    committer = GroupCommitter(open_db(db, check_same_thread=False), asyncio.get_running_loop())
    store = SessionStore(reader, committer, reporting)
    node = Node(CoreSettings(), VirtualScheduler(), store=store)
    node.restore(*store.load())
    return node, committer


def the_log(db: Path) -> Path:
    files = [p for _, p in log_files(log_dir(db))]
    assert len(files) == 1, files
    return files[0]


def test_replay_after_a_crash_restores_what_only_the_log_holds(tmp_path: Path) -> None:
    async def scenario() -> None:
        db = tmp_path / "a" / "gateway.db"
        node, committer = make_node(db, VirtualScheduler())
        offline_subscriber(node)
        publish(node, b"0", b"1", b"2")
        await committed(committer)
        copy = crash_copy(db.parent, tmp_path / "b")
        assert sqlite_count(copy, "queue") == 0  # in the log only
        node2, committer2 = make_node(copy, VirtualScheduler())
        assert queued(node2) == [b"0", b"1", b"2"]
        assert sqlite_count(copy, "queue") == 3  # start-up checkpointed the log
        committer2.close()
        committer.close()

    asyncio.run(scenario())


def test_a_row_acknowledged_or_assigned_within_its_batch_changes_in_place(
    tmp_path: Path,
) -> None:
    """A queue row removed while its segment is still open leaves neither the row nor
    the removal in the frame; a packet id assigned then goes into the row itself. A
    crash after that frame restores exactly the rest, packet ids included."""

    async def scenario() -> None:
        db = tmp_path / "a" / "gateway.db"
        node, committer = make_node(db, VirtualScheduler())
        info, h = open_session(node, "s", expiry=3600, rmax=2)
        node.subscribe(info, "t/#", SubOptions(qos=1))
        await committed(committer)
        publish(node, b"0", b"1", b"2", b"3")  # 0 and 1 sent (window 2), 2 and 3 queued
        session = node.sessions["s"]
        session.puback(h.delivered[0].packet_id or 0)  # 2 drained and assigned
        await committed(committer)
        path = the_log(db)
        frames = read_frames(path, int(path.stem))[0]
        records = [r for chunk in pickle.loads(frames[-1]) for r in chunk]
        assert records.count(None) == 1  # "0", acknowledged before the frame was written
        assert not [r for r in records if type(r) is int or (r and r[0] == "p")]
        copy = crash_copy(db.parent, tmp_path / "b")
        node2, committer2 = make_node(copy, VirtualScheduler())
        assert queued(node2) == [b"1", b"2", b"3"]
        pids = {d.message.payload: d.packet_id for d in node2.sessions["s"].inflight.values()}
        assert pids == {d.message.payload: d.packet_id for d in session.inflight.values()}
        committer2.close()
        committer.close()

    asyncio.run(scenario())


def test_a_torn_tail_keeps_the_frames_before_it(tmp_path: Path) -> None:
    async def scenario() -> None:
        db = tmp_path / "a" / "gateway.db"
        node, committer = make_node(db, VirtualScheduler())
        offline_subscriber(node)
        publish(node, b"0", b"1")
        await committed(committer)
        publish(node, b"2", b"3", b"4")
        await committed(committer)
        copy = crash_copy(db.parent, tmp_path / "b")
        path = the_log(copy)
        frames, end, damage = read_frames(path, int(path.stem))
        assert len(frames) >= 2 and not damage
        last = len(frames[-1]) + 8
        with open(path, "r+b") as f:  # the last frame cut in the middle
            f.truncate(end - last // 2)
        reporting = Alarms()
        node2, committer2 = restart(copy, reporting)
        assert queued(node2) == [b"0", b"1"]
        assert not reporting.active  # a torn tail is no damage
        committer2.close()
        committer.close()

    asyncio.run(scenario())


def test_a_damaged_middle_frame_alarms_and_the_frames_around_it_replay(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        db = tmp_path / "a" / "gateway.db"
        node, committer = make_node(db, VirtualScheduler())
        offline_subscriber(node)
        for p in (b"first", b"second", b"third"):
            publish(node, p)
            await committed(committer)
        copy = crash_copy(db.parent, tmp_path / "b")
        path = the_log(copy)
        data = bytearray(path.read_bytes())
        hit = data.find(b"second")
        assert hit > 0
        data[hit] ^= 0xFF  # a bit flip inside the second message's frame
        path.write_bytes(bytes(data))
        reporting = Alarms()
        with caplog.at_level(logging.ERROR, logger="gateway.store"):
            node2, committer2 = restart(copy, reporting)
        assert queued(node2) == [b"first", b"third"]
        assert "store_salvaged" in reporting.active
        assert "damaged" in reporting.active["store_salvaged"]
        errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and "journal log" in errors[0].getMessage()
        # it keeps serving: a new message is journaled and survives the next crash
        publish(node2, b"fourth")
        await committed(committer2)
        copy2 = crash_copy(copy.parent, tmp_path / "c")
        node3, committer3 = make_node(copy2, VirtualScheduler())
        assert queued(node3) == [b"first", b"third", b"fourth"]
        for c in (committer3, committer2, committer):
            c.close()

    asyncio.run(scenario())


def test_checkpoints_while_traffic_flows(tmp_path: Path) -> None:
    """Two subscribers, one online acknowledging, one offline; checkpoints between the
    turns: the offline one's rows reach SQLite, the acknowledged ones never do, and a
    crash at any point restores exactly the unacknowledged rows."""

    async def scenario() -> None:
        db = tmp_path / "a" / "gateway.db"
        node, committer = make_node(db, VirtualScheduler())
        offline_subscriber(node, "off")
        on, h = open_session(node, "on", expiry=3600)
        node.subscribe(on, "t/#", SubOptions(qos=1))
        store = node.store
        assert store is not None
        sent = []
        for turn in range(6):
            payloads = [b"%d-%d" % (turn, i) for i in range(20)]
            publish(node, *payloads)
            sent += payloads
            for d in h.delivered:
                node.sessions["on"].puback(d.packet_id or 0)
            h.delivered.clear()
            if turn % 2 == 0:
                store.checkpoint()  # type: ignore[attr-defined]
            await committed(committer)
            copy = crash_copy(db.parent, tmp_path / f"crash{turn}")
            assert count(copy, "queue") == len(sent)  # the offline session's rows only
        assert committer.checkpoints == 3
        assert 0 < sqlite_count(db, "queue") < len(sent)  # what the checkpoints moved
        node2, committer2 = make_node(copy, VirtualScheduler())
        assert queued(node2, "off") == sent
        assert queued(node2, "on") == []
        committer2.close()
        committer.close()
        assert sqlite_count(db, "queue") == len(sent)  # the last checkpoint at close
        assert log_files(log_dir(db)) == [] or all(
            not read_frames(p, g)[0] for g, p in log_files(log_dir(db))
        )

    asyncio.run(scenario())


def test_rows_pending_across_several_checkpoints(tmp_path: Path) -> None:
    """Rows queued before a checkpoint are acknowledged after it (deletes of rows
    SQLite has), packet ids assigned after it (updates), over three generations."""

    async def scenario() -> None:
        db = tmp_path / "a" / "gateway.db"
        node, committer = make_node(db, VirtualScheduler())
        offline_subscriber(node)
        store = node.store
        assert store is not None
        publish(node, b"0", b"1", b"2", b"3")
        await committed(committer)
        store.checkpoint()  # type: ignore[attr-defined]
        await committed(committer)
        assert sqlite_count(db, "queue") == 4
        publish(node, b"4", b"5")
        store.checkpoint()  # type: ignore[attr-defined]
        await committed(committer)
        # the session comes back (packet ids assigned to SQLite's rows), acks two
        info, h = open_session(node, "s", expiry=3600, rmax=3)
        assert [d.message.payload for d in h.delivered] == [b"0", b"1", b"2"]
        for d in h.delivered[:2]:
            node.sessions["s"].puback(d.packet_id or 0)
        node.close(info, h, send_will=False)
        await committed(committer)
        copy = crash_copy(db.parent, tmp_path / "b")
        node2, committer2 = make_node(copy, VirtualScheduler())
        assert queued(node2) == [b"2", b"3", b"4", b"5"]
        s2 = node2.sessions["s"]
        # the inflight ones kept their packet ids (assigned after the checkpoints)
        pid = h.delivered[2].packet_id
        assert pid is not None and s2.inflight[pid].message.payload == b"2"
        assert len(s2.inflight) == 3 and [d.message.payload for d in s2.mqueue] == [b"5"]
        committer2.close()
        committer.close()

    asyncio.run(scenario())


def test_a_log_left_by_a_crash_during_a_checkpoint_replays_idempotently(
    tmp_path: Path,
) -> None:
    """SQLite committed a checkpoint but its log file was not deleted (the crash hit in
    between): the old records replay over rows SQLite already has, then the newer
    generation's (deletes of two of them) over that."""

    async def scenario() -> None:
        db = tmp_path / "a" / "gateway.db"
        node, committer = make_node(db, VirtualScheduler())
        offline_subscriber(node)
        store = node.store
        assert store is not None
        publish(node, b"0", b"1", b"2", b"3")
        await committed(committer)
        old = the_log(db)
        saved = tmp_path / "old.log"
        shutil.copyfile(old, saved)
        store.checkpoint()  # type: ignore[attr-defined]
        await committed(committer)
        assert sqlite_count(db, "queue") == 4
        info, h = open_session(node, "s", expiry=3600, rmax=2)
        for d in list(h.delivered):  # the first two (acks move the others in)
            node.sessions["s"].puback(d.packet_id or 0)
        node.close(info, h, send_will=False)
        await committed(committer)
        copy = crash_copy(db.parent, tmp_path / "b")
        shutil.copyfile(saved, log_dir(copy) / old.name)  # not deleted by the checkpoint
        assert len(log_files(log_dir(copy))) == 2
        node2, committer2 = make_node(copy, VirtualScheduler())
        assert queued(node2) == [b"2", b"3"]
        committer2.close()
        # and once more from the same files: the same state
        node3, committer3 = make_node(copy, VirtualScheduler())
        assert queued(node3) == [b"2", b"3"]
        committer3.close()
        committer.close()

    asyncio.run(scenario())


records = st.lists(
    st.one_of(
        st.integers(min_value=1, max_value=2**40),
        st.tuples(st.just("p"), st.integers(1, 10**6), st.integers(1, 65535)),
        st.tuples(st.just("a"), st.text(max_size=20), st.integers(1, 65535), st.booleans()),
    ),
    min_size=1,
    max_size=20,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(records, min_size=1, max_size=8), st.data())
def test_frames_read_back_and_any_cut_leaves_a_prefix(
    tmp_path_factory: pytest.TempPathFactory, batches: list[list[Any]], data: st.DataObject
) -> None:
    import pickle

    d = tmp_path_factory.mktemp("log")
    jlog = JournalLog(d, 7)
    for batch in batches:
        jlog.append([batch])
    jlog.close()
    path = d / "000000000007.log"
    frames, end, damage = read_frames(path, 7)
    assert [pickle.loads(f) for f in frames] == [[b] for b in batches]
    assert not damage
    # the file is preallocated: what follows the frames is zeros, the tail
    assert end < path.stat().st_size
    # cut anywhere: the frames before the cut, no damage
    cut = data.draw(st.integers(0, end))
    blob = path.read_bytes()[:cut]
    path.write_bytes(blob)
    frames2, _, damage2 = read_frames(path, 7)
    assert frames2 == frames[: len(frames2)] and not damage2
    # the same bytes under another generation's name are not its frames
    assert read_frames(path, 8)[0] == []


def test_a_recycled_file_replays_only_its_own_generation(tmp_path: Path) -> None:
    jlog = JournalLog(tmp_path, 1)
    jlog.append([[1, 2, 3]])
    jlog.append([[4]])
    jlog.rotate(2)
    jlog.remove_before(2)  # gen 1's file becomes gen 2's, frames and all
    assert [g for g, _ in log_files(tmp_path)] == [2]
    jlog.append([[5]])
    jlog.close()
    frames, _, damage = read_frames(tmp_path / "000000000002.log", 2)
    assert len(frames) == 1 and not damage


# -- kill -9 of a real gatewayd, real paho clients -----------------------------------


@pytest.mark.slow
@pytest.mark.storage
def test_kill9_with_a_non_empty_log_delivers_every_acknowledged_message(tmp_path: Path) -> None:
    from tests.gateway.admin.gatewayd import Gatewayd
    from tests.gateway.store.test_storage_faults import Publisher, drain_keeper, keeper_session

    gw = Gatewayd(tmp_path / "gw").start()
    try:
        keeper_session(gw, 5)
        pub = Publisher(gw, "pub", 5)
        mids = [pub.publish(f"t/{i}", os.urandom(100)) for i in range(300)]
        pub.wait_answers(mids)
        assert all(pub.answers[m] == 0 for m in mids)
        data = tmp_path / "gw" / "data"
        logs = log_files(log_dir(data / "gateway.db"))
        assert logs and any(read_frames(p, g)[0] for g, p in logs)  # the log holds rows
        ro = sqlite3.connect(f"file:{data / 'gateway.db'}?mode=ro", uri=True)
        in_sqlite = ro.execute("SELECT COUNT(*) FROM queue").fetchone()[0]
        ro.close()
        assert in_sqlite < 300  # some acknowledged rows are only in the log
        pub.close()
        assert gw.proc is not None
        gw.proc.kill()
        gw.proc.wait()
        gw.start()
        expected = pub.acked_topics()
        got = drain_keeper(gw, 5, expected)
        assert expected <= got, f"lost {len(expected - got)} acknowledged messages"
    finally:
        gw.stop()


def _row(ref: int, cid: str, mid: int) -> tuple[Any, ...]:
    return (ref, cid, mid, 1, 0, None, None, 0, None, "t", b"x" * (ref % 7), 1, 0, None,
            "p", None, 1.0, None)


def _body(mid: int) -> tuple[Any, ...]:
    return (mid, "t", b"b" * mid, 1, 0, None, "p", None, 1.0, None)


# records over a few refs, bodies and clients, so that adds, removals and updates of the
# same keys meet; refs 1-4, bodies 1-2, session "a" and its subscription "t" are also in
# SQLite before the delta
_refs = st.integers(1, 8)
_cids = st.sampled_from(["a", "b"])
session_records = st.one_of(
    st.tuples(st.just("s"), _cids, st.integers(0, 9), st.none() | st.floats(0, 9), st.floats(0, 9)),
    st.tuples(
        st.just("S"), _cids, st.sampled_from(["t", "u"]), st.integers(0, 2), st.integers(0, 1),
        st.integers(0, 1), st.integers(0, 2), st.none() | st.integers(1, 5),
    ),
    st.tuples(st.just("U"), _cids, st.sampled_from(["t", "u"])),
    st.tuples(st.just("D"), _cids),
)
delta_records = st.lists(
    st.one_of(
        session_records,
        st.builds(_row, _refs, st.sampled_from(["a", "b"]), st.integers(1, 4)),
        _refs,
        st.builds(_body, st.integers(1, 4)),
        st.tuples(st.just("p"), _refs, st.integers(1, 9)),
        st.tuples(st.just("r"), _refs),
        st.tuples(st.just("x"), st.integers(1, 4)),
        st.tuples(st.just("a"), st.sampled_from(["a", "b"]), st.integers(1, 3), st.booleans()),
        st.tuples(st.just("D"), st.sampled_from(["a", "b"])),
    ),
    max_size=30,
)


def _applied(*deltas: Any) -> list[Any]:
    """The tables after applying ``deltas`` in order to a store holding refs 1-4."""
    from gateway.store.db import ensure_schema
    from gateway.store.journal_log import apply_deltas
    from gateway.store.sessions import SCHEMA

    conn = sqlite3.connect(":memory:", isolation_level=None)
    ensure_schema(conn, SCHEMA)
    for ref in range(1, 5):
        conn.execute(f"INSERT INTO queue VALUES ({','.join('?' * 18)})", _row(ref, "a", ref))
    for mid in (1, 2):
        conn.execute(f"INSERT INTO messages VALUES ({','.join('?' * 10)})", _body(mid))
    conn.execute("INSERT INTO awaiting_rel VALUES ('a', 1)")
    conn.execute("INSERT INTO sessions VALUES ('a', 60, NULL, 0.5)")
    conn.execute("INSERT INTO subscriptions VALUES ('a', 't', 1, 0, 0, 0, NULL)")
    apply_deltas(conn, deltas)
    return [
        conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()
        for t in ("queue", "messages", "awaiting_rel", "sessions", "subscriptions")
    ]


@settings(max_examples=300, deadline=None)
@given(st.lists(session_records, max_size=20))
def test_session_records_give_the_tables_their_statements_one_by_one_gave(
    recs: list[Any],
) -> None:
    """A delta of session, subscription and deletion records writes the ``sessions`` and
    ``subscriptions`` tables as running each change's statement in turn did (how they
    were written before they were log records): an existing session keeps its
    ``created_at``."""
    from gateway.store.journal_log import Delta

    delta = Delta()
    delta.apply(recs)
    tables = _applied(delta)[3:]
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute("CREATE TABLE sessions(client_id TEXT PRIMARY KEY, expiry_interval, "
                 "disconnected_at, created_at)")
    conn.execute("CREATE TABLE subscriptions(client_id, filter, qos, no_local, rap, rh, sid, "
                 "PRIMARY KEY (client_id, filter))")
    conn.execute("INSERT INTO sessions VALUES ('a', 60, NULL, 0.5)")
    conn.execute("INSERT INTO subscriptions VALUES ('a', 't', 1, 0, 0, 0, NULL)")
    for r in recs:
        if r[0] == "s":
            conn.execute(
                "INSERT INTO sessions VALUES (?,?,?,?) ON CONFLICT(client_id) DO UPDATE SET "
                "expiry_interval=excluded.expiry_interval, "
                "disconnected_at=excluded.disconnected_at", r[1:])
        elif r[0] == "S":
            conn.execute("INSERT OR REPLACE INTO subscriptions VALUES (?,?,?,?,?,?,?)", r[1:])
        elif r[0] == "U":
            conn.execute("DELETE FROM subscriptions WHERE client_id=? AND filter=?", r[1:])
        else:
            conn.execute("DELETE FROM sessions WHERE client_id=?", r[1:])
            conn.execute("DELETE FROM subscriptions WHERE client_id=?", r[1:])
    expected = [
        conn.execute(f"SELECT * FROM {t} ORDER BY 1, 2").fetchall()
        for t in ("sessions", "subscriptions")
    ]
    assert tables == expected


@settings(max_examples=300, deadline=None)
@given(delta_records)
def test_a_delta_as_records_and_split_into_its_deletions_applies_the_same(
    recs: list[Any],
) -> None:
    """What compaction writes (Delta.records) replays to the same delta, and a deferred
    checkpoint's deletions applied ahead, then the rest, give the same tables."""
    from gateway.store.journal_log import Delta

    whole = Delta()
    whole.apply(recs)
    expected = _applied(whole)
    again = Delta()
    again.apply(whole.records())
    assert _applied(again) == expected
    rest = Delta()
    rest.apply(recs)
    ahead = rest.split_deletions()
    assert not (ahead.rows or ahead.bodies or ahead.pids or ahead.released)
    assert not (rest.gone or rest.bodies_gone or rest.dead)
    assert _applied(ahead, rest) == expected


@pytest.mark.storage
@pytest.mark.skipif(not can_mount(), reason="needs root to mount a file system")
def test_no_room_to_checkpoint_compacts_the_log_and_a_crash_keeps_what_is_pending(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """On a nearly full file system a checkpoint waits (its rows would be written into
    SQLite twice while the log still holds them); once the session drained most of
    them, the log is compacted into a new generation, the old file's space comes back,
    and a crash copy replays to exactly what is still pending."""
    mib = 1024 * 1024

    async def scenario() -> None:
        with sized_tmpfs(tmp_path / "a", 4 * mib):
            db = tmp_path / "a" / "gateway.db"
            node, committer = make_node(db, VirtualScheduler())
            offline_subscriber(node)
            await committed(committer)
            fill(tmp_path / "a" / "filler", leave=1800 * 1024)
            bodies = [bytes([i]) * 32768 for i in range(40)]
            publish(node, *bodies)
            await committed(committer)
            publish(node, b"late")  # a later batch looks at the log's size
            await committed(committer)
            assert sqlite_count(db, "queue") == 0, "checkpointed without room"
            assert "checkpoints deferred" in caplog.text
            held = sum(p.stat().st_size for _, p in log_files(log_dir(db)))
            assert held > mib
            info, h = open_session(node, "s", expiry=3600, rmax=40)
            for d in h.delivered[:34]:
                node.sessions["s"].puback(d.packet_id or 0)
            node.close(info, h, send_will=False)
            await committed(committer)
            free = free_bytes(db.parent)
            store = node.store
            assert store is not None
            assert store._checkpoint_if_room()  # type: ignore[attr-defined]
            await committed(committer)
            assert "journal log: compacted" in caplog.text
            assert free_bytes(db.parent) > free + held // 2
            copy = crash_copy(db.parent, tmp_path / "b")
            node2, committer2 = make_node(copy, VirtualScheduler())
            assert queued(node2) == [*bodies[34:], b"late"]
            committer2.close()
            committer.close()

    with caplog.at_level(logging.WARNING, logger="gateway.store"):
        asyncio.run(scenario())
