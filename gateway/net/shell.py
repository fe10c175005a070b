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
- The other exception: effects a channel marks :class:`~protocols.effects.Unheld`
  (the first effect of a list, counting those after it) leave at once when nothing of
  the connection is held. The MQTT channel marks a CONNACK (and its timers) that
  acknowledges nothing the store must keep first: a new session, or one resumed, whose
  loss in a crash the client sees as session present 0 at its next connect. A CONNACK
  after a clean start discarded a session, or on a node of a cluster, waits, as does
  whatever follows the marked effects (a SUBACK of the same read). A stream
  connection's first effects (``connection_made``: no input answered yet) are not
  held either.
- Deliveries the core pushes to *other* connections while one connection's input is
  handled are gathered per connection and handed over when that input's handling
  ends (in the order pushed): a read of 32 PUBLISHes for 16 subscribers makes 16
  deliver calls of 32, not 512 of one. They reach the wire no later than before (a
  stream shell writes them at the end of the loop turn, or of a small input).
- After a Close effect no further effect is carried out (``closed`` is set first).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

from protocols.context import Delivery
from protocols.effects import CancelTimer, Close, Effect, Pause, SetTimer, Unheld
from protocols.rare import rare_set

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
    def after_commit(
        self, callback: Callable[[], None], on_fail: Callable[[], None] | None = None
    ) -> None: ...


class Bucket:
    """The owners with a timer due in one second of a :class:`TimerWheel`.

    The owners' first timers form a circular doubly linked list through their own
    ``_w_prev``/``_w_next`` slots, the bucket being the list's head: entering and leaving
    cost no allocation and an idle connection costs the wheel two slots. An owner's
    other wheel timers (rare: a connection with a stalled packet and a keepalive due in
    the same second) go in ``extra``."""

    __slots__ = ("_w_next", "_w_prev", "extra")

    def __init__(self) -> None:
        self._w_next: Bucket | EffectLoop = self
        self._w_prev: Bucket | EffectLoop = self
        self.extra: set[EffectLoop] | None = None

    def link(self, owner: EffectLoop) -> None:
        last = self._w_prev
        owner._w_prev = last
        owner._w_next = self
        last._w_next = owner
        self._w_prev = owner

    def owners(self) -> list[EffectLoop]:
        out: list[EffectLoop] = []
        node = self._w_next
        while isinstance(node, EffectLoop):  # back at the bucket: done
            out.append(node)
            nxt = node._w_next
            assert nxt is not None, "an owner in a bucket's list is linked"
            node = nxt
        if self.extra:
            out.extend(o for o in self.extra if o not in out)
        return out


def _unlink(owner: EffectLoop) -> None:
    prev, nxt = owner._w_prev, owner._w_next
    if prev is not None and nxt is not None:
        prev._w_next = nxt
        nxt._w_prev = prev
    owner._w_prev = owner._w_next = None


class TimerWheel:
    """Coarse timers, one second of resolution, for the long timeouts every connection
    has (keepalive, idle, packet timeouts): one event-loop callback per second for all
    of them instead of one ``TimerHandle`` (~650 bytes) per connection.

    An owner's timer is the :class:`Bucket` it waits in (no key, no tuple, no handle).
    Invariant: an entry fires at most once, no earlier than asked and at most about a
    second later; a cancelled entry never fires.
    """

    _wheels: ClassVar[dict[asyncio.AbstractEventLoop, TimerWheel]] = {}

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        # second -> owners due then; a bucket emptied by cancels stays until its second
        self.buckets: dict[int, Bucket] = {}
        self.handle: asyncio.TimerHandle | None = None

    @classmethod
    def of(cls, loop: asyncio.AbstractEventLoop) -> TimerWheel:
        wheel = cls._wheels.get(loop)
        if wheel is None or wheel.loop is not loop:
            wheel = cls._wheels[loop] = TimerWheel(loop)
        return wheel

    def add(self, owner: EffectLoop, delay: float, *, first: bool) -> Bucket:
        """Enter ``owner`` in the bucket due ``delay`` seconds from now, linked in (its
        ``first`` timer) or in the bucket's ``extra`` set; returns the bucket."""
        key = int(self.loop.time() + delay) + 1
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = Bucket()
        if first:
            bucket.link(owner)
        else:
            if bucket.extra is None:
                bucket.extra = set()
            bucket.extra.add(owner)
        if self.handle is None:
            self.handle = self.loop.call_later(1.0, self._tick)
        return bucket

    def _tick(self) -> None:
        now = self.loop.time()
        for key in sorted(k for k in self.buckets if k <= now):
            bucket = self.buckets.pop(key)
            for owner in bucket.owners():  # a snapshot: firing unlinks owners
                owner._fire_wheel(bucket)
        self.handle = self.loop.call_later(1.0, self._tick) if self.buckets else None


