"""The outbox: order, acknowledgement, limits and their drops, expiry, spilling to disk
and reading back, volatile QoS 0 entries, and surviving a restart (a new Outbox on the
same file). Commits happen when the test says (ManualCommitter); time is virtual."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gateway.bridge.outbox import Outbox
from gateway.bridge.settings import OutboxLimits
from gateway.bridge.store import OutboxStore
from gateway.core.clock import VirtualScheduler
from protocols.mqtt.packets import NO_PROPERTIES, Properties

from .fakes import ManualCommitter, count_rows, make_store


class Harness:
    def __init__(self, tmp_path: Path, **limits: object) -> None:
        self.clock = VirtualScheduler()
        self.store, self.committer = make_store(tmp_path)
        self.drops: Counter[str] = Counter()
        self.limits = OutboxLimits(**limits)  # type: ignore[arg-type]
        self.outbox = self.new_outbox()

    def new_outbox(self, store: OutboxStore | None = None) -> Outbox:
        return Outbox(
            "b", self.limits, store or self.store, self.clock.time,
            lambda reason, n: self.drops.update({reason: n}),
        )

    def put(self, i: int, qos: int = 1, topic: str = "t", **kw: object) -> None:
        self.outbox.put(topic, str(i).encode(), qos, False, NO_PROPERTIES, **kw)  # type: ignore[arg-type]

    def drain(self, outbox: Outbox | None = None) -> list[int]:
        """Take everything sendable, acknowledging as a perfect upstream would."""
        o = outbox or self.outbox
        got = []
        pid = 1
        for _ in range(100_000):
            e = o.peek()
            if e is None:
                if o.unsent == 0:
                    break
                self.committer.commit()  # the rest is on disk: let it be read back
                continue
            o.take()
            got.append(int(e.payload))
            if e.qos == 0:
                o.written(e)
            else:
                o.sent(e, pid)
                assert o.acked(pid) is e
                pid = pid % 65535 + 1
        return got


@pytest.fixture
def h(tmp_path: Path) -> Harness:
    return Harness(tmp_path)


def test_fifo_and_ack_removes_the_row(h: Harness) -> None:
    for i in range(5):
        h.put(i)
    h.committer.commit()
    assert count_rows(h.store) == 5
    assert (h.outbox.count, h.outbox.bytes) == (5, 5 * 2)
    e = h.outbox.peek()
    assert e is not None and e.payload == b"0"
    h.outbox.take()
    h.outbox.sent(e, 7)
    assert h.outbox.unsent == 4 and h.outbox.inflight == {7: e}
    h.committer.commit()
    assert count_rows(h.store) == 5  # in flight: still on disk
    assert h.outbox.acked(7) is e
    assert h.outbox.acked(7) is None  # a second PUBACK is nothing
    h.committer.commit()
    assert count_rows(h.store) == 4
    assert h.drain() == [1, 2, 3, 4]
    h.committer.commit()
    assert count_rows(h.store) == 0
    assert (h.outbox.count, h.outbox.bytes) == (0, 0)
    assert not h.drops


def test_error_ack_is_an_acknowledgement_counted_as_rejected(h: Harness) -> None:
    h.put(0)
    e = h.outbox.peek()
    assert e is not None
    h.outbox.take()
    h.outbox.sent(e, 1)
    h.outbox.acked(1, 0x87)
    assert h.outbox.count == 0 and h.drops == {"rejected": 1}


def test_drop_oldest_drops_unsent_never_inflight(tmp_path: Path) -> None:
    h = Harness(tmp_path, max_messages=3)
    for i in range(3):
        h.put(i)
    first = h.outbox.peek()
    assert first is not None
    h.outbox.take()
    h.outbox.sent(first, 1)  # 0 is in flight
    h.put(3)  # full: the oldest unsent (1) goes
    h.put(4)  # then 2
    assert h.drops == {"outbox_full": 2}
    assert h.outbox.count == 3
    h.outbox.acked(1)
    assert h.drain() == [3, 4]
    h.committer.commit()
    assert count_rows(h.store) == 0


def test_drop_newest_refuses_the_new_message(tmp_path: Path) -> None:
    h = Harness(tmp_path, max_messages=2, drop_oldest=False)
    for i in range(4):
        h.put(i)
    assert h.drops == {"outbox_full": 2}
    assert h.drain() == [0, 1]


def test_max_bytes_and_a_message_larger_than_the_outbox(tmp_path: Path) -> None:
    h = Harness(tmp_path, max_bytes=10)
    h.outbox.put("t", b"x" * 20, 1, False, NO_PROPERTIES)
    assert h.drops == {"too_large": 1} and h.outbox.count == 0
    for i in range(4):
        h.outbox.put("t", f"{i}aa".encode(), 1, False, NO_PROPERTIES)  # 4 bytes each
    assert h.outbox.bytes <= 10 and h.outbox.count == 2
    assert h.drops["outbox_full"] == 2


def test_max_age_and_message_expiry(tmp_path: Path) -> None:
    h = Harness(tmp_path, max_age=60.0)
    h.put(0)
    h.put(1, expires_at=h.clock.time() + 10)
    h.clock.advance(30)
    h.put(2)
    e = h.outbox.peek()  # 1 expired (message expiry), 0 not yet
    assert e is not None and e.payload == b"0"
    h.clock.advance(31)  # 0 is now older than max_age; 2 is not
    h.outbox.expire()
    assert h.drops == {"expired": 2}
    assert h.drain() == [2]
    h.committer.commit()
    assert count_rows(h.store) == 0


def test_spill_to_disk_and_read_back_in_order(tmp_path: Path) -> None:
    h = Harness(tmp_path, memory_entries=10, refill_batch=8)
    for i in range(100):
        h.put(i, qos=i % 3)
    assert len(h.outbox.queue) < 100  # most of it is on disk only
    assert h.outbox.count == 100
    ready = []
    h.outbox.on_ready = lambda: ready.append(True)
    assert h.drain() == list(range(100))
    assert ready  # refills announced themselves
    h.committer.commit()
    assert count_rows(h.store) == 0 and h.outbox.count == 0 and h.outbox.bytes == 0


def test_spilled_entries_are_read_only_once_committed(tmp_path: Path) -> None:
    h = Harness(tmp_path, memory_entries=2, refill_batch=4)
    for i in range(5):
        h.put(i)
    assert [int(e.payload) for e in h.outbox.queue] == [0, 1]
    got = []
    for _ in range(2):
        e = h.outbox.peek()
        assert e is not None
        h.outbox.take()
        h.outbox.written(e)
        got.append(int(e.payload))
    assert h.outbox.peek() is None  # 2..4 are not committed: nothing to read yet
    assert h.outbox.unsent == 3
    h.committer.commit()
    assert h.drain() == [2, 3, 4]
    assert got == [0, 1]


def test_oldest_age_and_spilled_oldest(tmp_path: Path) -> None:
    h = Harness(tmp_path, memory_entries=1)
    assert h.outbox.oldest() is None
    t0 = h.clock.time()
    h.put(0)
    h.clock.advance(5)
    h.put(1)
    assert h.outbox.oldest() == t0
    e = h.outbox.peek()
    assert e is not None
    h.outbox.take()
    h.outbox.written(e)
    assert h.outbox.oldest() == t0 + 5  # on disk only, still known


def test_volatile_qos0_skips_the_disk_until_left_behind(h: Harness) -> None:
    h.put(0, qos=0, volatile=True)
    h.put(1, qos=0, volatile=True)
    h.committer.commit()
    assert count_rows(h.store) == 0 and h.outbox.volatile == 2
    e = h.outbox.peek()
    assert e is not None
    h.outbox.take()
    h.outbox.written(e)
    assert h.outbox.persist_volatile() == 1  # 1 could not leave now: to disk
    h.committer.commit()
    assert count_rows(h.store) == 1
    h.put(2, qos=1)
    h.put(3, qos=0, volatile=True)  # a persisted entry waits ahead: written anyway
    h.committer.commit()
    assert count_rows(h.store) == 3
    assert h.drain() == [1, 2, 3]
    h.committer.commit()
    assert count_rows(h.store) == 0


def test_restart_restores_order_counts_and_qos2_state(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    props = Properties(user_properties=(("k", "v"),), content_type="text/plain")
    h.outbox.put("a", b"0", 2, True, props)
    for i in range(1, 6):
        h.put(i, qos=1 + (i + 1) % 2)  # 1 is QoS 1
    e0 = h.outbox.peek()
    assert e0 is not None
    h.outbox.take()
    h.outbox.sent(e0, 41)
    h.outbox.released(41)
    e1 = h.outbox.peek()
    assert e1 is not None
    h.outbox.take()
    h.outbox.sent(e1, 42)  # QoS 1 in flight: its packet id is not kept
    h.committer.commit()
    count, size = h.outbox.count, h.outbox.bytes

    # a new process: new connections to the same file
    store2, committer2 = make_store(tmp_path)
    h.committer = committer2
    restored = h.new_outbox(store2)
    assert restored.load() == 6
    assert (restored.count, restored.bytes) == (count, size)
    first = restored.peek()
    assert first is not None
    assert (first.topic, first.retain, first.properties) == ("a", True, props)
    assert (first.packet_id, first.released) == (41, True)
    assert restored.reserved == {41}
    assert [int(e.payload) for e in restored.queue] == [0, 1, 2, 3, 4, 5]
    assert restored.queue[1].packet_id is None
    h.outbox = restored
    assert h.drain() == [0, 1, 2, 3, 4, 5]


def test_ids_keep_growing_across_restarts(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    h.put(0)
    h.committer.commit()
    store2, _ = make_store(tmp_path)
    assert store2.next_id() > h.outbox.queue[0].id


def test_memory_only_without_a_store(tmp_path: Path) -> None:
    h = Harness(tmp_path, memory_entries=2)
    o = Outbox("b", h.limits, None, h.clock.time, lambda r, n: None)
    for i in range(10):
        o.put("t", str(i).encode(), 1, False, NO_PROPERTIES)
    assert len(o.queue) == 10  # nowhere to spill
    assert h.drain(o) == list(range(10))


def test_bridges_share_the_table_without_mixing(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    other = Outbox("other", h.limits, h.store, h.clock.time, lambda r, n: None)
    for i in range(3):
        h.put(i)
        other.put("t", str(10 + i).encode(), 1, False, NO_PROPERTIES)
    h.committer.commit()
    assert h.store.bridges() == {"b": 3, "other": 3}
    store2, committer2 = make_store(tmp_path)
    h.committer = committer2
    restored = h.new_outbox(store2)
    assert restored.load() == 3
    assert h.drain(restored) == [0, 1, 2]


def test_manual_committer_matches_group_committer_contract(tmp_path: Path) -> None:
    """after_commit runs at once when nothing is pending, else after the next commit."""
    store, c = make_store(tmp_path)
    assert isinstance(c, ManualCommitter)
    calls: list[int] = []
    c.after_commit(lambda: calls.append(1))
    c.add("SELECT 1")
    c.after_commit(lambda: calls.append(2))
    assert calls == [1]
    c.commit()
    assert calls == [1, 2]
    assert store.summary("nobody") == (0, 0, 0, None)
