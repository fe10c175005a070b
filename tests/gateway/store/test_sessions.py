"""The session store against a real SQLite file: journal, group commit, restore."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.core.clock import VirtualScheduler
from gateway.core.node import CoreSettings, Node
from gateway.store.db import ensure_schema, open_db
from gateway.store.sessions import SCHEMA, SessionStore, dump_props, load_props
from gateway.store.writer import GroupCommitter
from protocols.context import ClientInfo, Delivery, Message, SubOptions
from protocols.mqtt.packets import NO_PROPERTIES, Properties


class Handle:
    def __init__(self) -> None:
        self.delivered: list[Delivery] = []
        self.released: list[int] = []

    def deliver(self, deliveries: list[Delivery]) -> None:
        self.delivered.extend(deliveries)

    def release(self, packet_id: int) -> None:
        self.released.append(packet_id)

    def kick(self, reason_code: int) -> None:
        pass


def make_node(path: Path, clock: VirtualScheduler) -> tuple[Node, GroupCommitter]:
    loop = asyncio.get_running_loop()
    reader = open_db(path)
    ensure_schema(reader, SCHEMA)
    committer = GroupCommitter(open_db(path, check_same_thread=False), loop)
    store = SessionStore(reader, committer)
    node = Node(CoreSettings(), clock, store=store)
    node.restore(*store.load())
    return node, committer


async def committed(committer: GroupCommitter) -> None:
    done = asyncio.get_running_loop().create_future()
    committer.after_commit(lambda: done.set_result(None))
    await done


def open_session(node: Node, cid: str, expiry: int, rmax: int = 10) -> tuple[ClientInfo, Handle]:
    info = ClientInfo(client_id=cid, proto_ver=5)
    h = Handle()
    r = node.open_session(
        info, h, clean_start=False, expiry_interval=expiry, receive_maximum=rmax,
        will=None, will_delay=0,
    )
    assert r.session is not None
    r.session.resume()
    return info, h


def test_props_round_trip() -> None:
    p = Properties(
        payload_format_indicator=1,
        message_expiry_interval=30,
        content_type="text/plain",
        response_topic="r/t",
        correlation_data=b"\x00\x01",
        user_properties=(("a", "1"), ("a", "2")),
    )
    assert load_props(dump_props(p)) == p
    assert load_props(dump_props(NO_PROPERTIES)) is NO_PROPERTIES


def test_persistent_session_survives_restart(tmp_path: Path) -> None:
    async def scenario() -> None:
        db = tmp_path / "gateway.db"
        clock = VirtualScheduler()
        node, committer = make_node(db, clock)
        sub, h = open_session(node, "sub", expiry=3600, rmax=2)
        node.subscribe(sub, "t/#", SubOptions(qos=2, subscription_id=7))
        node.subscribe(sub, "$share/g/s", SubOptions(qos=1))
        pub = ClientInfo(client_id="pub")
        for i in range(4):
            node.publish(pub, Message("t/x", b"%d" % i, qos=1 + i % 2, publisher="pub"))
        node.publish(pub, Message("r", b"kept", qos=1, retain=True, publisher="pub"))
        session = node.sessions["sub"]
        # two in flight (window 2), two queued; PUBREC for the QoS 2 one
        inflight = [d for d in h.delivered]
        qos2 = next(d for d in inflight if d.qos == 2)
        assert session.pubrec(qos2.packet_id or 0)
        session.await_rel(42)  # an incoming QoS 2 publish awaiting PUBREL
        node.close(sub, h, send_will=False)
        await committed(committer)
        committer.close()

        node2, committer2 = make_node(db, VirtualScheduler())
        s2 = node2.sessions["sub"]
        assert set(s2.subscriptions) == {"t/#", "$share/g/s"}
        assert s2.subscriptions["t/#"].subscription_id == 7
        assert sorted(s2.inflight) == sorted(d.packet_id for d in inflight)
        assert list(s2.released) == [qos2.packet_id]
        assert [d.message.payload for d in s2.mqueue] == [b"2", b"3"]
        assert 42 in s2.awaiting_rel
        assert node2.retainer.get("r") is not None
        # resume: PUBREL for the released one, DUP re-send of the other, then the queue
        _, h2 = open_session(node2, "sub", expiry=3600, rmax=10)
        assert h2.released == [qos2.packet_id]
        assert [(d.message.payload, d.dup) for d in h2.delivered] == [
            (b"0", True),
            (b"2", False),
            (b"3", False),
        ]
        # the routes came back too
        assert node2.publish(pub, Message("t/y", b"new", qos=1, publisher="pub")) == 1
        committer2.close()

    asyncio.run(scenario())


def test_acknowledged_rows_are_deleted(tmp_path: Path) -> None:
    async def scenario() -> None:
        db = tmp_path / "gateway.db"
        node, committer = make_node(db, VirtualScheduler())
        sub, h = open_session(node, "sub", expiry=60)
        node.subscribe(sub, "t", SubOptions(qos=1))
        node.publish(ClientInfo("p"), Message("t", b"x", qos=1, publisher="p"))
        node.sessions["sub"].puback(h.delivered[0].packet_id or 0)
        await committed(committer)
        rows = open_db(db).execute("SELECT COUNT(*) FROM queue").fetchone()[0]
        assert rows == 0
        committer.close()

    asyncio.run(scenario())


def test_clean_session_is_not_persisted_and_expired_session_is_deleted(tmp_path: Path) -> None:
    async def scenario() -> None:
        db = tmp_path / "gateway.db"
        clock = VirtualScheduler()
        node, committer = make_node(db, clock)
        a, _ = open_session(node, "mem", expiry=0)
        node.subscribe(a, "t", SubOptions(qos=1))
        b, hb = open_session(node, "short", expiry=5)
        node.subscribe(b, "t", SubOptions(qos=1))
        node.close(b, hb, send_will=False)
        await committed(committer)
        conn = open_db(db)
        # sessions are journal log records until a checkpoint takes them into SQLite
        assert conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 0
        assert node.store is not None
        node.store.checkpoint()
        await committed(committer)
        assert [r[0] for r in conn.execute("SELECT client_id FROM sessions")] == ["short"]
        assert conn.execute("SELECT client_id, filter FROM subscriptions").fetchall() == [
            ("short", "t")
        ]
        clock.advance(6)
        await committed(committer)
        node.store.checkpoint()
        await committed(committer)
        assert conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 0
        assert conn.execute("SELECT COUNT(*) FROM subscriptions").fetchone()[0] == 0
        committer.close()

    asyncio.run(scenario())


def test_after_commit_waits_for_earlier_writes(tmp_path: Path) -> None:
    async def scenario() -> None:
        db = tmp_path / "gateway.db"
        conn = open_db(db)
        ensure_schema(conn, SCHEMA)
        committer = GroupCommitter(open_db(db, check_same_thread=False), asyncio.get_running_loop())
        seen: list[int] = []
        committer.add("INSERT INTO retained(topic, payload, qos) VALUES ('a', x'00', 0)")
        assert committer.dirty

        def check() -> None:
            seen.append(conn.execute("SELECT COUNT(*) FROM retained").fetchone()[0])

        committer.after_commit(check)
        await committed(committer)
        assert seen == [1] and not committer.dirty
        immediate: list[bool] = []
        committer.after_commit(lambda: immediate.append(True))
        assert immediate == [True]  # nothing pending: runs at once
        committer.close()

    asyncio.run(scenario())