class _InputState(threading.local):
    """The connection whose input is being handled on this thread (EffectLoop._input)."""

    owner: EffectLoop | None = None
    # the owner's own deliveries, run after its input's effects (None: no commit gate,
    # the channel appends them to those effects itself)
    deferred: list[Delivery] | None = None
    # deliveries to other connections, handed over when the owner's input is handled
    others: dict[EffectLoop, list[Delivery]] | None = None


_input = _InputState()


# Timers shorter than this use the event loop directly (precise); longer ones the wheel.
WHEEL_MIN_DELAY = 2.0


# A timer: an event-loop handle, or the TimerWheel bucket it waits in.
TimerEntry = asyncio.TimerHandle | Bucket


class Hold:
    """A connection's output held until the store commits what it may acknowledge: the
    effects, and how many were ever held and released (the marks of its commit
    callbacks). Made by the first hold and dropped when everything held has gone, so an
    idle connection keeps none; a callback of a dropped hold finds another (or none) in
    the connection's ``held`` and does nothing."""

    __slots__ = ("effects", "held", "released")

    def __init__(self) -> None:
        self.effects: list[Effect] = []
        self.held = 0
        self.released = 0


class Site:
    """What every connection of one listener shares: its commit gate and event loop (a
    stream listener's adds its limits and channel factory). One per listener; each
    connection holds it in one slot instead of a slot per field."""

    __slots__ = ("gate", "loop")

    def __init__(self, gate: CommitGate | None, loop: asyncio.AbstractEventLoop) -> None:
        self.gate = gate
        self.loop = loop


