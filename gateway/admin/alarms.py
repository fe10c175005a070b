"""Alarms: conditions an operator should look at, active until they clear.

An alarm has a unique ``name`` (activating it again only updates its message and
details), a one-line ``message`` and JSON-able ``details``. Deactivated alarms move to a
bounded history. Shown by ``/api/v5/alarms``, ``gatewayctl status``, the Prometheus gauges
``gateway_alarms_active`` and ``gateway_alarm{name}``, and published (QoS 0) on
``$SYS/brokers/<node>/alarms/activate`` and ``.../deactivate``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("gateway.admin")

HISTORY = 100


@dataclass(slots=True)
class Alarm:
    name: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)
    activated_at: float = 0.0
    deactivated_at: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "message": self.message,
            "details": self.details,
            "activated": self.deactivated_at is None,
            "activated_at": self.activated_at,
            "deactivated_at": self.deactivated_at,
        }


class Alarms:
    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self._now = now
        self._active: dict[str, Alarm] = {}
        self._history: deque[Alarm] = deque(maxlen=HISTORY)
        # called with (alarm, activated) when one is activated (first time) or cleared:
        # $SYS/brokers/<node>/alarms/activate|deactivate
        self.listeners: list[Callable[[Alarm, bool], None]] = []

    def activate(self, name: str, message: str, details: dict[str, Any] | None = None) -> None:
        alarm = self._active.get(name)
        if alarm is None:
            self._active[name] = new = Alarm(name, message, dict(details or {}), self._now())
            log.info("alarm %s activated: %s", name, message)
            self._tell(new, True)
        else:
            alarm.message = message
            alarm.details = dict(details or {})

    def deactivate(self, name: str) -> bool:
        alarm = self._active.pop(name, None)
        if alarm is None:
            return False
        alarm.deactivated_at = self._now()
        self._history.append(alarm)
        log.info("alarm %s cleared", name)
        self._tell(alarm, False)
        return True

    def _tell(self, alarm: Alarm, activated: bool) -> None:
        for listener in list(self.listeners):
            try:
                listener(alarm, activated)
            except Exception:  # pragma: no cover - a listener never breaks an alarm
                log.exception("alarm listener failed")

    def active(self) -> list[Alarm]:
        return sorted(self._active.values(), key=lambda a: a.activated_at)

    def history(self) -> list[Alarm]:
        return list(self._history)

    def __len__(self) -> int:
        return len(self._active)
