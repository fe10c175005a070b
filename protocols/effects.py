"""Effects a channel returns instead of performing them.

A channel's handlers return a list whose items are ``bytes`` (write these to the peer, in
order) or one of the small effect objects below. The transport shell is the only code
that carries them out; tests read them directly with a virtual clock.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SetTimer:
    name: str
    seconds: float


@dataclass(frozen=True, slots=True)
class CancelTimer:
    name: str


@dataclass(frozen=True, slots=True)
class Close:
    """Close the connection after writing everything before this effect."""

    reason: str


@dataclass(frozen=True, slots=True)
class Pause:
    """Stop reading from the peer for ``seconds`` (a rate limit), then read again.

    Writes, timers and deliveries carry on meanwhile; a later Pause replaces the end of
    an earlier one only if it ends later.
    """

    seconds: float


@dataclass(frozen=True, slots=True)
class Unheld:
    """The ``count`` effects after this one acknowledge nothing the node's store is
    still writing: a shell whose store has writes to commit may carry them out at once
    instead of holding them for the commit, if nothing of the connection is held yet.
    Only the first effect of a list counts as one; elsewhere, or without a store, it
    means nothing. The MQTT channel puts one before a CONNACK whose session's loss in a
    crash would show the client only what MQTT already tells it to handle (session
    present 0 at its next connect), see ``ConnectResult.connack_early``."""

    count: int


Effect = bytes | SetTimer | CancelTimer | Close | Pause | Unheld


def mark_unheld(out: list[Effect], start: int) -> None:
    """Put an :class:`Unheld` at ``start`` of ``out`` covering what ``out`` holds from
    there on (a channel's CONNACK and its timers)."""
    out.insert(start, Unheld(len(out) - start))
