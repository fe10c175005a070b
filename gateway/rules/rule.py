"""A rule as the engine holds it: its compiled SQL, its actions and its metrics.

Kept apart from :mod:`gateway.rules.engine` so that :mod:`gateway.rules.plan` can name
rules without importing the engine that imports it. ``metrics`` and each action slot's
counters are changed only on the loop thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from gateway.rules.actions import Action
from gateway.rules.compiler import Program


@dataclass(slots=True)
class RuleMetrics:
    """A rule's counters. Every event a rule matched ends in exactly one of ``passed``,
    ``failed`` (the statement raised) and ``no_result``, so ``matched`` is their sum (not
    a counter of its own: one increment less per rule and event)."""

    passed: int = 0
    failed: int = 0
    no_result: int = 0
    actions_success: int = 0
    actions_failed: int = 0
    last_error: str | None = None

    @property
    def matched(self) -> int:
        return self.passed + self.failed + self.no_result

    def as_dict(self) -> dict[str, Any]:
        return {
            "matched": self.matched,
            "passed": self.passed,
            "failed": self.failed + self.no_result,
            "failed.exception": self.failed,
            "failed.no_result": self.no_result,
            "actions.total": self.actions_success + self.actions_failed,
            "actions.success": self.actions_success,
            "actions.failed": self.actions_failed,
        }


@dataclass(slots=True)
class ActionSlot:
    function: str
    args: dict[str, Any]
    run: Action
    success: int = 0
    failed: int = 0


@dataclass(slots=True)
class Rule:
    id: str
    sql: str
    program: Program
    actions: list[ActionSlot]
    enable: bool = True
    description: str = ""
    created_at: float = field(default_factory=time.time)
    origin: str = "config"  # config | api
    metrics: RuleMetrics = field(default_factory=RuleMetrics)

    @property
    def topics(self) -> list[str]:
        return [s for s in self.program.sources if not s.startswith("$events/")]

    @property
    def events(self) -> list[str]:
        return [s[len("$events/"):] for s in self.program.sources if s.startswith("$events/")]

    def spec(self) -> dict[str, Any]:
        return {
            "sql": self.sql,
            "actions": [{"function": a.function, "args": a.args} for a in self.actions],
            "enable": self.enable,
            "description": self.description,
            "created_at": self.created_at,
        }