class EffectLoop:
    """Carries out one channel's effects; base class of the transport shells.

    Slots, and nothing made before it is needed: there is one per connection (an idle
    MQTT connection has one timer, its keepalive, held in ``_t_name``/``_t_entry`` and,
    on the wheel, linked into its bucket through ``_w_prev``/``_w_next``; ``timers`` is
    made only for a second timer, ``held`` only for a commit hold)."""

    __slots__ = (
        "_rare",
        "_t_entry",
        "_t_name",
        "_w_next",
        "_w_prev",
        "channel",
        "closed",
        "held",
        "site",
    )

    channel: Channel | None

    _rare: dict[str, Any] | None  # the rare attributes' values (protocols.rare)

    # name -> entry of the timers after the first (rare: a stalled packet's timer while
    # the keepalive runs); protocols.rare keeps it out of the slots
    @property
    def timers(self) -> dict[str, TimerEntry] | None:
        r = self._rare
        v: dict[str, TimerEntry] | None = None if r is None else r.get("timers")
        return v

    @timers.setter
    def timers(self, value: dict[str, TimerEntry] | None) -> None:
        self._rare = rare_set(self._rare, "timers", value, None)

    def __init__(self, site: Site) -> None:
        self._rare = None
        self.site = site  # the listener's, shared
        self.channel = None
        self.held: Hold | None = None  # output waiting for the store (made when needed)
        # the first timer inline, the others in ``timers`` (name -> entry)
        self._t_name: str | None = None
        self._t_entry: TimerEntry | None = None
        # links of the first timer in its wheel bucket (None: not on the wheel)
        self._w_prev: Bucket | EffectLoop | None = None
        self._w_next: Bucket | EffectLoop | None = None
        self.closed = False

    @property
    def gate(self) -> CommitGate | None:
        return self.site.gate

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self.site.loop

    # -- what a shell provides ---------------------------------------------------------

    def _write_all(self, writes: list[bytes]) -> None:
        """Write these, in order (a stream may join them; a datagram shell may not)."""
        raise NotImplementedError

    def _shutdown(self, reason: str) -> None:
        """Close after the writes already made (``closed`` and the timers are done)."""
        raise NotImplementedError

    def _writable(self) -> bool:
        return True

    def _flush(self) -> None:
        """Write what was gathered for the end of the loop turn now (a shell that
        gathers nothing has nothing to do)."""

    def _pause_reading(self, seconds: float) -> None:
        """Read nothing from the peer for ``seconds`` (a Pause effect: a rate limit).
        A shell that cannot (a datagram socket shared by many peers) ignores it."""

    # -- ConnectionHandle ------------------------------------------------------------

    def deliver(self, deliveries: list[Delivery]) -> None:
        if self.channel is None or self.closed:
            return
        state = _input
        owner = state.owner
        if owner is not None:
            if owner is not self:  # gathered until the owner's input is handled
                others = state.others
                assert others is not None
                pending = others.get(self)
                if pending is None:
                    others[self] = list(deliveries)
                else:
                    pending.extend(deliveries)
                return
            deferred = state.deferred
            if deferred is not None:
                deferred.extend(deliveries)  # after the input's own effects
                return
        effects = self.channel.deliver(deliveries)
        if not effects:
            return
        if self.held is not None:
            self._run(effects)
            return
        if self.site.gate is not None:
            # a plain loop: no generator per call (this runs once per delivered message)
            for d in deliveries:
                if d.qos == 2:
                    self._run(effects)
                    return
        # QoS 0/1 deliveries need not wait for the commit (see the invariants)
        if len(effects) == 1 and type(effects[0]) is bytes:
            self._write_all(effects)  # type: ignore[arg-type]  # _execute's fast path
        else:
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

    def _input(
        self, handle: Callable[[bytes], list[Effect]], data: bytes
    ) -> dict[EffectLoop, list[Delivery]]:
        """Run ``handle(data)`` (the channel's input entry point) and carry out its
        effects. Deliveries the core pushes to this connection meanwhile (the window a
        PUBACK frees, a SUBACK's retained messages, a self-subscribed publish) go to the
        channel afterwards as one batch, so they need not wait behind the input's own
        held effects when they are QoS 0/1 and nothing else of ours is held. Without a
        gate (nothing is ever held) the channel appends them to the input's effects.
        Returns what the input delivered to other connections, by connection."""
        state = _input
        outer, outer_deferred, outer_others = state.owner, state.deferred, state.others
        state.owner = self
        deferred: list[Delivery] | None = None if self.site.gate is None else []
        state.deferred = deferred
        others: dict[EffectLoop, list[Delivery]] = {}
        state.others = others
        try:
            effects = handle(data)
        finally:
            state.owner, state.deferred, state.others = outer, outer_deferred, outer_others
            for shell, pending in others.items():  # (to the outer input's, if nested)
                shell.deliver(pending)
        self._run(effects)
        if deferred:
            self.deliver(deferred)
        return others

    # -- effects -------------------------------------------------------------------

    def _timer(self, name: str) -> TimerEntry | None:
        if self._t_name == name:
            return self._t_entry
        timers = self.timers
        return timers.get(name) if timers else None

    def _pop_timer(self, name: str) -> TimerEntry | None:
        """Forget timer ``name`` (and leave its wheel bucket); its entry, or None."""
        if self._t_name == name:
            entry = self._t_entry
            self._t_name = self._t_entry = None
            if type(entry) is Bucket:  # the first timer is linked into its bucket
                _unlink(self)
            return entry
        timers = self.timers
        if not timers:
            return None
        entry = timers.pop(name, None)
        # the others wait in the bucket's set: leave it unless another one is there
        if (
            type(entry) is Bucket
            and entry.extra is not None
            and not any(e is entry for e in timers.values())
        ):
            entry.extra.discard(self)
        if not timers:
            self.timers = None
        return entry

    def _put_timer(self, name: str, entry: TimerEntry) -> None:
        if self._t_name is None:
            self._t_name = name
            self._t_entry = entry
            return
        timers = self.timers
        if timers is None:
            timers = self.timers = {}
        timers[name] = entry

    def _fire(self, name: str) -> None:
        self._pop_timer(name)
        if self.channel is not None and not self.closed:
            self._run(self.channel.on_timer(name))

    def _fire_wheel(self, bucket: Bucket) -> None:
        """The wheel reached ``bucket``: fire this owner's timers that wait in it."""
        names = [self._t_name] if self._t_entry is bucket else []
        if self.timers:
            names.extend(n for n, e in self.timers.items() if e is bucket)
        for name in names:
            if name is not None and self._timer(name) is bucket:  # not re-set meanwhile
                self._fire(name)

    def _set_timer(self, name: str, seconds: float) -> None:
        self._cancel_timer(name)
        entry: TimerEntry
        if seconds >= WHEEL_MIN_DELAY:
            first = self._t_name is None  # as _put_timer decides
            entry = TimerWheel.of(self.site.loop).add(self, seconds, first=first)
        else:
            entry = self.site.loop.call_later(seconds, self._fire, name)
        self._put_timer(name, entry)

    def _cancel_timer(self, name: str) -> None:
        old = self._pop_timer(name)
        if old is not None and not isinstance(old, Bucket):  # a loop handle (uvloop's too)
            old.cancel()

    def _cancel_timers(self) -> None:
        if self._t_name is not None:
            self._cancel_timer(self._t_name)
        if self.timers:
            for name in list(self.timers):
                self._cancel_timer(name)

    def _run(self, effects: list[Effect]) -> None:
        if not effects:
            return
        gate = self.site.gate
        if gate is not None and (self.held is not None or gate.dirty):
            first = effects[0]
            if type(first) is Unheld and self.held is None:  # e.g. a CONNACK: out now
                n = first.count + 1
                self._execute(effects[1:n])
                effects = effects[n:]
                if not effects or self.closed:
                    return
            # One commit callback per hold: these effects may depend on writes added
            # since an earlier hold registered its callback, so they wait for a callback
            # registered now. Callbacks run in registration order; each releases what
            # was held up to its registration.
            hold = self.held
            if hold is None:
                hold = self.held = Hold()
            hold.effects.extend(effects)
            hold.held += len(effects)
            mark = hold.held
            gate.after_commit(lambda: self._release(hold, mark), self._abandon)
            return
        self._execute(effects)

    def _abandon(self) -> None:
        """The store failed before the held output could go (the disk is full, a write
        error): drop it all, since it may acknowledge what is not on disk, and disconnect
        ; the peer re-sends what was not
        acknowledged. While the store stays in its fault, holds end at once. The channel
        sees an ordinary loss of its connection (its will, if any, goes)."""
        if self.held is None or self.closed:
            return
        self.held = None  # its pending callbacks find no hold: they do nothing
        self._execute([Close("the store cannot write: held output dropped")])

    def _release(self, hold: Hold, mark: int) -> None:
        n = mark - hold.released
        if n <= 0 or hold is not self.held:
            return
        effects = hold.effects[:n]
        del hold.effects[:n]
        if not hold.effects:
            self.held = None  # an idle connection keeps no hold
        hold.released = mark
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
