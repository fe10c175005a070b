"""Listener limits (CIDR allow/deny, max connections, max_conn_rate) and the stream
shell's handling of Pause, without real sockets or real time."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gateway.net.shell import Hold
from gateway.net.stream import (
    SMALL_FANOUT,
    SMALL_INPUT,
    ListenerLimits,
    StreamShell,
    StreamSite,
)
from protocols.context import Delivery, Message
from protocols.effects import Effect, Pause


class Now:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_cidr_allow_and_deny() -> None:
    limits = ListenerLimits(
        "tcp:t", allow=["10.0.0.0/8", "fd00::/8"], deny=["10.66.0.0/16", "10.1.2.3"]
    )
    assert limits.admit("10.1.1.1") is None
    assert limits.admit("fd00::5") is None
    assert limits.admit("10.66.1.1") == "address denied"  # deny wins over allow
    assert limits.admit("10.1.2.3") == "address denied"
    assert limits.admit("192.168.1.1") == "address not allowed"
    assert limits.admit("::1") == "address not allowed"
    assert limits.admit("fe80::1%eth0") == "address not allowed"
    assert limits.admit(None) is None  # no peer address (a UNIX socket): not filtered


def test_deny_only() -> None:
    limits = ListenerLimits("tcp:t", deny=["127.0.0.0/8"])
    assert limits.admit("127.0.0.1") == "address denied"
    assert limits.admit("10.0.0.1") is None


def test_max_connections() -> None:
    limits = ListenerLimits("tcp:t", max_connections=2)
    limits.current = 2
    assert limits.admit("10.0.0.1") == "max_connections reached"
    limits.current = 1
    assert limits.admit("10.0.0.1") is None


def test_max_conn_rate_refuses_the_excess_and_recovers() -> None:
    now = Now()
    limits = ListenerLimits("tcp:t", max_conn_rate=10, now=now)
    results = [limits.admit("10.0.0.1") for _ in range(25)]
    assert results.count(None) == 10
    assert set(results[10:]) == {"max_conn_rate exceeded"}
    now.t += 0.5
    assert [limits.admit("10.0.0.1") for _ in range(6)].count(None) == 5
    now.t += 60
    assert [limits.admit("10.0.0.1") for _ in range(11)].count(None) == 10  # burst: 1 s


def test_denied_peers_do_not_use_up_the_rate() -> None:
    limits = ListenerLimits("tcp:t", max_conn_rate=2, deny=["10.66.0.0/16"], now=Now())
    for _ in range(100):
        assert limits.admit("10.66.0.1") == "address denied"
    assert limits.admit("10.0.0.1") is None


def test_refusals_are_counted_and_their_logging_is_throttled(caplog) -> None:
    now = Now()
    limits = ListenerLimits("tcp:t", now=now)
    with caplog.at_level(logging.WARNING, logger="gateway.net"):
        for _ in range(1000):
            limits.refuse(("10.0.0.1", 5), "max_conn_rate exceeded")
        now.t += 1.0
        limits.refuse(("10.0.0.2", 5), "address denied")
    assert limits.refused == 1001
    assert limits.refused_by == {"max_conn_rate exceeded": 1000, "address denied": 1}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert "999 more" in lines[1]


# -- the shell carries out Pause --------------------------------------------------------


class FakeTransport:
    def __init__(self) -> None:
        self.reading = True
        self.written: list[bytes] = []
        self.closing = False
        self.aborted = False
        self.name = ""
        self.log: list[str] | None = None  # names of the transports written, in order

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("10.0.0.1", 4444) if name == "peername" else default

    def pause_reading(self) -> None:
        assert self.reading
        self.reading = False

    def resume_reading(self) -> None:
        assert not self.reading
        self.reading = True

    def is_closing(self) -> bool:
        return self.closing

    def write(self, data: bytes) -> None:
        if self.log is not None:
            self.log.append(self.name)
        self.written.append(data)
        self.buffered += len(data)

    buffered = 0

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def abort(self) -> None:
        self.aborted = True
        self.closing = True

    def can_write_eof(self) -> bool:
        return False

    def close(self) -> None:
        self.closing = True


class FakeTimer:
    def __init__(self, when: float, callback: Any, args: tuple[Any, ...]) -> None:
        self._when = when
        self.callback = callback
        self.args = args
        self.cancelled = False

    def when(self) -> float:
        return self._when

    def cancel(self) -> None:
        self.cancelled = True


class FakeLoop:
    """Enough of an event loop for the shell's timers; time moves when told."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timers: list[FakeTimer] = []
        self.ready: list[tuple[Any, tuple[Any, ...]]] = []

    def call_soon(self, callback: Any, *args: Any) -> None:
        self.ready.append((callback, args))

    def run_ready(self) -> None:
        """One loop turn: the callbacks queued with call_soon (the shell's write flush)."""
        ready, self.ready = self.ready, []
        for callback, args in ready:
            callback(*args)

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Any, *args: Any) -> FakeTimer:
        t = FakeTimer(when, callback, args)
        self.timers.append(t)
        return t

    def call_later(self, delay: float, callback: Any, *args: Any) -> FakeTimer:
        return self.call_at(self.now + delay, callback, *args)

    def advance(self, seconds: float) -> None:
        self.run_ready()
        self.now += seconds
        for t in sorted(self.timers, key=lambda t: t.when()):
            if t.when() <= self.now and not t.cancelled:
                self.timers.remove(t)
                t.callback(*t.args)


