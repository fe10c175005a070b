"""The effect loop's timers: long ones on the shared one-second TimerWheel, short ones on
the event loop; an idle connection keeps its one timer inline (no dict, no tuple, no
int key). The wheel is driven by hand on a loop whose clock the test sets."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from gateway.net.shell import Bucket, EffectLoop, Site, TimerWheel
from protocols.context import Delivery
from protocols.effects import CancelTimer, Effect, SetTimer


class ClockLoop(asyncio.SelectorEventLoop):
    now = 1000.0

    def time(self) -> float:
        return self.now


class Fired:
    def __init__(self) -> None:
        self.names: list[str] = []

    def on_timer(self, name: str) -> list[Effect]:
        self.names.append(name)
        return []

    def connection_lost(self) -> None: ...
    def deliver(self, deliveries: list[Delivery]) -> list[Effect]:
        return []

    def release(self, packet_id: int) -> list[Effect]:
        return []

    def kick(self, reason_code: int) -> list[Effect]:
        return []


class Shell(EffectLoop):
    __slots__ = ("fired",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(Site(None, loop))
        self.fired = Fired()
        self.channel = self.fired

    def _write_all(self, writes: list[bytes]) -> None: ...
    def _shutdown(self, reason: str) -> None: ...


@pytest.fixture
def loop() -> Iterator[ClockLoop]:
    loop = ClockLoop()
    yield loop
    loop.close()


def tick(loop: ClockLoop, seconds: float) -> None:
    loop.now += seconds
    TimerWheel.of(loop)._tick()


def test_an_idle_connection_keeps_its_one_timer_inline(loop: ClockLoop) -> None:
    shell = Shell(loop)
    shell._run([SetTimer("keepalive", 90.0)])
    assert shell.timers is None and shell._t_name == "keepalive"
    bucket = shell._t_entry
    assert isinstance(bucket, Bucket) and bucket.owners() == [shell] and bucket.extra is None
    assert not hasattr(shell, "__dict__")


def test_wheel_timer_fires_once_not_early(loop: ClockLoop) -> None:
    shell = Shell(loop)
    shell._run([SetTimer("keepalive", 10.0)])
    tick(loop, 9.0)
    assert shell.fired.names == []
    tick(loop, 2.0)
    assert shell.fired.names == ["keepalive"]
    tick(loop, 20.0)
    assert shell.fired.names == ["keepalive"]
    assert shell._t_name is None and not shell.timers


def test_cancelled_timer_never_fires_and_leaves_the_bucket(loop: ClockLoop) -> None:
    shell = Shell(loop)
    shell._run([SetTimer("idle", 5.0)])
    bucket = shell._t_entry
    assert isinstance(bucket, Bucket)
    shell._run([CancelTimer("idle")])
    assert bucket.owners() == [] and shell._w_prev is None and shell._w_next is None
    tick(loop, 10.0)
    assert shell.fired.names == []


def test_two_timers_in_one_bucket_cancel_one(loop: ClockLoop) -> None:
    shell = Shell(loop)
    shell._run([SetTimer("idle", 5.0), SetTimer("packet", 5.2)])
    bucket = shell._t_entry
    assert isinstance(bucket, Bucket) and shell.timers is not None
    assert shell.timers["packet"] is bucket and bucket.extra == {shell}
    assert bucket.owners() == [shell]
    shell._run([CancelTimer("idle")])
    assert bucket.owners() == [shell]  # still there for "packet"
    tick(loop, 7.0)
    assert shell.fired.names == ["packet"]
    assert not bucket.extra


def test_second_timer_cancelled_first_still_fires(loop: ClockLoop) -> None:
    shell = Shell(loop)
    shell._run([SetTimer("idle", 5.0), SetTimer("packet", 5.2)])
    shell._run([CancelTimer("packet")])
    tick(loop, 7.0)
    assert shell.fired.names == ["idle"]


def test_setting_a_timer_again_replaces_it(loop: ClockLoop) -> None:
    shell = Shell(loop)
    shell._run([SetTimer("keepalive", 5.0)])
    shell._run([SetTimer("keepalive", 30.0)])
    tick(loop, 10.0)
    assert shell.fired.names == []
    tick(loop, 25.0)
    assert shell.fired.names == ["keepalive"]


def test_short_timers_use_the_event_loop(loop: ClockLoop) -> None:
    shell = Shell(loop)
    shell._run([SetTimer("keepalive", 60.0), SetTimer("pause", 0.5)])
    assert shell.timers is not None
    handle = shell.timers["pause"]
    assert isinstance(handle, asyncio.TimerHandle)
    shell._cancel_timers()
    assert handle.cancelled() and shell._t_name is None and not shell.timers


def test_uvloop_handles_are_cancelled() -> None:
    import uvloop

    uv = uvloop.new_event_loop()
    try:
        shell = Shell(uv)
        shell._run([SetTimer("pause", 0.5)])
        handle = shell._t_entry
        assert handle is not None and not isinstance(handle, Bucket)
        shell._run([CancelTimer("pause")])
        assert handle.cancelled()
    finally:
        uv.close()


def test_many_owners_one_bucket(loop: ClockLoop) -> None:
    shells = [Shell(loop) for _ in range(5)]
    for s in shells:
        s._run([SetTimer("keepalive", 3.0)])
    shells[2]._run([CancelTimer("keepalive")])
    shells[0]._run([CancelTimer("keepalive")])
    shells[0]._run([SetTimer("keepalive", 3.0)])  # back in, now last in the list
    tick(loop, 5.0)
    assert [s.fired.names for s in shells] == [["keepalive"]] * 2 + [[]] + [["keepalive"]] * 2
