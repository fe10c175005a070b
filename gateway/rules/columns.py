"""An event's fields as the compiled SQL sees them: computed on first use, shared by
every rule the event matches.

- :class:`Columns`: the event's fields (``getters``: name -> fn(source)), each computed
  once when first read; a missing name is ``None`` (EMQX's undefined). The payload's JSON
  is decoded once (:meth:`Columns.payload_json`).
- ``_Overlay``: the fields a statement selected so far, in front of the columns (a rule's
  own scope: it never writes into the shared columns).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

__all__ = ["Columns", "Scope", "decode_json_container"]

Scope = dict[str, Any]


class Columns(dict[str, Any]):
    """An event's fields, computed on first access by ``getters`` (name -> fn(source)).

    A missing name is ``None``. :meth:`everything` computes every field (``SELECT *``).
    """

    __slots__ = ("getters", "source", "_json")

    def __init__(self, getters: dict[str, Callable[[Any], Any]], source: Any) -> None:
        # (no dict.__init__: the dict is empty already; this runs once per event)
        self.getters = getters
        self.source = source
        self._json: Any = _UNSET

    def __missing__(self, key: str) -> Any:
        getter = self.getters.get(key)
        if getter is None:
            return None
        value = getter(self.source)
        self[key] = value
        return value

    def get(self, key: str, default: Any = None) -> Any:
        value = self[key]
        return default if value is None else value

    def payload_json(self) -> Any:
        """The payload decoded as JSON, once (``None`` when it is not JSON). A getter named
        ``$payload_json`` (the event's raw bytes) is used when there is one."""
        if self._json is _UNSET:
            raw = self.getters.get("$payload_json")
            if raw is not None and not dict.__contains__(self, "payload"):
                self._json = raw(self.source)
            else:
                self._json = _decode(self["payload"])
        return self._json

    def everything(self) -> dict[str, Any]:
        for name in self.getters:
            if name[0] != "$":
                self[name]
        return dict(self)


class _Overlay(dict[str, Any]):
    """Selected fields first, then the columns."""

    __slots__ = ("base",)

    def __init__(self, base: Scope) -> None:
        super().__init__()
        self.base = base

    def __missing__(self, key: str) -> Any:
        return self.base[key]


_UNSET = object()


_WS = frozenset(b" \t\r\n")
_OPEN = frozenset(b"{[")


def decode_json_container(b: bytes | str) -> Any:
    """``b`` decoded when it is a JSON object or array (what a path can step into); None
    otherwise, without paying for an exception in the common non-JSON case."""
    if not b:
        return None
    first = b[0] if isinstance(b, bytes) else ord(b[0])
    if first not in _OPEN:
        if first not in _WS:
            return None
        b = b.lstrip()
        if not b or (b[0] if isinstance(b, bytes) else ord(b[0])) not in _OPEN:
            return None
    try:
        return json.loads(b)
    except ValueError:
        return None


def _decode(v: Any) -> Any:
    if isinstance(v, str | bytes):
        return decode_json_container(v)
    return v


def _root_columns(scope: Scope) -> Columns | None:
    while isinstance(scope, _Overlay):
        scope = scope.base
    return scope if isinstance(scope, Columns) else None
