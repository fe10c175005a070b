"""The replicated tables without processes: the hybrid logical clock, last-writer-wins
merge against a model (any order, any repeats, every replica ends equal), the database
adapters' round trip, and the Raft transport's allow-list unpickler refusing a crafted
pickle from an authenticated peer."""

from __future__ import annotations

import asyncio
import logging
import pickle
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.cluster.tables import Hlc, Table
from gateway.store.banned import BannedStore
from gateway.store.db import open_db
from gateway.store.extensions import AutoSubscribeEntry, AutoSubscribeStore
from gateway.store.replicated import AutoSubscribeRows, BannedRows, RuleRows, TableMeta, UserRows
from gateway.store.users import UserStore


class DictTable(Table):
    name = "t"

    def __init__(self) -> None:
        super().__init__()
        self.data: dict[str, Any] = {}

    def value(self, key: str) -> Any:
        return self.data.get(key)

    def apply(self, key: str, value: Any) -> None:
        if value is None:
            self.data.pop(key, None)
        else:
            self.data[key] = value


def test_hlc_is_monotonic_and_follows_a_faster_peer() -> None:
    t = [1000.0]
    clock = Hlc("a", lambda: t[0])
    s1 = clock.tick()
    s2 = clock.tick()  # same millisecond: the counter moves
    assert s2 > s1 and s2[0] == s1[0]
    clock.observe((5_000_000, 7, "b"))  # a peer ahead of our wall clock
    s3 = clock.tick()
    assert s3 > (5_000_000, 7, "b")
    t[0] = 10_000.0
    assert clock.tick() > s3


writes = st.lists(st.tuples(st.integers(0, 2), st.sampled_from("xyz"),
                            st.one_of(st.none(), st.integers(0, 9))), max_size=20)


