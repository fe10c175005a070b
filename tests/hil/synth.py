"""Synthetic records for the expectation and report tests: a small, fully known run."""

from __future__ import annotations

from typing import Any

T0 = 1_000_000.0


class Run:
    """Build an event list by hand; ``t`` is seconds after ``T0``."""

    def __init__(self, devices: int = 2) -> None:
        self.events: list[dict[str, Any]] = []
        self.add(0.0, "phase", name="start", devices=devices)
        for d in range(devices):
            self.add(0.1, "up", d=f"dev{d}", g="g", n=1)
        self.add(0.5, "phase", name="publishing", connected=devices)

    def add(self, t: float, e: str, **fields: Any) -> Run:
        self.events.append({"t": T0 + t, "e": e, **fields})
        return self

    def message(self, t: float, mid: str, *, q: int = 1, acked: bool = True,
                recv: list[float] | None = None, by: str = "collector", k: str = "tele",
                d: str = "dev0", p: bool = True) -> Run:
        self.add(t, "sent", m=mid, g="g", d=d, q=q, k=k, p=p)
        if acked:
            self.add(t + 0.01, "acked", m=mid)
        for r in recv or []:
            self.add(r, "recv", m=mid, by=by)
        return self

    def fault(self, i: int, kind: str, start: float, end: float,
              ready_after: float | None = 0.5) -> Run:
        self.add(start, "fault", kind=kind, i=i)
        self.add(end, "heal", kind=kind, i=i)
        if ready_after is not None:
            self.add(end + ready_after, "ready", i=i, after=ready_after)
        return self

    def finish(self, t: float) -> list[dict[str, Any]]:
        self.add(t, "phase", name="stop")
        return sorted(self.events, key=lambda e: e["t"])
