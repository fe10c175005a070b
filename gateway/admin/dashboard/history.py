"""The overview's last hour: counters sampled every ``dashboard.sample_interval``.

A ring of at most one hour of samples, each ``{"t", "connections", "received", "sent",
"dropped"}`` (the node's cumulative message counters: the browser turns neighbouring
samples into rates). Sampled on the gateway's loop by a timer that the dashboard starts
with the API and cancels when it stops.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

HOUR = 3600.0
COUNTERS = {"received": "messages.received", "sent": "messages.sent",
            "dropped": "messages.dropped"}


class History:
    def __init__(self, interval: float, sample: Callable[[], dict[str, int]],
                 now: Callable[[], float] = time.time) -> None:
        self.interval = interval
        self._sample = sample
        self._now = now
        self.samples: deque[dict[str, Any]] = deque(maxlen=max(2, int(HOUR / interval) + 1))
        self._timer: asyncio.TimerHandle | None = None

    def take(self) -> None:
        self.samples.append({"t": round(self._now(), 3), **self._sample()})

    def start(self) -> None:
        loop = asyncio.get_running_loop()

        def tick() -> None:
            self.take()
            self._timer = loop.call_later(self.interval, tick)

        tick()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def view(self) -> dict[str, Any]:
        return {"interval": self.interval, "samples": list(self.samples)}
