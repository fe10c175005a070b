"""Rarely set attributes of per-connection objects, kept out of their slots.

An object with one instance per connection (a channel, a session, a shell) pays 8 bytes
per slot for every connection, also for attributes that stay at their default for almost
all of them (a will, an enhanced-authentication exchange, a lingering close). Such an
attribute is a property over the instance's ``_rare`` dict instead: the getter reads
``_rare`` (the default while it is None or lacks the name), the setter stores through
:func:`rare_set`, which makes the dict on the first non-default value and drops it again
when every rare attribute is back at its default.

Plain properties, not a descriptor class: they compile with mypyc (docs/performance.md),
and a compiled class reads them with a direct call.

Invariants:
- Reading a rare attribute never allocates; it returns the default until a value is set.
- ``_rare`` is None or a non-empty dict holding only non-default values.
"""

from __future__ import annotations

from typing import Any


def rare_set(
    rare: dict[str, Any] | None, name: str, value: object, default: object
) -> dict[str, Any] | None:
    """The ``_rare`` dict after setting ``name`` to ``value``; assign it back."""
    if value is default or value == default:
        if rare is not None:
            rare.pop(name, None)
            if not rare:
                return None
        return rare
    if rare is None:
        return {name: value}
    rare[name] = value
    return rare
