"""What the LwM2M server keeps per endpoint beyond one channel, sans-IO: the registration
and the downlink commands not yet answered.

A channel is one device *address*; the registry is keyed by endpoint name and shared by
every LwM2M channel of the node, so that what matters outlives a channel:

- a device registering again from another address (NAT rebinding, a reboot) finds the
  commands queued for it;
- an update (``POST /rd/{ep}``) reaching a channel that did not see the register (the
  address changed, or gatewayd restarted) is accepted while the registration's lifetime
  runs;
- with a :class:`Journal` (the node's SQLite file, :mod:`gateway.store.lwm2m`), both
  survive a restart of gatewayd, including ``kill -9``: a command is journaled before the
  publisher's PUBACK leaves (the store's commit gate) and deleted once it is answered.

Invariants:
- A command stays in the registry from its arrival until it is answered (a response,
  an error, ``coap_timeout``, a drop by the queue bound) or its endpoint is forgotten
  (deregistration, lifetime expiry); a command being sent stays too, so a restart or a
  takeover sends it again (at least once).
- ``seq`` grows in arrival order across endpoints; an endpoint's commands are served in
  ``seq`` order.
- Commands exist only for an endpoint with a registration.
- The journal sees every change, in the order it happened.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class Registration:
    ep: str
    data: dict[str, Any]  # the register event's data: lt, lwm2m, b, objectList, ...
    expires_at: float  # wall clock
    commands: dict[int, bytes] = field(default_factory=dict)  # seq -> the MQTT command


class Journal(Protocol):
    """Where the registry's changes go to survive a restart."""

    def registered(self, ep: str, data: dict[str, Any], expires_at: float) -> None: ...
    def forgotten(self, ep: str) -> None: ...
    def queued(self, ep: str, seq: int, payload: bytes, at: float) -> None: ...
    def done(self, seq: int) -> None: ...


class Registry:
    def __init__(self, journal: Journal | None = None) -> None:
        self.journal = journal
        self.endpoints: dict[str, Registration] = {}
        self._next_seq = 1

    def restore(self, registrations: Iterable[Registration], now: float) -> tuple[int, int]:
        """Load what the journal kept; registrations whose lifetime ended while we were
        down are forgotten. Returns ``(endpoints, commands)`` kept."""
        kept = 0
        for r in registrations:
            self._next_seq = max([self._next_seq, *(s + 1 for s in r.commands)])
            if r.expires_at <= now:
                if self.journal is not None:
                    self.journal.forgotten(r.ep)
                continue
            self.endpoints[r.ep] = r
            kept += len(r.commands)
        return len(self.endpoints), kept

    def get(self, ep: str, now: float) -> Registration | None:
        r = self.endpoints.get(ep)
        if r is not None and r.expires_at <= now:
            self.forget(ep)
            return None
        return r

    def sweep(self, now: float) -> int:
        """Forget the registrations whose lifetime ended (their device never came back
        after a kick or a restart); how many."""
        gone = [ep for ep, r in self.endpoints.items() if r.expires_at <= now]
        for ep in gone:
            self.forget(ep)
        return len(gone)

    def register(self, ep: str, data: dict[str, Any], expires_at: float) -> Registration:
        r = self.endpoints.get(ep)
        if r is None:
            r = self.endpoints[ep] = Registration(ep, data, expires_at)
        else:
            r.data, r.expires_at = data, expires_at
        if self.journal is not None:
            self.journal.registered(ep, data, expires_at)
        return r

    def forget(self, ep: str) -> None:
        if self.endpoints.pop(ep, None) is not None and self.journal is not None:
            self.journal.forgotten(ep)

    def queue(self, ep: str, payload: bytes, now: float) -> int | None:
        """Keep a command; its ``seq``, or None when the endpoint is not registered."""
        r = self.endpoints.get(ep)
        if r is None:
            return None
        seq = self._next_seq
        self._next_seq += 1
        r.commands[seq] = payload
        if self.journal is not None:
            self.journal.queued(ep, seq, payload, now)
        return seq

    def done(self, ep: str, seq: int) -> None:
        r = self.endpoints.get(ep)
        if r is not None and r.commands.pop(seq, None) is not None and self.journal is not None:
            self.journal.done(seq)

    def commands(self, ep: str) -> list[tuple[int, bytes]]:
        r = self.endpoints.get(ep)
        return sorted(r.commands.items()) if r is not None else []
