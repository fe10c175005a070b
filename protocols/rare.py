"""Rarely set attributes of per-connection objects, kept out of their slots.

An object with one instance per connection (a channel, a session, a shell) pays 8 bytes
per slot for every connection, also for attributes that stay at their default for almost
all of them (a will, an enhanced-authentication exchange, a lingering close). A
:class:`Rare` class attribute stores such an attribute in the instance's ``_rare`` dict
instead, made on the first write of a non-default value and dropped again when every
rare attribute is back at its default.

Invariants:
- Reading a rare attribute never allocates; it returns the default until a value is set.
- ``_rare`` is None or a non-empty dict holding only non-default values.
"""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar, overload

T = TypeVar("T")


class HasRare(Protocol):
    _rare: dict[str, Any] | None


class Rare(Generic[T]):
    """A class attribute: ``will: Rare[Message | None] = Rare(None)``."""

    __slots__ = ("default", "name")

    def __init__(self, default: T) -> None:
        self.default = default
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, objtype: type | None = None) -> Rare[T]: ...
    @overload
    def __get__(self, obj: HasRare, objtype: type | None = None) -> T: ...
    def __get__(self, obj: HasRare | None, objtype: type | None = None) -> T | Rare[T]:
        if obj is None:
            return self
        rare = obj._rare
        if rare is None:
            return self.default
        value: T = rare.get(self.name, self.default)
        return value

    def __set__(self, obj: HasRare, value: T) -> None:
        rare = obj._rare
        default = value is self.default or value == self.default
        if rare is None:
            if not default:
                obj._rare = {self.name: value}
            return
        if default:
            rare.pop(self.name, None)
            if not rare:
                obj._rare = None
        else:
            rare[self.name] = value
