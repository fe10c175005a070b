"""The garbage collector's policy in a running gatewayd: what survives a full collection
is frozen, and a full collection walks everything again at most every ``THAW_EVERY``
seconds.

Why. A broker's long-lived objects grow with its fleet: persistent sessions, their
queued messages, retained messages, routes. CPython's full (generation 2) collection
walks every tracked object, and it runs whenever the objects that reached generation 2
since the last one pass a quarter of those it kept: during a reconnect storm of new
persistent sessions, again and again, each time over all of them. In-process
(``bench.connect_micro persistent 30000 --freeze``, start-up objects frozen) the full
collections cost 10.3-15.3 µs of a 48-53 µs connect, about 70 ms each at 28,000
sessions; with this policy 2.0-2.5 µs of 38-40, the longest 15-27 ms (bench/README.md,
"CONNACKs that need not wait, a garbage-collector policy, ...").

Invariants:
- After every full collection the survivors are frozen (``gc.freeze``): the next full
  collections walk only objects that reached generation 2 since. (CPython then sizes
  its trigger by those: more full collections, each short.)
- A full collection that starts ``THAW_EVERY`` seconds or more after the last one that
  walked everything walks everything (``gc.unfreeze`` first), so a garbage *cycle*
  among frozen objects waits at most for that one. Reference counting frees every
  other frozen object as soon as its last reference goes. No collection is added: a
  node where nothing reaches generation 2 has none, as without the policy.
- ``close`` removes the policy and thaws (the process's exit finalizes as usual).
- ``ACTIVE`` is the installed policy (one per process), which the Prometheus exposition
  reads (``gateway_gc_*``).
"""

from __future__ import annotations

import gc
import time
from typing import Any

THAW_EVERY = 600.0  # seconds: the least time between full collections of everything

ACTIVE: GcPolicy | None = None


class GcPolicy:
    """Installed by :func:`gateway.app.serve` once the node serves."""

    def __init__(self, thaw_every: float = THAW_EVERY) -> None:
        self.thaw_every = thaw_every
        self.full = 0  # full collections seen
        self.thaws = 0  # of which walked everything
        self.longest = 0.0  # seconds, the longest full collection
        self.seconds = 0.0  # spent in full collections
        self._thawed_at = 0.0
        self._started = 0.0

    def install(self) -> None:
        global ACTIVE
        gc.freeze()  # what start-up made (modules, configuration: ~100k objects)
        self._thawed_at = time.monotonic()
        gc.callbacks.append(self._on_gc)
        ACTIVE = self

    def close(self) -> None:
        global ACTIVE
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        gc.unfreeze()
        if ACTIVE is self:
            ACTIVE = None

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            now = time.monotonic()
            if now - self._thawed_at >= self.thaw_every:
                gc.unfreeze()  # into generation 2, which this collection walks
                self._thawed_at = now
                self.thaws += 1
            self._started = time.perf_counter()
            return
        took = time.perf_counter() - self._started
        self.full += 1
        self.seconds += took
        self.longest = max(self.longest, took)
        gc.freeze()  # the survivors: every tracked object is in generation 2 now
