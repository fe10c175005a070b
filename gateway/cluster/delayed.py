"""Delayed messages cluster-wide: every node's pending ``$delayed/N/t`` messages are rows
of the replicated ``delayed`` table (:mod:`gateway.cluster.tables`, last writer wins by
HLC stamp), so a message taken on one node is published even when that node is down at
its due time.

Owns: the ``delayed`` table's rows (this node's, keyed to their pending ids in the
:class:`~gateway.ext.delayed.DelayedPublisher`; the other nodes', held here as values)
and the take-over timer.

Given: this node's name, ``tables`` (stamps local changes and sends them),
``cores_up()`` and ``cores_known()`` (the core members whose links are up, and all
of them, this node excluded), ``origin_up(n)``
(is node ``n`` reachable) and ``grace`` (seconds past a message's due time before another
node takes it over; the cluster uses twice ``heartbeat_timeout``); the
:class:`~gateway.ext.delayed.DelayedPublisher` comes later (``attach``: the extensions
start after the cluster, whose links may already be up).

The rule (docs/cluster.md, "Delayed messages"):

- The node that took a delayed message (its *origin*) writes its row (key
  ``origin/id/publish-ms``, stamp ``(publish ms, 0, origin)``) and, when it publishes it
  or it is cancelled, a tombstone. In the normal case only the origin publishes: once.
- A core that holds another node's row still alive at ``due + grace`` while the origin
  is unreachable takes it over when it is the first, by name, of the cores it sees up
  (the origin excluded): it publishes the message and writes the tombstone. Replicants
  never take over.
- A restarted origin holds its restored messages (``DelayedPublisher.hold``) until it
  has every known core's ``delayed`` snapshot (or ``grace`` passed): a tombstone for one
  of its own rows cancels it there, so what another node published is not published
  again.

Invariants:
- A row's creation stamp is derived from the message (publish time), never re-stamped,
  so the origin's restored row never beats a tombstone written after it.
- Applying a peer's row never produces a local change (no echo).
- At most one node publishes a row while the cores see the same members up; a
  partition (both sides up, each thinking the other down) can publish it once on each
  side; a node killed between publishing and sending its tombstone can have it
  published a second time by the taker.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from gateway.cluster import frames as F
from gateway.cluster.rows import Stamp, Table, Value

if TYPE_CHECKING:
    from gateway.ext.delayed import DelayedPublisher, Pending

log = logging.getLogger("gateway.cluster")

NAME = "delayed"


class Sync(Protocol):
    """What this table needs of :class:`gateway.cluster.tables.TableSync`."""

    peer_state: dict[str, dict[str, str]]  # peer -> table -> "sent" / "synced"

    def local_change(self, name: str, key: str, stamp: Stamp | None, value: Value | None
                     ) -> None: ...


class DelayedTable(Table):
    """The ``delayed`` table of one node (see the module docstring)."""

    name = NAME

    def __init__(self, me: str, tables: Sync, *,
                 cores_up: Callable[[], list[str]], cores_known: Callable[[], list[str]],
                 origin_up: Callable[[str], bool],
                 grace: float, take_over: bool = True) -> None:
        super().__init__()
        self.me = me
        self.publisher: DelayedPublisher | None = None  # attach()
        self.tables = tables
        self._cores_up = cores_up
        self._cores_known = cores_known
        self._origin_up = origin_up
        self.grace = grace
        self.take_over = take_over  # False on a replicant
        self.values: dict[str, Value] = {}  # other nodes' live rows
        self.ids: dict[int, str] = {}  # pending id here -> key
        self.keys: dict[str, int] = {}  # key -> pending id here
        self.taken = 0  # rows this node took over
        self._applying = False
        self._timer: asyncio.TimerHandle | None = None
        self._since = time.monotonic()
        self._held = False

    # -- this node's rows ----------------------------------------------------------------

    def attach(self, publisher: DelayedPublisher) -> None:
        """The publisher started (after the cluster): record its restored messages with
        their original stamps (one another node already published, whose tombstone
        arrived first, is cancelled), hold them until every known core's snapshot
        arrived, send them to the linked peers and follow the publisher's changes."""
        self.publisher = publisher
        for p in list(publisher.pending.values()):
            key, stamp = self._own(p)
            current = self.stamp(key)
            if current is not None and current >= stamp and key in self.dead:
                self._cancel(key)
                continue
            self.tables.local_change(NAME, key, stamp, self._row(p))
        if publisher.pending and not self._synced():
            publisher.hold()
            self._held = True
        self._since = time.monotonic()
        publisher.on_change = self._changed
        self._arm(0.0)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        publisher = self.publisher
        if publisher is not None:
            publisher.on_change = None
            if self._held:
                self._held = False
                publisher.release()

    def _own(self, p: Pending) -> tuple[str, Stamp]:
        ms = int(p.message.timestamp * 1000)
        key = f"{self.me}/{p.id}/{ms}"
        self.ids[p.id] = key
        self.keys[key] = p.id
        return key, (ms, 0, self.me)

    def _changed(self, p: Pending, alive: bool) -> None:
        """The publisher took (``alive``), published or cancelled a message."""
        if self._applying:
            return
        if alive:
            key, stamp = self._own(p)
            self.tables.local_change(NAME, key, stamp, self._row(p))
            return
        key_ = self.ids.pop(p.id, None)
        if key_ is not None:
            self.keys.pop(key_, None)
            self.tables.local_change(NAME, key_, None, None)

    def _row(self, p: Pending) -> Value:
        return {"m": base64.b64encode(F.encode_message(p.message)).decode(), "due": p.due,
                "origin": self.me}

    # -- Table -----------------------------------------------------------------------------

    def value(self, key: str) -> Value | None:
        id_ = self.keys.get(key)
        if id_ is not None and self.publisher is not None:
            p = self.publisher.pending.get(id_)
            return None if p is None else self._row(p)
        return self.values.get(key)

    def check(self, key: str, value: Value | None) -> None:
        origin = key.partition("/")[0]
        if not origin:
            raise ValueError("delayed row: no origin in its key")
        if value is not None:
            due = value.get("due")
            if not isinstance(due, int | float) or isinstance(due, bool):
                raise ValueError("delayed row: bad due time")
            if value.get("origin") != origin:
                raise ValueError("delayed row: origin and key differ")
            _decode(value)

    def apply(self, key: str, value: Value | None) -> None:
        origin = key.partition("/")[0]
        if origin == self.me:
            # another node published (took over) one of ours: not again here
            if value is None:
                self._cancel(key)
            return
        if value is None:
            self.values.pop(key, None)
        else:
            self.values[key] = value
            self._arm(max(0.0, float(value["due"]) + self.grace - time.time()))

    def _cancel(self, key: str) -> None:
        """Another node published (took over) this node's message ``key``."""
        id_ = self.keys.pop(key, None)
        if id_ is None or self.publisher is None:
            return
        self.ids.pop(id_, None)
        self._applying = True
        try:
            if self.publisher.cancel(id_):
                log.info("cluster: delayed message %s was published by another node while "
                         "this one was away: not published again", key)
        finally:
            self._applying = False

    # -- taking over ---------------------------------------------------------------------

    def _arm(self, delay: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        if self._timer is not None:
            if self._timer.when() <= loop.time() + delay:
                return
            self._timer.cancel()
        self._timer = loop.call_later(delay, self._check)

    def _check(self) -> None:
        self._timer = None
        publisher = self.publisher
        if self._held and publisher is not None and self._synced():
            self._held = False
            publisher.release()
        now = time.time()
        cores = self._cores_up()
        nearest: list[float] = []
        for key, value in list(self.values.items()):
            origin = str(value["origin"])
            at = float(value["due"]) + self.grace
            if at > now:
                nearest.append(at)
            elif not self.take_over or publisher is None or self._origin_up(origin):
                # its origin publishes it (or this node cannot): look again later
                nearest.append(now + self.grace)
            elif min([self.me, *(c for c in cores if c != origin)]) != self.me:
                nearest.append(now + self.grace)  # another core takes it over
            else:
                self._take(key, value)
        if self._held:
            nearest.append(now + 0.2)
        if nearest:
            self._arm(max(0.05, min(nearest) - now))

    def _take(self, key: str, value: Value) -> None:
        try:
            message = _decode(value)
        except ValueError as exc:
            log.warning("cluster: delayed row %s dropped: %s", key, exc)
            self.values.pop(key, None)
            return
        self.values.pop(key, None)
        self.taken += 1
        log.warning("cluster: delayed message %s of %s (unreachable) published here, %.1fs "
                    "after its due time", key, value["origin"],
                    time.time() - float(value["due"]))
        assert self.publisher is not None
        self.publisher.publish_for(float(value["due"]), message)
        self.tables.local_change(NAME, key, None, None)

    def _synced(self) -> bool:
        """The other cores' snapshots of this table arrived (or ``grace`` passed): on a
        core, every known core's; on a replicant (linked to one core, which passes on
        the others' rows), its core's."""
        if time.monotonic() - self._since >= self.grace:
            return True
        known = self._cores_known()
        states = self.tables.peer_state
        synced = [states.get(c, {}).get(NAME) == "synced" for c in known]
        return all(synced) if self.take_over else (any(synced) or not known)

    def extra_view(self) -> dict[str, Any]:
        """Added to this table's entry in the cluster view (``GET /api/v5/cluster``)."""
        return {"held": self._held, "taken_over": self.taken,
                "others": len(self.values), "own": len(self.keys)}


def _decode(value: Value) -> Any:
    data = value.get("m")
    if not isinstance(data, str):
        raise ValueError("delayed row without a message")
    try:
        return F.decode_body(base64.b64decode(data, validate=True)).message
    except (F.FrameError, ValueError) as exc:
        raise ValueError(f"bad delayed row: {exc}") from None