class PausingChannel:
    """Answers each read with the effects queued in ``script``."""

    def __init__(self) -> None:
        self.script: list[list[Effect]] = []
        self.seen: list[bytes] = []
        self.deliver_calls: list[list[bytes]] = []  # the payloads of each deliver call

    def connection_made(self) -> list[Effect]:
        return []

    def handle_data(self, data: bytes) -> list[Effect]:
        self.seen.append(data)
        return self.script.pop(0) if self.script else []

    def on_timer(self, name: str) -> list[Effect]:
        return []

    def connection_lost(self) -> None:
        pass

    def deliver(self, deliveries: list[Delivery]) -> list[Effect]:
        self.deliver_calls.append([d.message.payload for d in deliveries])
        return [b"".join(d.message.payload for d in deliveries)]

    def release(self, packet_id: int) -> list[Effect]:
        return []

    def kick(self, reason_code: int) -> list[Effect]:
        return []


def make_shell(
    limits: ListenerLimits | None = None,
) -> tuple[StreamShell, FakeTransport, FakeLoop, PausingChannel]:
    channel = PausingChannel()

    loop = FakeLoop()
    site = StreamSite(
        limits or ListenerLimits("tcp:t"),
        lambda shell, peer: channel,
        None,
        loop,  # type: ignore[arg-type]
    )
    shell = StreamShell(site)
    transport = FakeTransport()
    shell.connection_made(transport)  # type: ignore[arg-type]
    return shell, transport, loop, channel


def test_pause_stops_reading_until_the_time_is_up() -> None:
    shell, transport, loop, channel = make_shell()
    channel.script = [[b"ack", Pause(2.0)]]
    shell.data_received(b"x")
    loop.run_ready()
    assert transport.written == [b"ack"]
    assert not transport.reading
    loop.advance(1.9)
    assert not transport.reading
    loop.advance(0.1)
    assert transport.reading


def test_a_longer_pause_extends_a_shorter_one_never_shortens() -> None:
    shell, transport, loop, _ = make_shell()
    shell._run([Pause(1.0)])
    shell._run([Pause(3.0)])
    shell._run([Pause(0.5)])
    loop.advance(1.0)
    assert not transport.reading
    loop.advance(2.0)
    assert transport.reading


def test_pause_after_close_and_connection_lost_are_harmless() -> None:
    shell, transport, loop, _ = make_shell()
    shell._run([Pause(5.0)])
    shell.connection_lost(None)
    assert shell.resume is None
    loop.advance(10)  # the cancelled resume never runs
    assert not transport.reading
    transport.closing = True
    shell._pause_reading(1.0)  # a closing transport is left alone


@pytest.mark.parametrize("seconds", [0.001, 1e6])
def test_pause_lengths(seconds: float) -> None:
    shell, transport, loop, _ = make_shell()
    shell._run([Pause(seconds)])
    loop.advance(seconds)
    assert transport.reading


# -- gathering writes --------------------------------------------------------------------


def test_own_answers_leave_with_the_input_what_others_push_is_gathered() -> None:
    shell, transport, loop, channel = make_shell()
    channel.script = [[b"ack1", b"ack2"]]
    shell.data_received(b"x")
    assert transport.written == [b"ack1ack2"]  # before the loop's turn ends: one write
    assert loop.ready == []  # and no flush left queued for the turn's end
    # deliveries that other connections' input pushes here later in the turn
    shell._write_all([b"d1"])
    shell._write_all([b"d2"])
    assert transport.written == [b"ack1ack2"]
    loop.run_ready()
    assert transport.written == [b"ack1ack2", b"d1d2"]  # one write for the rest of the turn


