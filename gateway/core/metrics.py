"""Counters and gauges of a node, named the EMQX way (``messages.received``, ...).

Plain dict increments keep the hot path cheap; exposition (Prometheus, ``$SYS``) reads
``snapshot()``. Every drop of a message increments ``messages.dropped`` and one
``messages.dropped.<reason>`` counter, so no loss is silent.
"""

from __future__ import annotations

from collections import defaultdict


class Metrics:
    __slots__ = ("counters",)

    def __init__(self) -> None:
        self.counters: defaultdict[str, int] = defaultdict(int)

    def incr(self, name: str, n: int = 1) -> None:
        self.counters[name] += n

    def get(self, name: str) -> int:
        return self.counters.get(name, 0)

    def dropped(self, reason: str, n: int = 1) -> None:
        self.counters["messages.dropped"] += n
        self.counters["messages.dropped." + reason] += n

    def snapshot(self) -> dict[str, int]:
        return dict(self.counters)
