"""A hand-set clock for tests: a callable returning ``t``, which the test moves."""

from __future__ import annotations


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t
