"""protocols.rare: attributes kept out of the slots until set to a non-default value."""

from __future__ import annotations

from typing import Any

from protocols.rare import Rare


class Thing:
    will: Rare[str | None] = Rare(None)
    delay: Rare[int] = Rare(0)

    __slots__ = ("_rare",)

    def __init__(self) -> None:
        self._rare: dict[str, Any] | None = None


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


def test_class_access_gives_the_descriptor() -> None:
    assert isinstance(Thing.will, Rare) and Thing.will.name == "will"
