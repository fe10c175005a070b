"""A result that arrives later, and a hook fold that can wait for one.

The core has no I/O, but some of its hook subscribers do (an HTTP authentication
backend, a password hash computed on a worker thread). Such a subscriber returns a
:class:`Deferred` instead of its answer; :func:`fold_deferred` then suspends the fold and
resumes it with the next subscriber once the answer is there.

Rules:
- A :class:`Deferred` is resolved at most once (later calls are ignored); callbacks
  added after that run at once. Everything happens on the event loop thread: a worker
  thread resolves through ``loop.call_soon_threadsafe``.
- :func:`fold_deferred` follows :meth:`gateway.core.hooks.Hooks.run_fold`: a callback's
  result (or the value its Deferred resolves to) is ``None`` (accumulator unchanged),
  :class:`~gateway.core.hooks.Stop` (the chain ends) or a new accumulator; a callback that
  raises is logged and skipped.
- :func:`fold_deferred` returns ``(True, result)`` when the fold finished without
  waiting (``done`` is then never called), else ``(False, None)`` and calls ``done(result)``
  exactly once later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from gateway.core.hooks import Stop

__all__ = ["Deferred", "fold_deferred"]

log = logging.getLogger("gateway.core.hooks")

T = TypeVar("T")

_UNSET: Any = object()


class Deferred(Generic[T]):
    """A value that is not there yet (see module docstring)."""

    __slots__ = ("_callbacks", "_value")

    def __init__(self) -> None:
        self._value: Any = _UNSET
        self._callbacks: list[Callable[[T], None]] = []

    @property
    def done(self) -> bool:
        return self._value is not _UNSET

    @property
    def value(self) -> T:
        if self._value is _UNSET:
            raise RuntimeError("Deferred not resolved yet")
        value: T = self._value
        return value

    def resolve(self, value: T) -> None:
        if self._value is not _UNSET:
            return
        self._value = value
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(value)
            except Exception:
                log.exception("deferred callback %r failed", callback)

    def add_callback(self, callback: Callable[[T], None]) -> None:
        if self._value is _UNSET:
            self._callbacks.append(callback)
        else:
            callback(self._value)


def fold_deferred(
    name: str,
    callbacks: Sequence[Callable[..., Any]],
    args: tuple[Any, ...],
    acc: Any,
    done: Callable[[Any], None],
) -> tuple[bool, Any]:
    """Fold ``acc`` through ``callbacks`` like ``Hooks.run_fold``, waiting on any
    :class:`Deferred` a callback returns (module docstring). ``name`` is for logs."""
    index = 0
    while index < len(callbacks):
        callback = callbacks[index]
        index += 1
        try:
            result = callback(*args, acc)
        except Exception:
            log.exception("hook %s: callback %r failed", name, callback)
            continue
        if result is None:  # (the usual answer: not mine, next)
            continue
        if isinstance(result, Deferred):
            if result.done:
                result = result.value
            else:
                at = index
                held = acc

                def resume(value: Any, at: int = at, held: Any = held) -> None:
                    stop, out = _apply(value, held)
                    if stop:
                        done(out)
                        return
                    finished, final = fold_deferred(name, callbacks[at:], args, out, done)
                    if finished:
                        done(final)

                result.add_callback(resume)
                return False, None
        stop, acc = _apply(result, acc)
        if stop:
            return True, acc
    return True, acc


def _apply(result: Any, acc: Any) -> tuple[bool, Any]:
    if result is None:
        return False, acc
    if isinstance(result, Stop):
        return True, result.value
    return False, result
