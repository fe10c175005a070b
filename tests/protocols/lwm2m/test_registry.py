"""The endpoint registry: commands for a sleeping device outlive its channel and (with the
SQLite journal) a restart; the queue bound; deregistration and lifetime drop them."""

from __future__ import annotations

from pathlib import Path

from gateway.core.clock import VirtualScheduler
from gateway.core.node import CoreSettings, Node
from gateway.store.db import open_db
from gateway.store.lwm2m import Lwm2mStore
from protocols.coap.codec import Code, Message
from protocols.lwm2m import content
from protocols.lwm2m.channel import Lwm2mSettings, State
from protocols.lwm2m.registry import Registry
from tests.gateway.bridge.fakes import ManualCommitter
from tests.protocols.lwm2m.test_channel import LINKS, Device, Mqtt


def _journal(tmp_path: Path) -> tuple[Lwm2mStore, ManualCommitter]:
    db = tmp_path / "gateway.db"
    committer = ManualCommitter(open_db(db))
    return Lwm2mStore(open_db(db), committer), committer


def _register(d: Device, *query: str) -> list[Message]:
    """Register; what the channel sent after the 2.01."""
    d.request(Code.POST, ("rd",), ("ep=dev1", "lt=300", "lwm2m=1.0", "b=UQ", *query), LINKS)
    r, *rest = d.take()
    assert r.code == Code.CREATED
    return rest


def _rows(store: Lwm2mStore) -> list[tuple[int, str]]:
    return list(store.conn.execute("SELECT seq, ep FROM lwm2m_downlink ORDER BY seq"))


def test_waiting_commands_survive_a_restart(tmp_path: Path) -> None:
    clock = VirtualScheduler()
    node = Node(CoreSettings(), clock)
    store, committer = _journal(tmp_path)
    settings = Lwm2mSettings(registry=Registry(store))
    app = Mqtt(node, clock, "dev1")
    d = Device(node, clock, settings)
    _register(d)
    d.advance(60)  # asleep
    app.up()
    app.command(1, "read", path="/3/0/0")
    app.command(2, "execute", path="/3/0/4")
    assert d.take() == []
    committer.commit()
    assert [ep for _, ep in _rows(store)] == ["dev1", "dev1"]
    # gatewayd dies (nothing more is committed); a new one starts from the file
    clock2 = VirtualScheduler(start=clock.time() + 30)
    node2 = Node(CoreSettings(), clock2)
    store2, committer2 = _journal(tmp_path)
    registry = Registry(store2)
    assert registry.restore(store2.load(), clock2.time()) == (1, 2)
    app2 = Mqtt(node2, clock2, "dev1")
    d2 = Device(node2, clock2, Lwm2mSettings(registry=registry))
    d2.request(Code.POST, ("rd", "dev1"), ("lt=300",))  # the device's next update
    changed, get = d2.take()
    assert changed.code == Code.CHANGED and not changed.opt.location_path
    assert get.code == Code.GET and get.opt.uri_path == ("3", "0", "0")
    assert d2.channel.state is State.REGISTERED and "dev1" in node2.sessions
    [(topic, ev)] = app2.up()
    assert topic == "up/update" and ev["data"]["b"] == "UQ"
    d2.reply(get, Code.CONTENT, b"sim", content.TEXT)
    [(topic, resp)] = app2.up()
    assert topic == "up/resp" and resp["reqID"] == 1 and resp["data"]["code"] == "2.05"
    [post] = d2.take()
    assert post.code == Code.POST and post.opt.uri_path == ("3", "0", "4")
    d2.reply(post, Code.CHANGED)
    [(_, resp)] = app2.up()
    assert resp["reqID"] == 2
    committer2.commit()
    assert _rows(store2) == []


