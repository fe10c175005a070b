"""The datagram shell, played for one peer in channel tests (no sockets, a virtual clock).

:class:`DatagramWire` is what the CoAP, LwM2M and MQTT-SN channel tests share: it is the
channel's :class:`~protocols.context.ConnectionHandle`, carries out the effects it
returns (timers on the virtual clock, ``Close`` then ``connection_lost`` as the real
shell does), keeps what the channel wrote, decoded by the subclass's ``decode_out``, and
fires due timers in order, each at its own time (``advance``).

Invariants it checks: nothing is written after ``Close``; nothing reaches the channel
through ``call_channel`` once it is closed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from gateway.core.clock import VirtualScheduler
from gateway.net.datagram import DatagramChannel
from protocols.context import Delivery
from protocols.effects import CancelTimer, Close, Effect, SetTimer

C = TypeVar("C", bound=DatagramChannel)
R = TypeVar("R")


class DatagramWire(Generic[C, R]):
    """Subclasses set ``self.channel`` (made with ``self`` as its handle), then call
    ``super().__init__(clock)``."""

    channel: C

    def __init__(self, clock: VirtualScheduler) -> None:
        self.clock = clock
        self.timers: dict[str, float] = {}
        self.closed: str | None = None
        self.received: list[R] = []
        self._run(self.channel.connection_made())

    def decode_out(self, data: bytes) -> R:
        """A datagram the channel wrote, as the test reads it."""
        raise NotImplementedError

    # ConnectionHandle
    def deliver(self, deliveries: list[Delivery]) -> None:
        self._run(self.channel.deliver(deliveries))

    def release(self, packet_id: int) -> None:
        self._run(self.channel.release(packet_id))

    def kick(self, reason_code: int) -> None:
        self._run(self.channel.kick(reason_code))

    def call_channel(self, fn: Callable[[], list[Effect]]) -> None:
        if self.closed is None:
            self._run(fn())

    def _run(self, effects: list[Effect]) -> None:
        for e in effects:
            if isinstance(e, bytes):
                assert self.closed is None, "wrote after close"
                self.received.append(self.decode_out(e))
            elif isinstance(e, SetTimer):
                self.timers[e.name] = self.clock.time() + e.seconds
            elif isinstance(e, CancelTimer):
                self.timers.pop(e.name, None)
            elif isinstance(e, Close):
                self.closed = e.reason
                self.timers.clear()
                self.channel.connection_lost()

    def send_raw(self, data: bytes) -> None:
        self._run(self.channel.handle_datagram(data))

    def advance(self, seconds: float) -> None:
        """Move the clock, firing due timers in order (each at its own time)."""
        end = self.clock.time() + seconds
        while True:
            due = [(w, n) for n, w in self.timers.items() if w <= end]
            if not due or self.closed:
                break
            when, name = min(due)
            self.clock.advance(max(0.0, when - self.clock.time()))
            del self.timers[name]
            self._run(self.channel.on_timer(name))
        self.clock.advance(max(0.0, end - self.clock.time()))

    def take(self) -> list[R]:
        out, self.received = self.received, []
        return out
