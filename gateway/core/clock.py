"""Time and timers for the core, behind one small interface.

The core never reads the system clock or sleeps: it asks a :class:`Scheduler`. Production
uses :class:`LoopScheduler` (asyncio); tests use :class:`VirtualScheduler`, whose time moves
only when the test calls ``advance`` — no sleeps, no flakiness.

Invariant: ``time()`` is wall-clock seconds (messages and sessions outlive the process, so
their deadlines must mean the same thing after a restart).
"""

from __future__ import annotations

import heapq
import itertools
import time as _time
from collections.abc import Callable
from typing import Protocol


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    def time(self) -> float: ...
    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle: ...


class EventLoop(Protocol):
    """The part of an asyncio event loop a :class:`LoopScheduler` uses (the core does not
    import asyncio)."""

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle: ...


class LoopScheduler:
    """Timers on an asyncio event loop, wall-clock time."""

    # time.time itself, not a method around it: the hot path asks for the time per message
    time = staticmethod(_time.time)

    def __init__(self, loop: EventLoop) -> None:
        self._loop = loop

    def call_later(self, delay: float, callback: Callable[[], None]) -> TimerHandle:
        return self._loop.call_later(max(0.0, delay), callback)


class _VirtualTimer:
    __slots__ = ("when", "callback", "cancelled")

    def __init__(self, when: float, callback: Callable[[], None]) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualScheduler:
    """A clock that moves only when told to; fires due timers in order."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._heap: list[tuple[float, int, _VirtualTimer]] = []
        self._seq = itertools.count()

    def time(self) -> float:
        return self._now

    def call_later(self, delay: float, callback: Callable[[], None]) -> _VirtualTimer:
        timer = _VirtualTimer(self._now + max(0.0, delay), callback)
        heapq.heappush(self._heap, (timer.when, next(self._seq), timer))
        return timer

    def advance(self, seconds: float) -> None:
        deadline = self._now + seconds
        while self._heap and self._heap[0][0] <= deadline:
            when, _, timer = heapq.heappop(self._heap)
            self._now = max(self._now, when)
            if not timer.cancelled:
                timer.callback()
        self._now = deadline

    def pending(self) -> int:
        return sum(1 for _, _, t in self._heap if not t.cancelled)