def test_deliveries_to_others_during_an_input_are_handed_over_once_it_ends() -> None:
    pub, _, _, pub_channel = make_shell()
    a, a_transport, a_loop, a_channel = make_shell()
    b, _, _, b_channel = make_shell()

    def d(payload: bytes) -> list[Delivery]:
        return [Delivery(Message("t", payload), 0, False)]

    def read(data: bytes) -> list[Effect]:  # the publisher's input routes 3 messages
        for i in (b"1", b"2", b"3"):
            a.deliver(d(i))
            if i != b"2":
                b.deliver(d(i))
        assert a_channel.deliver_calls == []  # not yet: gathered
        return []

    pub_channel.handle_data = read  # type: ignore[method-assign]
    pub.data_received(b"x")
    assert a_channel.deliver_calls == [[b"1", b"2", b"3"]]  # one call each, in order
    assert b_channel.deliver_calls == [[b"1", b"3"]]
    a_loop.run_ready()
    assert a_transport.written == [b"123"]
    a.deliver(d(b"4"))  # outside any input: at once, as before
    assert a_channel.deliver_calls[-1] == [b"4"]


def test_a_small_input_sends_what_it_delivered_at_its_end() -> None:
    """A lightly loaded publisher (an input of a few packets, reaching one or two
    connections) has its deliveries written when its input ends, before its own
    acknowledgement, instead of at the end of the loop turn; a large input, or one that
    reached more connections, leaves them for the turn's end (one write per connection
    for all the turn's input)."""
    pub, pub_t, _, pub_channel = make_shell()
    subs = [make_shell() for _ in range(3)]
    order: list[str] = []
    for name, t in zip(("a", "b", "c", "pub"), [s[1] for s in subs] + [pub_t], strict=True):
        t.name, t.log = name, order
    targets: list[StreamShell] = []

    def read(data: bytes) -> list[Effect]:
        for shell in targets:
            shell.deliver([Delivery(Message("t", data[:1]), 0, False)])
        return [b"ack"]

    pub_channel.handle_data = read  # type: ignore[method-assign]
    (a, a_t, a_loop, _), (b, b_t, _, _), (c, c_t, _, _) = subs
    targets[:] = [a]
    pub.data_received(b"1")
    assert a_t.written == [b"1"] and order == ["a", "pub"]  # before the turn ends
    order.clear()
    pub.data_received(b"2" * (SMALL_INPUT + 1))  # a large input: at the turn's end
    assert a_t.written == [b"1"] and order == ["pub"]
    a_loop.run_ready()
    assert a_t.written == [b"1", b"2"]
    assert SMALL_FANOUT < 3
    targets[:] = [a, b, c]  # more connections than SMALL_FANOUT: at the turn's end
    pub.data_received(b"3")
    assert a_t.written == [b"1", b"2"] and b_t.written == c_t.written == []
    for _, _, loop, _ in subs:
        loop.run_ready()
    assert a_t.written[-1] == b_t.written[-1] == c_t.written[-1] == b"3"


# -- slow readers ------------------------------------------------------------------------


def test_a_reader_blocked_for_send_timeout_is_dropped(caplog) -> None:
    limits = ListenerLimits("tcp:t", send_timeout=15.0)
    shell, transport, loop, _ = make_shell(limits)
    shell.pause_writing()
    loop.advance(14.9)
    shell.resume_writing()  # it caught up in time
    loop.advance(60)
    assert not transport.aborted
    shell.pause_writing()
    with caplog.at_level(logging.WARNING, logger="gateway.net"):
        loop.advance(15.0)
    assert transport.aborted and shell.closed
    assert limits.slow_readers == 1
    assert "dropped slow reader" in caplog.text


def test_more_than_max_send_buffer_unsent_is_dropped() -> None:
    limits = ListenerLimits("tcp:t", max_send_buffer=1000)
    shell, transport, loop, _ = make_shell(limits)
    shell._run([b"x" * 5000])  # not blocked (below the high-water mark): fine
    loop.run_ready()
    assert not transport.aborted
    transport.buffered = 0
    shell.pause_writing()
    shell._run([b"x" * 600])
    loop.run_ready()
    assert not transport.aborted
    shell._run([b"x" * 600])
    loop.run_ready()  # writes reach the transport once per loop turn
    assert transport.aborted and limits.slow_readers == 1
    shell.deliver([])  # nothing more is carried out
    assert len(transport.written) == 3


def test_no_limits_no_drop() -> None:
    shell, transport, loop, _ = make_shell()
    shell.pause_writing()
    shell._run([b"x" * 10_000_000])
    loop.advance(3600)
    assert not transport.aborted


def test_connection_lost_lets_go_of_the_channel() -> None:
    """The channel (and its receive buffer) is not kept alive by a reference cycle
    through the shell once the connection is gone."""
    shell, _, _, _ = make_shell()
    shell.held = Hold()
    shell.held.effects.append(b"unsent")
    shell.connection_lost(None)
    assert shell.channel is None and shell.held is None
    shell.deliver([])  # a late delivery from the core is ignored
