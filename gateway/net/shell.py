"""The effect loop every transport shell shares (stream, WebSocket, datagram).

A channel returns effects instead of performing them (``protocols.effects``). An
:class:`EffectLoop` is the one place that carries them out for one connection or one
datagram peer: writes, named timers, close. It is also the channel's
:class:`~protocols.context.ConnectionHandle`, so deliveries pushed by the core and results
computed later (``call_channel``) run through the same loop. Subclasses say only how to
write (``_write_all``), how to close (``_shutdown``) and whether writing is still possible
(``_writable``).

Invariants:
- At most one timer per name; setting a name again replaces it.
- With a commit ``gate`` (a durable node), nothing a channel emits while the store has
  uncommitted writes leaves before they are committed: a PUBACK/PUBREC is never sent
  for a message that is not yet on disk. Held effects keep their order.
- The one exception: deliveries pushed by the core (``deliver``) that are all QoS 0 or 1
  leave at once when nothing of the connection is held (those pushed while the
  connection's own input is handled go out right after that input's effects). Sending
  one early loses nothing (its journal row, if any, is committed or lost exactly as if
  it had waited) and at worst duplicates it after a crash (its publisher, not yet
  acknowledged, sends it again), which QoS 1 allows; the subscriber's PUBACK may then
  cancel the row before it is ever written. QoS 2 deliveries wait: a duplicate would
  break exactly-once.
- After a Close effect no further effect is carried out (``closed`` is set first).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import ClassVar, Protocol

from protocols.context import Delivery
from protocols.effects import CancelTimer, Close, Effect, Pause, SetTimer

log = logging.getLogger("gateway.net")


class Channel(Protocol):
    """What an effect loop asks of a channel besides its input (``handle_data`` for
    streams, ``handle_datagram`` for datagrams)."""

    def on_timer(self, name: str) -> list[Effect]: ...
    def connection_lost(self) -> None: ...
    def deliver(self, deliveries: list[Delivery]) -> list[Effect]: ...
    def release(self, packet_id: int) -> list[Effect]: ...
    def kick(self, reason_code: int) -> list[Effect]: ...


class CommitGate(Protocol):
    @property
    def dirty(self) -> bool: ...
    def after_commit(self, callback: Callable[[], None]) -> None: ...


class TimerWheel:
    """Coarse timers, one second of resolution, for the long timeouts every connection
    has (keepalive, idle, packet timeouts): one event-loop callback per second for all
    of them instead of one ``TimerHandle`` (~650 bytes) per connection.

    Invariant: an entry fires at most once, no earlier than asked and at most about a
    second later; a cancelled entry never fires.
    """

    _wheels: ClassVar[dict[asyncio.AbstractEventLoop, TimerWheel]] = {}

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.buckets: dict[int, set[tuple[EffectLoop, str]]] = {}
        self.handle: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> TimerWheel:
        wheel = cls._wheels.get(loop)
        if wheel is None or wheel.loop is not loop:
            wheel = cls._wheels[loop] = TimerWheel(loop)
        return wheel

    def add(self, owner: EffectLoop, name: str, delay: float) -> int:
        key = int(self.loop.time() + delay) + 1
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = set()
        bucket.add((owner, name))
        if self.handle is None:
            self.handle = self.loop.call_later(1.0, self._tick)
        return key

    def cancel(self, owner: EffectLoop, name: str, key: int) -> None:
        bucket = self.buckets.get(key)
        if bucket is not None:
            bucket.discard((owner, name))
            if not bucket:
                del self.buckets[key]

    def _tick(self) -> None:
        now = self.loop.time()
        for key in sorted(k for k in self.buckets if k <= now):
            for owner, name in self.buckets.pop(key, ()):
                owner._fire_wheel(name, key)
        self.handle = self.loop.call_later(1.0, self._tick) if self.buckets else None


class _InputState(threading.local):
    """The connection whose input is being handled on this thread (EffectLoop._input)."""

    owner: EffectLoop | None = None
    deferred: list[Delivery]

    def __init__(self) -> None:
        self.deferred = []


_input = _InputState()


# Timers shorter than this use the event loop directly (precise); longer ones the wheel.
WHEEL_MIN_DELAY = 2.0


class EffectLoop:
    """Carries out one channel's effects; base class of the transport shells."""

    channel: Channel | None

    def __init__(self, gate: CommitGate | None, loop: asyncio.AbstractEventLoop) -> None:
        self.gate = gate
        self.loop = loop
        self.channel = None
        self.held: list[Effect] = []
        self._held_total = 0  # effects ever held, and ever released (commit marks)
        self._released_total = 0
        # name -> a loop TimerHandle, or the TimerWheel bucket (an int) it waits in
        self.timers: dict[str, asyncio.TimerHandle | int] = {}
        self.closed = False

    # -- what a shell provides ---------------------------------------------------------

    def _write_all(self, writes: list[bytes]) -> None:
        """Write these, in order (a stream may join them; a datagram shell may not)."""
        raise NotImplementedError

    def _shutdown(self, reason: str) -> None:
        """Close after the writes already made (``closed`` and the timers are done)."""
        raise NotImplementedError

    def _writable(self) -> bool:
        return True

    def _pause_reading(self, seconds: float) -> None:
        """Read nothing from the peer for ``seconds`` (a Pause effect: a rate limit).
        A shell that cannot (a datagram socket shared by many peers) ignores it."""

    # -- ConnectionHandle ------------------------------------------------------------

    def deliver(self, deliveries: list[Delivery]) -> None:
        if self.channel is None or self.closed:
            return
        if _input.owner is self:
            _input.deferred.extend(deliveries)  # after the input's own effects
            return
        effects = self.channel.deliver(deliveries)
        if not effects:
            return
        if self.held or (self.gate is not None and any(d.qos == 2 for d in deliveries)):
            self._run(effects)
        else:
            # QoS 0/1 deliveries need not wait for the commit (see the invariants)
            self._execute(effects)

    def release(self, packet_id: int) -> None:
        if self.channel is not None and not self.closed:
            self._run(self.channel.release(packet_id))

    def kick(self, reason_code: int) -> None:
        if self.channel is not None and not self.closed:
            self._run(self.channel.kick(reason_code))

    def call_channel(self, fn: Callable[[], list[Effect]]) -> None:
        """Run a channel method that returns effects (e.g. an authentication result that
        arrived later) and carry them out; ignored once the connection is closed."""
        if self.channel is not None and not self.closed:
            self._run(fn())

    # -- input -----------------------------------------------------------------------

    def _input(self, handle: Callable[[bytes], list[Effect]], data: bytes) -> None:
        """Run ``handle(data)`` (the channel's input entry point) and carry out its
        effects. Deliveries the core pushes to this connection meanwhile (the window a
        PUBACK frees, a SUBACK's retained messages, a self-subscribed publish) go to the
        channel afterwards as one batch, so they need not wait behind the input's own
        held effects when they are QoS 0/1 and nothing else of ours is held. Without a
        gate (nothing is ever held) the channel appends them to the input's effects."""
        if self.gate is None:
            self._run(handle(data))
            return
        state = _input
        outer, outer_deferred = state.owner, state.deferred
        state.owner = self
        deferred: list[Delivery] = []
        state.deferred = deferred
        try:
            effects = handle(data)
        finally:
            state.owner, state.deferred = outer, outer_deferred
        self._run(effects)
        if deferred:
            self.deliver(deferred)

    # -- effects -------------------------------------------------------------------

    def _fire(self, name: str) -> None:
        self.timers.pop(name, None)
        if self.channel is not None and not self.closed:
            self._run(self.channel.on_timer(name))

    def _fire_wheel(self, name: str, key: int) -> None:
        if self.timers.get(name) == key:
            self._fire(name)

    def _set_timer(self, name: str, seconds: float) -> None:
        self._cancel_timer(name)
        if seconds >= WHEEL_MIN_DELAY:
            self.timers[name] = TimerWheel.of(self.loop).add(self, name, seconds)
        else:
            self.timers[name] = self.loop.call_later(seconds, self._fire, name)

    def _cancel_timer(self, name: str) -> None:
        old = self.timers.pop(name, None)
        if old is None:
            return
        if isinstance(old, int):
            TimerWheel.of(self.loop).cancel(self, name, old)
        else:
            old.cancel()

    def _cancel_timers(self) -> None:
        for name in list(self.timers):
            self._cancel_timer(name)

    def _run(self, effects: list[Effect]) -> None:
        if not effects:
            return
        gate = self.gate
        if gate is not None and (self.held or gate.dirty):
            # One commit callback per hold: these effects may depend on writes added
            # since an earlier hold registered its callback, so they wait for a callback
            # registered now. Callbacks run in registration order; each releases what
            # was held up to its registration.
            self.held.extend(effects)
            self._held_total += len(effects)
            mark = self._held_total
            gate.after_commit(lambda: self._release(mark))
            return
        self._execute(effects)

    def _release(self, mark: int) -> None:
        n = mark - self._released_total
        if n <= 0:
            return
        effects = self.held[:n]
        del self.held[:n]
        self._released_total = mark
        if self._writable():
            self._execute(effects)

    def _execute(self, effects: list[Effect]) -> None:
        if len(effects) == 1 and type(effects[0]) is bytes:
            self._write_all(effects)  # type: ignore[arg-type]
            return
        writes: list[bytes] = []
        for e in effects:
            if type(e) is bytes:
                writes.append(e)
            elif isinstance(e, SetTimer):
                self._set_timer(e.name, e.seconds)
            elif isinstance(e, CancelTimer):
                self._cancel_timer(e.name)
            elif isinstance(e, Pause):
                self._pause_reading(e.seconds)
            elif isinstance(e, Close):
                if writes:
                    self._write_all(writes)
                self.closed = True
                self._cancel_timers()
                self._shutdown(e.reason)
                return
        if writes:
            self._write_all(writes)
