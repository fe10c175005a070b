"""Named hook points with priorities (the EMQX hook model).

The broker core calls a hook at each fixed point of a client's, session's or message's
life (:data:`HOOK_NAMES`); extensions (authentication, authorization, the retainer,
bridges, metrics) register callbacks there.

Rules:

- Hook names are fixed strings. ``add`` raises ``ValueError`` for a name outside
  :data:`HOOK_NAMES` (plus any ``extra_names`` given to :class:`Hooks`), and so do
  ``run``, ``run_fold`` and ``has`` (checked only when nothing is registered, so the
  hot path pays nothing for it).
- Callbacks run highest :class:`Priority` first; equal priorities run in registration
  order. A callback may be registered once per hook (``ValueError`` otherwise).
- ``run(name, *args)`` calls every callback with ``*args``; return values are ignored.
- ``run_fold(name, args, acc)`` calls each callback with ``(*args, acc)``. A callback
  returns a new accumulator, ``None`` (accumulator unchanged) or ``Stop(value)`` (the
  chain ends and ``value`` is the result). To return ``None`` as a result, use
  ``Stop(None)``.
- A callback that raises is logged with ``logger.exception`` and skipped: the others
  still run, and in a fold the accumulator is left as it was (so the caller's initial
  ``acc`` should be the safe default).
- Adding or removing callbacks while a hook runs is safe: the run uses the callbacks
  registered when it started.

The topic hooks (MQTT extensions, ``gateway/ext``; all folds, called by the core wherever
a topic or filter from a client enters it):

- ``topic.rewrite`` ``(client, action) acc=topic -> topic``: a pure function (the same
  answer every time for the same client and topic), ``action`` "publish" or "subscribe";
  run before authorization, routing, subscribing, unsubscribing and retained delivery.
- ``topic.authorize`` ``(client, action) acc=topic -> topic``: the topic authorization
  checks (an extension strips its own prefix: ``$delayed/N/``, ``$exclusive/``); pure.
- ``client.subscribe`` ``(client, options) acc=filter -> filter | Stop(reason_code)``: the
  filter the session subscribes to, or a refusal (a reason code >= 0x80).
- ``client.unsubscribe`` ``(client,) acc=filter -> filter``.

Invariant: ``_callbacks[name]`` exists exactly when ``name`` has at least one callback
and is the tuple of its callbacks in run order, so ``has`` and an empty ``run`` cost one
dict lookup.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from enum import IntEnum
from typing import Any, Generic, TypeVar

__all__ = ["HOOK_NAMES", "Callback", "Hooks", "Priority", "Stop"]

logger = logging.getLogger(__name__)

HOOK_NAMES: frozenset[str] = frozenset(
    {
        "client.connect",
        "client.connack",
        "client.connected",
        "client.disconnected",
        "client.authenticate",
        "client.authorize",
        "client.subscribe",
        "client.unsubscribe",
        "session.created",
        "session.subscribed",
        "session.unsubscribed",
        "session.resumed",
        "session.discarded",
        "session.takenover",
        "session.terminated",
        "message.publish",
        "message.delivered",
        "message.acked",
        "message.dropped",
        "topic.rewrite",
        "topic.authorize",
    }
)

T = TypeVar("T")

Callback = Callable[..., Any]


class Priority(IntEnum):
    """Named priorities; higher runs first. Any int is accepted where these are."""

    HIGHEST = 1000
    AUTHN = 900
    AUTHZ = 800
    RETAINER = 500
    NORMAL = 0
    LOWEST = -1000


class Stop(Generic[T]):
    """Returned by a fold callback to end the chain with ``value``."""

    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        self.value = value

    def __repr__(self) -> str:
        return f"Stop({self.value!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stop) and other.value == self.value

    def __hash__(self) -> int:
        return hash(("Stop", self.value))


class _Entry:
    __slots__ = ("callback", "priority", "seq")

    def __init__(self, callback: Callback, priority: int, seq: int) -> None:
        self.callback = callback
        self.priority = priority
        self.seq = seq


class Hooks:
    """A registry of hook callbacks (see module docstring)."""

    __slots__ = ("_callbacks", "_entries", "_names", "_seq", "active")

    def __init__(self, extra_names: Iterable[str] = ()) -> None:
        """``extra_names`` adds hook points beyond :data:`HOOK_NAMES` (for extensions)."""
        self._names = HOOK_NAMES | frozenset(extra_names)
        self._entries: dict[str, list[_Entry]] = {}
        self._callbacks: dict[str, tuple[Callback, ...]] = {}
        # the same dict, read-only to others: a per-message path tests a known hook
        # name with ``name in hooks.active`` (what :meth:`has` answers, without a call)
        self.active: Mapping[str, tuple[Callback, ...]] = self._callbacks
        self._seq = 0

    @property
    def names(self) -> frozenset[str]:
        """Every hook name this registry accepts."""
        return self._names

    def _check(self, name: str) -> None:
        if name not in self._names:
            raise ValueError(f"unknown hook name: {name!r}")

    def add(self, name: str, callback: Callback, priority: int = Priority.NORMAL) -> None:
        """Register ``callback`` at hook ``name``."""
        self._check(name)
        entries = self._entries.setdefault(name, [])
        if any(e.callback == callback for e in entries):
            raise ValueError(f"callback {callback!r} already registered at {name!r}")
        self._seq += 1
        entries.append(_Entry(callback, int(priority), self._seq))
        entries.sort(key=lambda e: (-e.priority, e.seq))
        self._callbacks[name] = tuple(e.callback for e in entries)

    def remove(self, name: str, callback: Callback) -> bool:
        """Unregister ``callback`` from hook ``name``; True if it was registered."""
        self._check(name)
        entries = self._entries.get(name)
        if not entries:
            return False
        for i, e in enumerate(entries):
            if e.callback == callback:
                del entries[i]
                break
        else:
            return False
        if entries:
            self._callbacks[name] = tuple(e.callback for e in entries)
        else:
            del self._entries[name]
            del self._callbacks[name]
        return True

    def has(self, name: str) -> bool:
        """True if hook ``name`` has any callback (cheap: guard hot paths with it)."""
        if name in self._callbacks:
            return True
        if name not in self._names:
            self._check(name)
        return False

    def callbacks(self, name: str) -> tuple[Callback, ...]:
        """The callbacks of hook ``name`` in run order."""
        found = self._callbacks.get(name)
        if found is None:
            if name not in self._names:
                self._check(name)
            return ()
        return found

    def run(self, name: str, *args: Any) -> None:
        """Call every callback of ``name`` with ``*args``; errors are logged, not raised."""
        callbacks = self._callbacks.get(name)
        if callbacks is None:
            if name not in self._names:
                self._check(name)
            return
        for callback in callbacks:
            try:
                callback(*args)
            except Exception:
                logger.exception("hook %s: callback %r failed", name, callback)

    def run_fold(self, name: str, args: tuple[Any, ...], acc: T) -> T:
        """Fold ``acc`` through the callbacks of ``name`` (see module docstring)."""
        callbacks = self._callbacks.get(name)
        if callbacks is None:
            self._check(name)
            return acc
        if not args:
            # (``message.publish``, on the publish path) ``callback(acc)``: no argument
            # tuple built per call, as ``callback(*args, acc)`` does (a third of the cost)
            for callback in callbacks:
                try:
                    result = callback(acc)
                except Exception:
                    logger.exception("hook %s: callback %r failed", name, callback)
                    continue
                if result is None or result is acc:
                    continue
                if isinstance(result, Stop):
                    stopped: T = result.value
                    return stopped
                acc = result
            return acc
        for callback in callbacks:
            try:
                result = callback(*args, acc)
            except Exception:
                logger.exception("hook %s: callback %r failed", name, callback)
                continue
            if result is None or result is acc:  # unchanged (the common answer)
                continue
            if isinstance(result, Stop):
                value: T = result.value
                return value
            acc = result
        return acc
