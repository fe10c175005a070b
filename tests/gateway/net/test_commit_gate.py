"""The effect loop's commit gate: an acknowledgement waits for the commit of the writes
made before it, also when an earlier acknowledgement is already waiting.

The GroupCommitter takes the writes and callbacks gathered so far as one batch and commits
it on a thread; writes added meanwhile go to the next batch. A second PUBACK that joins a
hold registered before its own write must not leave with the first batch's callback (it
did: a client got PUBACKs for messages not yet on disk, lost by a kill -9)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

from gateway.core.clock import VirtualScheduler
from gateway.net.shell import EffectLoop, Site
from gateway.net.stream import ListenerLimits, StreamShell, start_stream_listener
from gateway.store.writer import Task
from protocols.context import Delivery, Message
from protocols.effects import Effect, Unheld
from protocols.mqtt.channel import MqttChannel
from protocols.mqtt.encoder import encode
from protocols.mqtt.packets import Connect, Subscribe, Subscription
from protocols.mqtt.settings import MqttSettings
from tests.gateway.store.test_sessions import make_node


class TwoPhaseCommitter:
    """GroupCommitter's batching made explicit: ``flush`` starts a batch with the writes
    and callbacks so far, ``complete`` finishes it."""

    def __init__(self) -> None:
        self.ops: list[str] = []
        self.callbacks: list[Callable[[], None]] = []
        self.inflight: list[str] | None = None
        self.inflight_callbacks: list[Callable[[], None]] = []
        self.committed: list[str] = []

    @property
    def dirty(self) -> bool:
        return bool(self.ops) or self.inflight is not None

    def add(self, op: str) -> None:
        self.ops.append(op)

    def after_commit(
        self, callback: Callable[[], None], on_fail: Callable[[], None] | None = None
    ) -> None:
        if not self.dirty:
            callback()
        else:
            self.callbacks.append(callback)

    def flush(self) -> None:
        assert self.inflight is None
        self.inflight, self.ops = self.ops, []
        self.inflight_callbacks, self.callbacks = self.callbacks, []

    def complete(self) -> None:
        assert self.inflight is not None
        self.committed += self.inflight
        self.inflight = None
        callbacks, self.inflight_callbacks = self.inflight_callbacks, []
        for cb in callbacks:
            cb()
        if not self.ops and self.callbacks:  # GroupCommitter flushes them at once
            callbacks, self.callbacks = self.callbacks, []
            for cb in callbacks:
                cb()


_LOOP = asyncio.new_event_loop()  # never run: the effect loops here set no timers


def teardown_module() -> None:
    _LOOP.close()


class Recorder(EffectLoop):
    def __init__(self, gate: TwoPhaseCommitter) -> None:
        super().__init__(Site(gate, _LOOP))
        self.written: list[bytes] = []

    def _write_all(self, writes: list[bytes]) -> None:
        self.written += writes

    def _shutdown(self, reason: str) -> None:
        pass

    def run(self, *effects: Effect) -> None:
        self._run(list(effects))


def test_an_ack_waits_for_its_own_write_not_an_earlier_batch() -> None:
    gate = TwoPhaseCommitter()
    loop = Recorder(gate)
    gate.add("insert 1")
    loop.run(b"puback 1")
    gate.flush()  # batch 1 = insert 1, on its way to disk
    gate.add("insert 2")
    loop.run(b"puback 2")  # joins the hold; insert 2 is in the next batch
    gate.complete()
    assert loop.written == [b"puback 1"]
    gate.flush()
    gate.complete()
    assert loop.written == [b"puback 1", b"puback 2"]
    assert gate.committed == ["insert 1", "insert 2"]


def test_order_is_kept_and_nothing_waits_once_everything_is_committed() -> None:
    gate = TwoPhaseCommitter()
    loop = Recorder(gate)
    gate.add("w")
    loop.run(b"a")
    loop.run(b"b")  # held behind a (no write of its own)
    gate.flush()
    gate.complete()
    assert loop.written == [b"a", b"b"]
    loop.run(b"c")  # clean store: straight out
    assert loop.written == [b"a", b"b", b"c"]


def test_a_dropped_holds_callbacks_release_nothing_of_a_later_hold() -> None:
    gate = TwoPhaseCommitter()
    loop = Recorder(gate)
    gate.add("w1")
    loop.run(b"a")  # held; its callback waits for w1's batch
    loop._abandon()  # the store failed: a is dropped (the Recorder stays open)
    assert loop.held is None
    gate.add("w2")
    loop.run(b"b", b"c")  # a new hold, whose callback is registered after a's
    gate.flush()
    gate.complete()  # a's callback first: it finds another hold and does nothing
    assert loop.written == [b"b", b"c"] and loop.held is None


class EchoChannel:
    """Turns each delivery into its payload (the bytes a channel would write)."""

    def deliver(self, deliveries: list[Delivery]) -> list[Effect]:
        return [d.message.payload for d in deliveries]

    def on_timer(self, name: str) -> list[Effect]:
        return []

    def connection_lost(self) -> None:
        pass

    def release(self, packet_id: int) -> list[Effect]:
        return []

    def kick(self, reason_code: int) -> list[Effect]:
        return []


def delivery(payload: bytes, qos: int) -> Delivery:
    return Delivery(Message("t", payload, qos=qos), qos, False, packet_id=1 if qos else None)


def test_qos1_deliveries_leave_before_the_commit_qos2_and_acks_wait() -> None:
    gate = TwoPhaseCommitter()
    loop = Recorder(gate)
    loop.channel = EchoChannel()
    gate.add("queue row")
    loop.deliver([delivery(b"q1", 1), delivery(b"q0", 0)])  # a duplicate is allowed
    assert loop.written == [b"q1", b"q0"]
    loop.deliver([delivery(b"q2", 2)])  # exactly once: waits for its row
    loop.deliver([delivery(b"q1 after", 1)])  # behind the held QoS 2: order kept
    loop.run(b"puback")
    assert loop.written == [b"q1", b"q0"]
    gate.flush()
    gate.complete()
    assert loop.written == [b"q1", b"q0", b"q2", b"q1 after", b"puback"]


def test_a_held_ack_keeps_a_later_qos1_delivery_behind_it() -> None:
    gate = TwoPhaseCommitter()
    loop = Recorder(gate)
    loop.channel = EchoChannel()
    gate.add("w")
    loop.run(b"puback")
    loop.deliver([delivery(b"q1", 1)])
    assert loop.written == []
    gate.flush()
    gate.complete()
    assert loop.written == [b"puback", b"q1"]


class AckingChannel(EchoChannel):
    """Its input is a PUBACK that frees the window: the core pushes the next delivery
    while the input is being handled (as Session.puback -> drain does); an input of
    b"publish" also answers with a PUBACK of its own."""

    def __init__(self, shell: EffectLoop, qos: int) -> None:
        self.shell = shell
        self.qos = qos

    def handle_data(self, data: bytes) -> list[Effect]:
        self.shell.deliver([delivery(b"next", self.qos)])
        return [b"puback"] if data == b"publish" else []


def test_a_delivery_pushed_during_input_leaves_after_its_effects() -> None:
    gate = TwoPhaseCommitter()
    loop = Recorder(gate)
    loop.channel = channel = AckingChannel(loop, qos=1)
    gate.add("queue row")
    loop._input(channel.handle_data, b"ack")  # nothing of its own to hold
    assert loop.written == [b"next"]
    loop._input(channel.handle_data, b"publish")  # its PUBACK waits; next stays behind
    assert loop.written == [b"next"]
    gate.flush()
    gate.complete()
    assert loop.written == [b"next", b"puback", b"next"]


def test_a_qos2_delivery_pushed_during_input_waits_for_the_commit() -> None:
    gate = TwoPhaseCommitter()
    loop = Recorder(gate)
    loop.channel = channel = AckingChannel(loop, qos=2)
    gate.add("queue row")
    loop._input(channel.handle_data, b"ack")
    assert loop.written == []
    gate.flush()
    gate.complete()
    assert loop.written == [b"next"]


def test_unheld_effects_leave_before_the_commit_and_what_follows_them_waits() -> None:
    gate = TwoPhaseCommitter()
    loop = Recorder(gate)
    gate.add("another connection's row")
    loop.run(Unheld(1), b"connack", b"suback")  # a CONNECT and a SUBSCRIBE in one read
    assert loop.written == [b"connack"]
    gate.flush()
    gate.complete()
    assert loop.written == [b"connack", b"suback"]


def test_unheld_effects_keep_their_place_behind_held_output() -> None:
    gate = TwoPhaseCommitter()
    loop = Recorder(gate)
    gate.add("w")
    loop.run(b"puback")
    loop.run(Unheld(1), b"late")  # nothing overtakes what is held
    loop.run(b"x", Unheld(1), b"y")  # a marker that is not first means nothing
    assert loop.written == []
    gate.flush()
    gate.complete()
    assert loop.written == [b"puback", b"late", b"x", b"y"]
    loop.run(Unheld(1), b"clean")  # a clean store: everything goes, the marker skipped
    assert loop.written[-1] == b"clean"


def test_a_connack_leaves_while_the_store_commits_and_a_suback_waits(tmp_path: Path) -> None:
    """Real sockets, a real store: with the writer thread busy (a commit under way), a
    client's persistent CONNECT is answered at once; its SUBSCRIBE's SUBACK waits for
    the commit that holds the subscription."""

    async def main() -> None:
        node, committer = make_node(tmp_path / "n.db", VirtualScheduler())
        subscribed = asyncio.Event()
        node.hooks.add("session.subscribed", lambda *args: subscribed.set())
        shells: list[StreamShell] = []

        def factory(shell: StreamShell, peer: tuple[str, int] | None) -> MqttChannel:
            shells.append(shell)
            return MqttChannel(node, MqttSettings(), shell, peer=peer, monotonic=time.monotonic)

        server = await start_stream_listener(
            "127.0.0.1:0", ListenerLimits("tcp:t"), factory, committer, transport="lean")
        port = server.sockets[0].getsockname()[1]
        writer_busy = threading.Event()
        committer.submit(Task(lambda conn: writer_busy.wait(30)))
        committer.add("CREATE TABLE IF NOT EXISTS t_busy (x)")  # dirty until it commits
        await asyncio.sleep(0)  # the group commit hands it to the (busy) writer
        assert committer.dirty
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(encode(Connect("c", clean_start=False), 4))
            assert await asyncio.wait_for(reader.readexactly(4), 10) == b"\x20\x02\x00\x00"
            assert committer.dirty  # the session's row is not on disk yet
            writer.write(encode(Subscribe(1, (Subscription("t", 1),)), 4))
            await asyncio.wait_for(subscribed.wait(), 10)
            assert shells[0].held  # the SUBACK, held for the commit
            writer_busy.set()
            suback = await asyncio.wait_for(reader.readexactly(5), 10)
            assert suback[0] == 0x90 and suback[-1] == 1
            assert not committer.dirty
        finally:
            writer_busy.set()
            writer.close()
            server.close()
            await server.wait_closed()
            committer.close()

    asyncio.run(main())
