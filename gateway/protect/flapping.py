"""Flapping detection: a client that connects too often in a short time is banned.

EMQX's ``flapping_detect``: a client id that gets ``max_count`` CONNACKs (accepted or
refused, any authentication path) within ``window_time`` seconds is banned by client id
for ``ban_time`` seconds. The ban goes through the :class:`~gateway.protect.banned.BanGuard`
(so it is stored, listed by ``gatewayctl ban list`` with ``created_by = "flapping"``, and
lifted by ``gatewayctl ban delete``); the connection that crossed the limit is kicked and
later attempts get CONNACK 0x8A.

Invariants:
- Subscribes to ``client.connack``; a CONNACK 0x8A (already banned) is not counted.
- The ban is applied on the next scheduler turn (``call_later(0)``), never from inside
  the CONNECT being answered, so the channel finishes that CONNECT first.
- Memory is bounded: a client id is tracked with at most ``max_count`` timestamps; ids
  silent for a whole window are swept every ``window_time``, and beyond ``max_tracked``
  ids the oldest are dropped.
- Detections are counted (``flapping.detected``) and logged at WARNING.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

from gateway.core.clock import TimerHandle
from gateway.core.node import Node
from gateway.protect.banned import BanGuard
from protocols.context import ClientInfo
from protocols.mqtt.reason_codes import ReasonCode

__all__ = ["FlappingDetector", "FlappingSettings"]

log = logging.getLogger("gateway.protect")


@dataclass(frozen=True, slots=True)
class FlappingSettings:
    max_count: int = 15
    window_time: float = 60.0
    ban_time: float = 300.0
    max_tracked: int = 100_000


class FlappingDetector:
    def __init__(self, node: Node, guard: BanGuard, settings: FlappingSettings) -> None:
        self.node = node
        self.guard = guard
        self.settings = settings
        self._seen: dict[str, deque[float]] = {}
        self._sweeper: TimerHandle | None = None
        self._attached = False

    def __len__(self) -> int:
        """Client ids being tracked."""
        return len(self._seen)

    def attach(self) -> None:
        if self._attached:
            return
        self._attached = True
        self.node.hooks.add("client.connack", self._on_connack)
        self._sweeper = self.node.scheduler.call_later(self.settings.window_time, self._sweep)

    def detach(self) -> None:
        if not self._attached:
            return
        self._attached = False
        self.node.hooks.remove("client.connack", self._on_connack)
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    def _on_connack(self, client: ClientInfo, reason_code: int) -> None:
        if reason_code == ReasonCode.BANNED:
            return
        s = self.settings
        cid = client.client_id
        now = self.node.scheduler.time()
        seen = self._seen.get(cid)
        if seen is None:
            if len(self._seen) >= s.max_tracked:
                self._make_room(now)
            seen = self._seen[cid] = deque(maxlen=s.max_count)
        seen.append(now)
        if len(seen) < s.max_count or seen[0] <= now - s.window_time:
            return
        del self._seen[cid]
        self.node.metrics.incr("flapping.detected")
        log.warning(
            "flapping: client %r (peer %s) connected %d times in %gs; banned for %gs",
            cid,
            client.peer_host,
            s.max_count,
            now - seen[0],
            s.ban_time,
        )
        reason = f"flapping: {s.max_count} connects within {s.window_time:g}s"
        self.node.scheduler.call_later(0.0, lambda: self._ban(cid, reason))

    def _ban(self, cid: str, reason: str) -> None:
        if not self._attached:
            return
        self.guard.ban(
            "clientid", cid, reason=reason, created_by="flapping", duration=self.settings.ban_time
        )

    def _sweep(self) -> None:
        self._sweeper = None
        if not self._attached:
            return
        self._drop_silent(self.node.scheduler.time())
        self._sweeper = self.node.scheduler.call_later(self.settings.window_time, self._sweep)

    def _drop_silent(self, now: float) -> None:
        horizon = now - self.settings.window_time
        for cid in [c for c, seen in self._seen.items() if seen[-1] <= horizon]:
            del self._seen[cid]

    def _make_room(self, now: float) -> None:
        self._drop_silent(now)
        excess = len(self._seen) - self.settings.max_tracked + 1
        if excess > 0:
            for cid in list(self._seen)[:excess]:  # the oldest first seen
                del self._seen[cid]
