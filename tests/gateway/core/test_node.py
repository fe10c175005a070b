"""The core without sockets: Node + sessions + broker, on a virtual clock."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gateway.core.clock import VirtualScheduler
from gateway.core.node import CoreSettings, Node
from protocols.context import ClientInfo, Delivery, Message, SubOptions


@dataclass
class FakeHandle:
    delivered: list[Delivery] = field(default_factory=list)
    released: list[int] = field(default_factory=list)
    kicked: list[int] = field(default_factory=list)

    def deliver(self, deliveries: list[Delivery]) -> None:
        self.delivered.extend(deliveries)

    def release(self, packet_id: int) -> None:
        self.released.append(packet_id)

    def kick(self, reason_code: int) -> None:
        self.kicked.append(reason_code)

    def topics(self) -> list[str]:
        return [d.message.topic for d in self.delivered]


@pytest.fixture
def clock() -> VirtualScheduler:
    return VirtualScheduler()


@pytest.fixture
def node(clock: VirtualScheduler) -> Node:
    return Node(CoreSettings(), clock)


def connect(
    node: Node,
    cid: str,
    *,
    clean: bool = True,
    expiry: int = 0,
    rmax: int = 65535,
    will: Message | None = None,
    will_delay: int = 0,
) -> tuple[ClientInfo, FakeHandle, bool]:
    info = ClientInfo(client_id=cid, proto_ver=5)
    h = FakeHandle()
    r = node.open_session(
        info,
        h,
        clean_start=clean,
        expiry_interval=expiry,
        receive_maximum=rmax,
        will=will,
        will_delay=will_delay,
    )
    assert r.reason_code == 0 and r.session is not None
    r.session.resume()
    return info, h, r.session_present


def msg(
    topic: str, payload: bytes = b"x", qos: int = 1, retain: bool = False, publisher: str = "pub"
) -> Message:
    return Message(topic, payload, qos, retain, publisher=publisher)


def test_route_to_matching_subscribers(node: Node) -> None:
    a, ha, _ = connect(node, "a")
    b, hb, _ = connect(node, "b")
    node.subscribe(a, "s/+", SubOptions(qos=1))
    node.subscribe(b, "s/x/#", SubOptions(qos=0))
    assert node.publish(a, msg("s/x")) == 2
    assert ha.topics() == ["s/x"] and hb.topics() == ["s/x"]
    assert ha.delivered[0].qos == 1 and hb.delivered[0].qos == 0
    assert node.publish(a, msg("other")) == 0
    assert node.metrics.get("messages.dropped.no_subscribers") == 1


def test_overlapping_subscriptions_give_one_copy_at_highest_qos(node: Node) -> None:
    a, ha, _ = connect(node, "a")
    node.subscribe(a, "t/#", SubOptions(qos=0, subscription_id=1))
    node.subscribe(a, "t/+", SubOptions(qos=2, subscription_id=2))
    node.subscribe(a, "t/x", SubOptions(qos=1))
    node.publish(a, msg("t/x", qos=2))
    assert len(ha.delivered) == 1
    d = ha.delivered[0]
    assert d.qos == 2 and sorted(d.subscription_ids) == [1, 2]


def test_no_local(node: Node) -> None:
    a, ha, _ = connect(node, "a")
    node.subscribe(a, "t", SubOptions(qos=1, no_local=True))
    node.publish(a, msg("t", publisher="a"))
    assert ha.delivered == []
    node.publish(a, msg("t", publisher="other"))
    assert len(ha.delivered) == 1


def test_dollar_topics_not_matched_by_leading_wildcard(node: Node) -> None:
    a, ha, _ = connect(node, "a")
    node.subscribe(a, "#", SubOptions())
    node.subscribe(a, "+/x", SubOptions())
    node.publish(a, msg("$SYS/x"))
    assert ha.delivered == []


def test_inflight_window_then_drain_on_ack(node: Node) -> None:
    a, ha, _ = connect(node, "a", rmax=2)
    node.subscribe(a, "t", SubOptions(qos=1))
    for i in range(5):
        node.publish(a, msg("t", str(i).encode()))
    assert [d.message.payload for d in ha.delivered] == [b"0", b"1"]
    session = node.sessions["a"]
    assert len(session.mqueue) == 3
    session.puback(ha.delivered[0].packet_id or 0)
    assert [d.message.payload for d in ha.delivered] == [b"0", b"1", b"2"]
    pids = [d.packet_id for d in ha.delivered]
    assert len(set(pids)) == 3


def test_qos2_outgoing_release_and_complete(node: Node) -> None:
    a, ha, _ = connect(node, "a", rmax=1)
    node.subscribe(a, "t", SubOptions(qos=2))
    node.publish(a, msg("t", b"1", qos=2))
    node.publish(a, msg("t", b"2", qos=2))
    s = node.sessions["a"]
    pid = ha.delivered[0].packet_id or 0
    assert s.pubrec(pid) and len(ha.delivered) == 1
    assert s.pubcomp(pid) and [d.message.payload for d in ha.delivered] == [b"1", b"2"]
    assert not s.pubcomp(pid)


def test_persistent_session_queues_offline_and_redelivers_with_dup(node: Node) -> None:
    a, ha, _ = connect(node, "a", clean=False, expiry=100)
    node.subscribe(a, "t", SubOptions(qos=1))
    node.publish(a, msg("t", b"inflight"))
    node.close(a, ha, send_will=False)
    node.publish(a, msg("t", b"queued"))
    node.publish(a, msg("t", b"q0", qos=0))
    _, hb, present = connect(node, "a", clean=False, expiry=100)
    assert present
    assert [(d.message.payload, d.dup) for d in hb.delivered] == [
        (b"inflight", True),
        (b"queued", False),
        (b"q0", False),
    ]


def test_session_expires_on_virtual_clock(node: Node, clock: VirtualScheduler) -> None:
    a, ha, _ = connect(node, "a", clean=False, expiry=10)
    node.subscribe(a, "t", SubOptions(qos=1))
    node.close(a, ha, send_will=False)
    clock.advance(9)
    assert "a" in node.sessions
    clock.advance(2)
    assert "a" not in node.sessions
    assert node.publish(a, msg("t")) == 0


def test_clean_start_discards_session(node: Node) -> None:
    a, ha, _ = connect(node, "a", clean=False, expiry=100)
    node.subscribe(a, "t", SubOptions(qos=1))
    node.close(a, ha, send_will=False)
    _, _, present = connect(node, "a", clean=True)
    assert not present
    assert node.publish(a, msg("t")) == 0


def test_connack_may_go_early_unless_a_session_was_discarded_or_clustered(node: Node) -> None:
    def early(cid: str, *, clean: bool) -> bool:
        info = ClientInfo(client_id=cid, proto_ver=5)
        r = node.open_session(info, FakeHandle(), clean_start=clean, expiry_interval=100,
                              receive_maximum=10, will=None, will_delay=0)
        assert r.session is not None
        node.close(info, node.sessions[cid].handle, send_will=False)  # type: ignore[arg-type]
        return r.connack_early

    assert early("a", clean=False)  # new: lost in a crash = no session, what it was told
    assert early("a", clean=False)  # resumed: lost = the session as it was
    assert early("b", clean=True)  # a clean start with nothing to discard
    assert not early("a", clean=True)  # discarded a session: that must be on disk first

    class Cluster:  # no session elsewhere, but one may move in from another node
        def takeover(self, client: ClientInfo, clean_start: bool) -> bool:
            return False

        def session_ended(self, *args: object) -> None:
            pass

    node.cluster = Cluster()
    assert not early("c", clean=False)


def test_takeover_kicks_old_connection_and_keeps_session(node: Node) -> None:
    a, ha, _ = connect(node, "a", clean=False, expiry=100)
    node.subscribe(a, "t", SubOptions(qos=1))
    node.publish(a, msg("t", b"unacked"))
    _, hb, present = connect(node, "a", clean=False, expiry=100)
    assert ha.kicked == [0x8E] and present
    assert [(d.message.payload, d.dup) for d in hb.delivered] == [(b"unacked", True)]
    # the old connection's close afterwards must not disturb the new owner
    node.close(a, ha, send_will=True)
    assert node.sessions["a"].handle is hb


def test_will_on_abnormal_close_not_on_normal(node: Node) -> None:
    w, hw, _ = connect(node, "watcher")
    node.subscribe(w, "will/#", SubOptions(qos=1))
    a, ha, _ = connect(node, "a", will=msg("will/a", publisher="a"))
    node.close(a, ha, send_will=True)
    b, hb, _ = connect(node, "b", will=msg("will/b", publisher="b"))
    node.close(b, hb, send_will=False)
    assert hw.topics() == ["will/a"]


def test_will_delay_and_cancel_on_resume(node: Node, clock: VirtualScheduler) -> None:
    w, hw, _ = connect(node, "watcher")
    node.subscribe(w, "will/#", SubOptions(qos=1))
    a, ha, _ = connect(node, "a", clean=False, expiry=100, will=msg("will/a"), will_delay=5)
    node.close(a, ha, send_will=True)
    clock.advance(3)
    connect(node, "a", clean=False, expiry=100)
    clock.advance(10)
    assert hw.topics() == []
    b, hb, _ = connect(node, "b", clean=False, expiry=100, will=msg("will/b"), will_delay=5)
    node.close(b, hb, send_will=True)
    clock.advance(4.9)
    assert hw.topics() == []
    clock.advance(0.2)
    assert hw.topics() == ["will/b"]


def test_will_at_session_end_when_expiry_shorter_than_delay(
    node: Node, clock: VirtualScheduler
) -> None:
    w, hw, _ = connect(node, "watcher")
    node.subscribe(w, "will/#", SubOptions(qos=1))
    a, ha, _ = connect(node, "a", clean=False, expiry=2, will=msg("will/a"), will_delay=60)
    node.close(a, ha, send_will=True)
    clock.advance(2.5)
    assert hw.topics() == ["will/a"]


def test_retained_store_match_delete(node: Node) -> None:
    a, ha, _ = connect(node, "a")
    node.publish(a, msg("r/1", b"one", retain=True))
    node.publish(a, msg("r/2", b"two", retain=True))
    node.subscribe(a, "r/+", SubOptions(qos=1))
    node.deliver_retained(a, "r/+", SubOptions(qos=1), existed=False)
    assert sorted(d.message.payload for d in ha.delivered) == [b"one", b"two"]
    assert all(d.retain for d in ha.delivered)
    node.publish(a, msg("r/1", b"", retain=True))
    assert len(node.retainer) == 1


def test_retain_handling(node: Node) -> None:
    a, ha, _ = connect(node, "a")
    node.publish(a, msg("r", b"v", retain=True))
    node.deliver_retained(a, "r", SubOptions(retain_handling=2), existed=False)
    node.deliver_retained(a, "r", SubOptions(retain_handling=1), existed=True)
    assert ha.delivered == []
    node.deliver_retained(a, "r", SubOptions(retain_handling=1), existed=False)
    assert len(ha.delivered) == 1


def test_queue_overflow_drop_oldest_is_counted(clock: VirtualScheduler) -> None:
    node = Node(CoreSettings(max_mqueue_len=2), clock)
    a, ha, _ = connect(node, "a", clean=False, expiry=100)
    node.subscribe(a, "t", SubOptions(qos=1))
    node.close(a, ha, send_will=False)
    for i in range(4):
        node.publish(a, msg("t", str(i).encode()))
    assert node.metrics.get("messages.dropped.queue_full") == 2
    _, hb, _ = connect(node, "a", clean=False, expiry=100)
    assert [d.message.payload for d in hb.delivered] == [b"2", b"3"]


def test_expired_message_not_delivered_from_queue(node: Node, clock: VirtualScheduler) -> None:
    a, ha, _ = connect(node, "a", clean=False, expiry=100)
    node.subscribe(a, "t", SubOptions(qos=1))
    node.close(a, ha, send_will=False)
    m = msg("t", b"short")
    m.expires_at = clock.time() + 5
    node.publish(a, m)
    node.publish(a, msg("t", b"long"))
    clock.advance(6)
    _, hb, _ = connect(node, "a", clean=False, expiry=100)
    assert [d.message.payload for d in hb.delivered] == [b"long"]
    assert node.metrics.get("messages.dropped.expired") == 1


def test_shared_round_robin_and_offline_member_fallback(node: Node) -> None:
    a, ha, _ = connect(node, "a")
    b, hb, _ = connect(node, "b")
    node.subscribe(a, "$share/g/t", SubOptions(qos=1))
    node.subscribe(b, "$share/g/t", SubOptions(qos=1))
    for i in range(4):
        node.publish(a, msg("t", str(i).encode()))
    assert len(ha.delivered) == 2 and len(hb.delivered) == 2


def test_shared_member_leaving_redispatches_unacked(node: Node) -> None:
    a, ha, _ = connect(node, "a")
    b, hb, _ = connect(node, "b")
    node.subscribe(a, "$share/g/t", SubOptions(qos=1))
    node.subscribe(b, "$share/g/t", SubOptions(qos=1))
    for i in range(4):
        node.publish(a, msg("t", str(i).encode()))
    node.close(a, ha, send_will=False)  # a leaves with 2 unacknowledged messages
    assert sorted(d.message.payload for d in hb.delivered) == [b"0", b"1", b"2", b"3"]
    assert node.metrics.get("messages.shared.redispatched") == 2


def test_queue_shared_subscription(node: Node) -> None:
    a, ha, _ = connect(node, "a")
    b, hb, _ = connect(node, "b")
    node.subscribe(a, "$queue/q", SubOptions(qos=0))
    node.subscribe(b, "$queue/q", SubOptions(qos=0))
    for _ in range(10):
        node.publish(a, msg("q", qos=0))
    assert len(ha.delivered) + len(hb.delivered) == 10


def test_unsubscribe(node: Node) -> None:
    a, ha, _ = connect(node, "a")
    node.subscribe(a, "t", SubOptions())
    assert node.unsubscribe(a, "t")
    assert not node.unsubscribe(a, "t")
    node.publish(a, msg("t"))
    assert ha.delivered == []
    assert len(node.broker.index) == 0


# -- idle memory: per-session state made on first use -----------------------------------


def test_idle_sessions_share_one_read_only_empty_dict(node: Node) -> None:
    _, _, _ = connect(node, "a")
    _, _, _ = connect(node, "b")
    a, b = node.sessions["a"], node.sessions["b"]
    shared = a.subscriptions
    assert a.inflight is shared and a.released is shared and a.awaiting_rel is shared
    assert b.subscriptions is shared
    with pytest.raises(RuntimeError):
        a.subscriptions["x"] = SubOptions(1)
    assert a.inflight.pop(1, None) is None and not shared  # reading works as on {}


def test_first_write_gives_a_session_its_own_dicts(node: Node) -> None:
    info, h, _ = connect(node, "sub", clean=False, expiry=60)
    connect(node, "other")
    node.subscribe(info, "t/#", SubOptions(1))
    node.publish(ClientInfo("pub"), msg("t/1", qos=1))
    s, other = node.sessions["sub"], node.sessions["other"]
    assert list(s.subscriptions) == ["t/#"] and len(s.inflight) == 1
    assert not other.subscriptions and not other.inflight
    assert s.subscriptions is not other.subscriptions
    d = h.delivered[0]
    assert d.packet_id is not None and s.puback(d.packet_id) and not s.inflight


def test_only_publish_decisions_are_cached(node: Node) -> None:
    info, _, _ = connect(node, "c")
    assert node.authorize(info, "subscribe", "a/b")
    assert info.authz_cache is None  # an idle subscribed client keeps no cache
    assert node.authorize(info, "publish", "a/b")
    assert info.authz_cache is not None and list(info.authz_cache) == ["a/b"]


def test_client_attrs_shared_until_set() -> None:
    a, b = ClientInfo("a"), ClientInfo("b")
    assert a.attrs is b.attrs and not a.attrs
    with pytest.raises(RuntimeError):
        a.attrs["x"] = 1
    a.set_attr("authn", "builtin_db")
    assert a.attrs == {"authn": "builtin_db"} and not b.attrs


class AddressedHandle(FakeHandle):
    """A handle that knows its local address (a stream shell's ``sockname``)."""

    def __init__(self) -> None:
        super().__init__()
        self.looked_up = 0

    def sockname(self) -> str:
        self.looked_up += 1
        return "127.0.0.1:1883"


def test_sockname_is_looked_up_only_for_a_subscriber_that_reads_it(node: Node) -> None:
    seen: list[object] = []

    def plain(client: ClientInfo) -> None:  # like the $SYS events: no local address
        seen.append(("plain", client.client_id))

    def reader(client: ClientInfo) -> None:  # like the rules' client_disconnected
        seen.append(client.attrs.get("sockname"))

    def session_of(cid: str) -> tuple[ClientInfo, AddressedHandle]:
        info = ClientInfo(client_id=cid)
        h = AddressedHandle()
        r = node.open_session(info, h, clean_start=True, expiry_interval=0,
                              receive_maximum=10, will=None, will_delay=0)
        assert r.session is not None
        return info, h

    info, h = session_of("a")
    node.close(info, h, send_will=False)  # no subscriber: nothing looked up
    node.hooks.add("client.disconnected", plain)
    node.sockname_unused.add(plain)
    info, h = session_of("b")
    node.close(info, h, send_will=False)
    assert h.looked_up == 0 and "sockname" not in info.attrs and seen == [("plain", "b")]
    node.hooks.add("client.disconnected", reader)
    info, h = session_of("c")
    node.close(info, h, send_will=False)
    assert h.looked_up == 1 and seen[1:] == [("plain", "c"), "127.0.0.1:1883"]
    assert node.metrics.get("client.disconnected") == 3
