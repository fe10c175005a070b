"""Node statistics with high-water marks, and message rates from sampled counters.

``stats()`` is the core's counts (``connections.count``, ``sessions.count``,
``subscriptions.count``, ``topics.count``, ``retained.count``) plus a ``.max`` for each:
the highest value seen since start (sampled on every read and every
:data:`SAMPLE_INTERVAL`, and on every connect for connections). ``rates()`` is per second
over the last sampling interval, for ``messages.received``, ``messages.sent`` and
``messages.dropped``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.core.node import Node
from protocols.context import ClientInfo

SAMPLE_INTERVAL = 5.0
RATE_COUNTERS = ("messages.received", "messages.sent", "messages.dropped")


class StatsTracker:
    def __init__(self, node: Node, monotonic: Callable[[], float]) -> None:
        self.node = node
        self._monotonic = monotonic
        self._max: dict[str, int] = {}
        self._last: tuple[float, dict[str, int]] | None = None
        self._rates: dict[str, float] = dict.fromkeys(RATE_COUNTERS, 0.0)

    def attach(self) -> None:
        self.node.hooks.add("client.connected", self._on_connected)

    def detach(self) -> None:
        self.node.hooks.remove("client.connected", self._on_connected)

    def _on_connected(self, client: ClientInfo) -> None:
        n = self.node.connections
        if n > self._max.get("connections.count", 0):
            self._max["connections.count"] = n

    def stats(self) -> dict[str, int]:
        current: dict[str, Any] = self.node.stats()
        out: dict[str, int] = {}
        for key, value in current.items():
            if not isinstance(value, int):
                continue
            out[key] = value
            if key.endswith(".count"):
                mkey = key[: -len(".count")] + ".max"
                high = max(self._max.get(key, 0), value)
                self._max[key] = high
                out[mkey] = high
        return out

    def sample(self) -> None:
        """Take a sample: refresh the high-water marks and the rates."""
        self.stats()
        now = self._monotonic()
        counters = {name: self.node.metrics.get(name) for name in RATE_COUNTERS}
        if self._last is not None:
            then, before = self._last
            dt = now - then
            if dt > 0:
                self._rates = {
                    name: max(0.0, (counters[name] - before[name]) / dt) for name in counters
                }
        self._last = (now, counters)

    def rates(self) -> dict[str, float]:
        return dict(self._rates)