def test_takeover_keeps_the_queue_and_resends_the_outstanding_command() -> None:
    clock = VirtualScheduler()
    node = Node(CoreSettings(), clock)
    settings = Lwm2mSettings()
    app = Mqtt(node, clock, "dev1")
    d = Device(node, clock, settings)
    _register(d)
    app.up()
    app.command(1, "read", path="/3/0/0")
    app.command(2, "read", path="/3/0/1")
    [first] = d.take()
    # the device reboots and registers from another address before answering
    d2 = Device(node, clock, settings)
    d2.channel.peer = ("127.0.0.1", 5001)
    [get] = _register(d2)
    assert d.closed is not None
    assert get.opt.uri_path == ("3", "0", "0") and get.token != first.token
    [(_, ev)] = app.up()
    assert ev["msgType"] == "register"  # and no "device gone" answer
    d2.reply(get, Code.CONTENT, b"x", content.TEXT)
    [get2] = d2.take()
    assert get2.opt.uri_path == ("3", "0", "1")


def test_queue_bound_drops_the_oldest_and_counts(tmp_path: Path) -> None:
    clock = VirtualScheduler()
    node = Node(CoreSettings(), clock)
    store, committer = _journal(tmp_path)
    d = Device(node, clock, Lwm2mSettings(max_queue=2, registry=Registry(store)))
    app = Mqtt(node, clock, "dev1")
    _register(d)
    d.advance(60)
    app.up()
    for i in range(3):
        app.command(i, "read", path="/3/0/0")
    [(_, resp)] = app.up()
    assert resp["reqID"] == 0 and resp["data"]["codeMsg"] == "queue full"
    assert node.metrics.get("lwm2m.queue.dropped") == 1
    committer.commit()
    assert len(_rows(store)) == 2


def test_deregistration_and_lifetime_drop_the_queue(tmp_path: Path) -> None:
    clock = VirtualScheduler()
    node = Node(CoreSettings(), clock)
    store, committer = _journal(tmp_path)
    registry = Registry(store)
    d = Device(node, clock, Lwm2mSettings(registry=registry))
    app = Mqtt(node, clock, "dev1")
    _register(d)
    d.advance(60)
    app.up()
    app.command(1, "read", path="/3/0/0")
    d.request(Code.DELETE, ("rd", "dev1"))
    assert d.take()[0].code == Code.DELETED
    [(_, resp)] = app.up()
    assert resp["data"]["codeMsg"] == "device gone"
    committer.commit()
    assert _rows(store) == [] and registry.endpoints == {}
    d2 = Device(node, clock, Lwm2mSettings(registry=registry))
    _register(d2)
    app.up()
    d2.advance(60)
    app.command(2, "read", path="/3/0/0")
    d2.advance(300)
    assert d2.closed == "lifetime expired" and registry.endpoints == {}
    [(_, resp)] = app.up()
    assert resp["reqID"] == 2 and resp["data"]["codeMsg"] == "device gone"
    # an update after that: unknown, the device must register again
    d3 = Device(node, clock, Lwm2mSettings(registry=registry))
    d3.request(Code.POST, ("rd", "dev1"))
    assert d3.take()[0].code == Code.NOT_FOUND


def test_expired_registrations_are_not_restored(tmp_path: Path) -> None:
    store, committer = _journal(tmp_path)
    registry = Registry(store)
    registry.register("old", {"lt": 10}, expires_at=100.0)
    registry.queue("old", b'{"msgType":"read"}', 50.0)
    registry.register("new", {"lt": 10}, expires_at=1000.0)
    committer.commit()
    store2, committer2 = _journal(tmp_path)
    again = Registry(store2)
    assert again.restore(store2.load(), now=500.0) == (1, 0)
    assert set(again.endpoints) == {"new"}
    assert again.queue("new", b"{}", 500.0) == 2  # seq keeps growing
    committer2.commit()
    assert [ep for (ep,) in store2.conn.execute("SELECT ep FROM lwm2m_registrations")] == ["new"]


def test_sweep_forgets_expired_registrations(tmp_path: Path) -> None:
    store, committer = _journal(tmp_path)
    registry = Registry(store)
    registry.register("gone", {}, expires_at=100.0)
    registry.queue("gone", b"{}", 10.0)
    registry.register("here", {}, expires_at=300.0)
    assert registry.sweep(now=200.0) == 1 and set(registry.endpoints) == {"here"}
    committer.commit()
    assert _rows(store) == []
