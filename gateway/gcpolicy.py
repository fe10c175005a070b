"""The garbage collector's policy in a running gatewayd: what survives a full collection
is frozen, and everything is thawed and collected again every ``THAW_EVERY`` seconds.

Why. A broker's long-lived objects grow with its fleet: persistent sessions, their
queued messages, retained messages, routes. CPython's full (generation 2) collection
walks every tracked object, and it runs whenever the objects that reached generation 2
since the last one pass a quarter of those it kept: during a reconnect storm of new
persistent sessions, again and again, each time over all of them. In-process
(``bench.connect_micro persistent 30000``) the full collections cost 18.8 µs of a
57.6 µs connect, each one a pause of about 80 ms at 28,000 sessions. With this policy:
2.3 of 39.6 (bench/README.md, "The garbage collector's full collections").

Invariants:
- After every full collection the survivors are frozen (``gc.freeze``): later
  collections, full ones included, walk only objects made since. Collections run as
  often as before (CPython counts what reaches generation 2, frozen or not).
- Reference counting frees a frozen object as soon as its last reference goes; only
  garbage *cycles* among frozen objects wait for the next thaw, at most
  ``THAW_EVERY`` seconds (a bounded delay, never a leak).
- A thaw unfreezes everything and runs one full collection (one long pause per
  ``THAW_EVERY``), whose survivors are frozen again.
- ``close`` removes the policy and thaws (the process's exit finalizes as usual).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import Any

log = logging.getLogger("gateway.gc")

THAW_EVERY = 600.0  # seconds between full collections of everything


class GcPolicy:
    """Installed on the running loop by :func:`gateway.app.serve`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, thaw_every: float = THAW_EVERY) -> None:
        self.loop = loop
        self.thaw_every = thaw_every
        self.timer: asyncio.TimerHandle | None = None
        self.full = 0  # full collections seen
        self.longest = 0.0  # seconds, the longest full collection seen
        self._started = 0.0

    def install(self) -> None:
        gc.freeze()  # what start-up made (modules, configuration: ~100k objects)
        gc.callbacks.append(self._on_gc)
        self.timer = self.loop.call_later(self.thaw_every, self._thaw_timer)

    def close(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        gc.unfreeze()

    def thaw(self) -> None:
        """Collect everything once (cycles among frozen objects included); the survivors
        are frozen again."""
        frozen = gc.get_freeze_count()
        gc.unfreeze()
        found = gc.collect()
        log.debug("thawed %d frozen objects: %d unreachable found", frozen, found)

    def _thaw_timer(self) -> None:
        self.thaw()
        self.timer = self.loop.call_later(self.thaw_every, self._thaw_timer)

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.full += 1
        self.longest = max(self.longest, time.perf_counter() - self._started)
        gc.freeze()  # the survivors: every tracked object is in generation 2 now
