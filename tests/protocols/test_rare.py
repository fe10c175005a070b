"""protocols.rare: attributes kept out of the slots until set to a non-default value."""

from __future__ import annotations

from typing import Any

from protocols.rare import rare_set


class Thing:
    __slots__ = ("_rare",)

    def __init__(self) -> None:
        self._rare: dict[str, Any] | None = None

    @property
    def will(self) -> str | None:
        r = self._rare
        v: str | None = None if r is None else r.get("will")
        return v

    @will.setter
    def will(self, value: str | None) -> None:
        self._rare = rare_set(self._rare, "will", value, None)

    @property
    def delay(self) -> int:
        r = self._rare
        v: int = 0 if r is None else r.get("delay", 0)
        return v

    @delay.setter
    def delay(self, value: int) -> None:
        self._rare = rare_set(self._rare, "delay", value, 0)


def test_defaults_without_storage() -> None:
    t = Thing()
    assert t.will is None and t.delay == 0 and t._rare is None
    t.will = None
    t.delay = 0
    assert t._rare is None


def test_set_and_back_to_default_drops_the_dict() -> None:
    t, other = Thing(), Thing()
    t.will = "bye"
    t.delay = 5
    assert (t.will, t.delay) == ("bye", 5) and t._rare == {"will": "bye", "delay": 5}
    assert other.will is None and other._rare is None
    t.will = None
    assert t._rare == {"delay": 5}
    t.delay = 0
    assert t._rare is None and t.will is None and t.delay == 0


def test_rare_set_keeps_one_dict() -> None:
    d = rare_set(None, "a", 1, None)
    assert d == {"a": 1}
    assert rare_set(d, "b", 2, None) is d and d == {"a": 1, "b": 2}
    assert rare_set(d, "a", None, None) is d and d == {"b": 2}
    assert rare_set(d, "b", None, None) is None
    assert rare_set(None, "a", None, None) is None