@given(writes, st.randoms(use_true_random=False))
@settings(max_examples=200, deadline=None)
def test_lww_replicas_converge_whatever_the_order(ops: list[tuple[int, str, int | None]],
                                                   rnd: Any) -> None:
    """Three replicas write on their own (a partition), then receive every row of the
    others in a random order, some twice: all three end with the same table, and it is
    the model's (for each key, the value of the greatest stamp)."""
    t = [0.0]
    clocks = [Hlc(n, lambda: t[0]) for n in "abc"]
    tables = [DictTable() for _ in range(3)]
    sent: list[tuple[str, tuple[int, int, str], Any]] = []
    for i, (node, key, value) in enumerate(ops):
        t[0] = (i % 4) / 1000  # clocks that tie often
        stamp = clocks[node].tick()
        v = None if value is None else {"v": value}
        tables[node].apply(key, v)
        tables[node].record(key, stamp, v is not None)
        sent.append((key, stamp, v))
    model: dict[str, tuple[tuple[int, int, str], Any]] = {}
    for key, stamp, v in sent:
        if key not in model or stamp > model[key][0]:
            model[key] = (stamp, v)
    for table in tables:
        rows = sent + rnd.sample(sent, len(sent) // 2)
        rnd.shuffle(rows)
        for key, stamp, v in rows:
            table.merge(key, stamp, v)
    expected = {k: v for k, (_, v) in model.items() if v is not None}
    for table in tables:
        assert table.data == expected
        assert {k: table.stamp(k) for k in model} == {k: s for k, (s, _) in model.items()}


def test_a_broken_merge_is_caught() -> None:
    """The model check above fails for a merge that lets an older row win."""
    class Broken(DictTable):
        def merge(self, key: str, stamp: Any, value: Any) -> bool:
            self.apply(key, value)
            self.record(key, stamp, value is not None)
            return True

    a, b = Broken(), Broken()
    rows = [("x", (1, 0, "a"), {"v": 1}), ("x", (2, 0, "b"), {"v": 2})]
    for key, stamp, v in rows:
        a.merge(key, stamp, v)
    for key, stamp, v in reversed(rows):
        b.merge(key, stamp, v)
    assert a.data != b.data


def test_adapters_round_trip(tmp_path: Path) -> None:
    """What one node's adapter reads, another's writes back identically (bans, users with
    their SCRAM credential and rules, run-time rules)."""
    src, dst = open_db(tmp_path / "a.db"), open_db(tmp_path / "b.db")
    bans = BannedStore(src)
    bans.add("clientid", "bad", reason="test", duration=60)
    users = UserStore(src)
    users.add("alice", "secret", iterations=4096)
    users.add_rule("alice", "allow", "publish", "a/#")
    users.add_rule("bob", "deny", "all", "#")  # rules only (an HTTP-authenticated user)
    AutoSubscribeStore(src).put(AutoSubscribeEntry("dev/1", "cmd/${clientid}", qos=1, nl=1))
    for rows_a, rows_b in ((BannedRows(src), BannedRows(dst)), (UserRows(src), UserRows(dst)),
                           (AutoSubscribeRows(src), AutoSubscribeRows(dst))):
        for key, value in rows_a.read().items():
            rows_b.check(key, value)
            rows_b.write(key, value)
        assert rows_b.read() == rows_a.read()
    copy = UserStore(dst)
    alice = copy.get("alice")
    assert alice is not None and [r.topic for r in copy.rules("alice")] == ["a/#"]
    assert BannedStore(dst).get("clientid", "bad") is not None
    assert AutoSubscribeStore(dst).for_client("dev/1")[0].nl == 1
    UserRows(dst).write("alice", None)
    assert "alice" not in UserRows(dst).read()
    rules = RuleRows(tmp_path / "rules.db")
    assert rules.read() == {}
    rules.write("r1", {"spec": {"sql": "SELECT * FROM \"t\""}})
    rules.write("r2", None)  # a deleted rule: a tombstone row
    assert rules.read() == {"r1": {"spec": {"sql": "SELECT * FROM \"t\""}},
                            "r2": {"spec": None}}
    meta = TableMeta(src)
    meta.save("banned", "clientid/bad", (5, 1, "a"), {"x": 1})
    meta.save("banned", "clientid/gone", (6, 0, "b"), None)
    loaded = meta.load("banned")
    assert loaded["clientid/bad"][0] == (5, 1, "a") and loaded["clientid/gone"][1] is None


@pytest.mark.parametrize("row", [
    ["nokind", {"reason": "", "by": "", "at": 1, "until": None}],
    ["clientid/x", {"reason": 1, "by": "", "at": 1, "until": None}],
])
def test_bad_ban_rows_are_refused(tmp_path: Path, row: list[Any]) -> None:
    with pytest.raises(ValueError):
        BannedRows(open_db(tmp_path / "a.db")).check(row[0], row[1])


def test_bad_auto_subscribe_rows_are_refused(tmp_path: Path) -> None:
    rows = AutoSubscribeRows(open_db(tmp_path / "a.db"))
    with pytest.raises(ValueError):
        rows.check("not json", None)
    with pytest.raises(ValueError):
        rows.check('["c", "t"]', {"qos": 3, "rh": 0, "rap": 0, "nl": 0})


def test_bad_user_rows_are_refused(tmp_path: Path) -> None:
    rows = UserRows(open_db(tmp_path / "a.db"))
    with pytest.raises(ValueError):
        rows.check("u", {"cred": None, "rules": [["maybe", "publish", "#"]]})
    with pytest.raises(ValueError):
        rows.check("u", {"cred": {"salt": "zz"}, "rules": []})


class _Evil:
    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def test_a_crafted_raft_pickle_from_a_peer_is_refused(tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    """A RAFT frame from an authenticated member whose pickle names a callable (here
    ``open``, which would create a file) is dropped and logged; so is a log entry
    pysyncobj itself would unpickle; plain Raft messages still pass."""
    import pysyncobj.pickle as pp  # type: ignore[import-untyped]

    from gateway.cluster.raft import RaftGroup, safe_loads
    from gateway.cluster.takeover import SessionRegistry  # noqa: F401 - a cluster import

    marker = tmp_path / "pwned"
    crafted = pickle.dumps({"type": "request_vote", "x": _Evil(str(marker))})

    async def main() -> None:
        group = RaftGroup("a@x", ["b@x"], lambda _n, _p: True, [])
        group.transport.received("b@x", crafted)
        group.transport.received("b@x", pickle.dumps(_Evil(str(marker))))
        group.sync.destroy()

    with caplog.at_level(logging.WARNING, logger="gateway.cluster"):
        asyncio.run(main())
    assert not marker.exists()
    assert "refused a Raft message from b@x" in caplog.text
    with pytest.raises(pickle.UnpicklingError):
        pp.loads(pickle.dumps(_Evil(str(marker)), protocol=2))
    assert not marker.exists()
    # what pysyncobj really sends still loads (protocol 2 bytes, sets, its Node objects)
    from pysyncobj.node import Node as RaftNode  # type: ignore[import-untyped]
    ok = {"type": "append_entries", "entries": [(b"\x01cmd", 3, 1)], "s": {1, 2},
          "node": RaftNode("c@x")}
    assert safe_loads(pp.dumps(ok))["entries"] == [(b"\x01cmd", 3, 1)]
    assert safe_loads(pickle.dumps(ok, protocol=5))["node"].id == "c@x"


def test_sqlite_meta_survives_a_reopen(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "m.db")
    TableMeta(conn).save("users", "u", (1, 2, "n"), {"a": 1})
    conn.commit()
    conn.close()
    assert TableMeta(sqlite3.connect(tmp_path / "m.db")).load("users")["u"][0] == (1, 2, "n")


def test_db_tables_find_each_change_once_and_keep_stamps_across_a_restart(tmp_path: Path
                                                                         ) -> None:
    """A ban added (as by gatewayctl) is one local change, found once; a node restarted
    with the same database re-announces nothing; a rule row that vanishes becomes one
    tombstone row (written back), not a change at every look."""
    from gateway.cluster.tables import DbTable

    conn = open_db(tmp_path / "gateway.db")
    meta = TableMeta(conn)
    clock = Hlc("a")
    bans = DbTable(BannedRows(conn), meta)
    assert bans.load(clock) == []
    BannedStore(conn).add("clientid", "x")
    assert len(bans.poll(clock)) == 1
    assert bans.poll(clock) == []
    again = DbTable(BannedRows(conn), meta)
    assert again.load(Hlc("a")) == [] and again.stamp("clientid/x") == bans.stamp("clientid/x")
    rules_path = tmp_path / "rules.db"
    rules = DbTable(RuleRows(rules_path), meta, deleted={"spec": None})
    RuleRows(rules_path).write("r1", {"spec": {"sql": "x"}})
    assert len(rules.poll(clock)) == 1
    sqlite3.connect(rules_path, isolation_level=None).execute("DELETE FROM rules")
    assert [row[2] for row in rules.poll(clock)] == [{"spec": None}]
    assert rules.poll(clock) == []


def test_table_frames_stay_small_whatever_the_payloads() -> None:
    """Rows are cut by count and by payload size, so a snapshot of large retained
    messages never makes a frame the receiver must refuse; every row is sent once."""
    from gateway.cluster.tables import CHUNK, CHUNK_BYTES, chunks

    big = {"m": "x" * (CHUNK_BYTES // 3)}
    rows = [[f"t/{i}", [i, 0, "a"], big if i % 2 else {"m": "y"}] for i in range(40)]
    rows += [[f"d/{i}", [i, 0, "a"], None] for i in range(2 * CHUNK)]
    parts = chunks(rows)
    assert [r for p in parts for r in p] == rows
    for p in parts:
        assert len(p) <= CHUNK
        size = sum(len(r[2]["m"]) for r in p if r[2] is not None)
        assert size <= CHUNK_BYTES or len(p) == 1
    assert chunks([]) == []


def test_a_late_retained_forward_never_undoes_a_newer_row() -> None:
    """The ordering the netns test once hit: B wrote "b" (newer) while A's older "a"
    waited in A's durable outbox; after the heal A's DATA forward arrives before A's
    table snapshot. From a peer that sends tables it is not kept; from one without, it is
    kept but never stamped as B's own write (so it cannot spread as the newest)."""
    from gateway.cluster.tables import TableSync
    from gateway.core.retainer import Retainer
    from protocols.context import Message

    retainer = Retainer(now=lambda: 0.0)
    sent: list[bytes] = []
    sync = TableSync("b", lambda _p, f: bool(sent.append(f)), lambda: ["a"])
    table = sync.add_retained(retainer)
    retainer.on_publish(Message("cfg/x", b"b", 1, True, timestamp=2.0))  # B's own write
    newer = table.stamp("cfg/x")
    assert newer is not None and table.local_changes == 1
    with sync.injecting(True):
        retainer.on_publish(Message("cfg/x", b"a", 1, True, timestamp=1.0))
    assert retainer.get("cfg/x").payload == b"b"  # type: ignore[union-attr]
    with sync.injecting(False):
        retainer.on_publish(Message("cfg/x", b"a", 1, True, timestamp=1.0))
    assert retainer.get("cfg/x").payload == b"a"  # type: ignore[union-attr]
    assert table.stamp("cfg/x") == newer and table.local_changes == 1  # not a local write
    assert not retainer.paused and not table.applying
    # A's snapshot row (older) is ignored; a newer one from A wins
    assert not table.merge("cfg/x", (newer[0] - 1, 0, "a"), {"m": "unused"})


def test_retained_stamps_and_tombstones_survive_a_restart(tmp_path: Path) -> None:
    """With the meta table, a restored retained message keeps the stamp it had (not its
    publish time) and a deletion stays a tombstone, so after a restart an older row from
    a peer still loses to both; a message changed behind the table's back (another
    digest) falls back to its publish time."""
    from gateway.cluster.tables import TableSync
    from gateway.core.retainer import Retainer
    from protocols.context import Message

    def node() -> tuple[Retainer, TableSync, Any]:
        retainer = Retainer(now=lambda: 0.0)
        sync = TableSync("b", lambda _p, _f: True, lambda: [])
        return retainer, sync, TableMeta(sqlite3.connect(tmp_path / "m.db"))

    retainer, sync, meta = node()
    table = sync.add_retained(retainer, meta)
    retainer.on_publish(Message("cfg/x", b"x", 1, True, timestamp=1.0))
    retainer.on_publish(Message("cfg/y", b"y", 1, True, timestamp=1.0))
    retainer.on_publish(Message("cfg/y", b"", 1, True, timestamp=1.0))  # deleted
    merged = (10**13, 0, "a")  # a peer's row, far newer than the publish times
    assert table.merge("cfg/z", merged, _encoded(Message("cfg/z", b"z", 1, True,
                                                         timestamp=1.0)))
    x, y = table.stamp("cfg/x"), table.stamp("cfg/y")
    assert x is not None and y is not None and x[0] > 1000  # HLC stamps, not publish times
    sync.stop()  # flushes
    # the restart: the retainer restores its messages (not through on_change)
    restored = [retainer.get("cfg/x"), retainer.get("cfg/z")]
    retainer2, sync2, meta2 = node()
    for m in restored:
        assert m is not None
        retainer2.store(m, journal=False)
    retainer2.store(Message("cfg/w", b"w", 1, True, timestamp=3.0), journal=False)
    table2 = sync2.add_retained(retainer2, meta2)
    assert table2.stamp("cfg/x") == x
    assert table2.stamp("cfg/z") == merged
    assert table2.stamp("cfg/y") == y and "cfg/y" in table2.dead
    assert table2.stamp("cfg/w") == (3000, 0, "")
    assert not table2.merge("cfg/y", (y[0] - 1, 0, "a"), {"m": "unused"})


def _encoded(m: Any) -> Any:
    from gateway.cluster.tables import encode

    return encode(m)


def test_delayed_rows_taken_over_once_cancelled_at_the_origin() -> None:
    """The delayed table: a row of an unreachable origin is taken over by the first core
    by name only; the origin's own row tombstoned by a peer is cancelled there (and not
    echoed as a local change)."""
    import asyncio

    from gateway.cluster.delayed import DelayedTable
    from gateway.cluster.tables import TableSync
    from protocols.context import Message

    class Publisher:
        def __init__(self) -> None:
            self.pending: dict[int, Any] = {}
            self.published: list[Message] = []
            self.on_change: Any = None

        def cancel(self, id_: int) -> bool:
            return self.pending.pop(id_, None) is not None

        def hold(self) -> None: ...
        def release(self) -> None: ...

        def publish_for(self, due: float, m: Message) -> None:
            self.published.append(m)

    async def main() -> None:
        from gateway.ext.delayed import Pending

        def make(me: str, up: list[str]) -> tuple[DelayedTable, Publisher, TableSync]:
            sync = TableSync(me, lambda _p, _f: True, lambda: [])
            pub = Publisher()
            t = DelayedTable(me, sync, cores_up=lambda: up, cores_known=lambda: up,
                             origin_up=lambda _n: False, grace=0.0)
            sync.tables[t.name] = t
            t.attach(pub)  # type: ignore[arg-type]
            return t, pub, sync

        m = Message("t", b"p", 1, False, timestamp=1.0)
        key = "a@x/1/1000"
        row = {"m": _delayed_value(m), "due": 0.0, "origin": "a@x"}
        b, pub_b, _ = make("b@x", ["c@x"])
        c, pub_c, _ = make("c@x", ["b@x"])
        for t in (b, c):
            assert t.merge(key, (1000, 0, "a@x"), row)
        b._check()
        c._check()
        assert len(pub_b.published) == 1 and pub_c.published == []  # b is first by name
        assert key in b.dead and b.local_changes == 1
        # the origin back: b's tombstone cancels its restored message, no echo
        a, pub_a, _ = make("a@x", [])
        pub_a.pending[1] = Pending(1, 0.0, m)
        a._own(pub_a.pending[1])
        stamp = b.stamp(key)
        assert stamp is not None and a.merge(key, stamp, None)
        assert pub_a.pending == {} and a.local_changes == 0

    asyncio.run(main())


def _delayed_value(m: Any) -> str:
    import base64

    from gateway.cluster import frames as F

    return base64.b64encode(F.encode_message(m)).decode()
