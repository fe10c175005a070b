"""One bridge's outbox: the ordered queue of messages waiting to go upstream.

Every message a forward rule matches is put here; the upstream client takes entries in
order, and an entry leaves the outbox only when upstream acknowledged it (PUBACK for QoS 1,
PUBCOMP for QoS 2; a PUBACK/PUBREC with an error reason code is an acknowledgement too:
the entry leaves, counted as ``rejected``). A QoS 0 entry has no acknowledgement: it leaves
once written to the connection.

Where entries live:

- ``queue``: unsent entries kept in memory, oldest first;
- ``inflight``: entries sent and awaiting their acknowledgement, by packet id, in the
  order sent (re-sent in that order after a reconnect, with the same packet ids);
- on disk only ("spilled"): once the memory part holds ``memory_bytes`` or
  ``memory_entries``, newer entries are written to the store and not kept; they are read
  back in id order (``refill``) when the memory queue runs low. Everything from
  ``_spill_from`` on is on disk only; everything before it is in memory. So the memory
  part is always the oldest part and ordering is one rule: ascending id.

With a store (the node's ``gateway.db``) every entry is written to disk when it is put,
except a *volatile* entry: a QoS 0 entry put while the link is up and nothing persisted
is waiting ahead of it. It is expected to be written to the socket within the same loop
turn; whoever leaves one behind calls :meth:`Outbox.persist_volatile` (the client does
when it stops sending or the link drops), which writes it with its original id. Without
a store (durability disabled) the outbox is memory only and never spills.

Limits (``OutboxLimits``): ``max_messages``, ``max_bytes`` (topic + payload bytes) and
``max_age``. A full outbox drops its oldest unsent entry (``drop_oldest``) or the new
one (``drop_newest``); an entry older than ``max_age`` or past its MQTT 5 message expiry
is dropped instead of being sent. Every drop goes through ``on_drop(reason, n)``, so
none is silent. Entries already in flight are never dropped (their packet id is in use
upstream). While the memory queue is empty and a refill is pending, a full outbox may
hold a few entries over its limits until the refill brings them back.

Invariants:
- ``count``/``bytes`` are the totals of queue + inflight + spilled entries.
- ids ascend along queue, and every spilled id is greater than every id in memory.
- ``reserved`` holds the packet ids of queued entries loaded with one (QoS 2 sent before
  a restart), which the client re-uses; no new packet id may take them.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gateway.bridge.settings import OutboxLimits
from gateway.bridge.store import OutboxStore
from protocols.mqtt.packets import Properties

log = logging.getLogger("gateway.bridge")

ENTRY_OVERHEAD = 200  # bytes of memory per entry besides topic and payload (approximate)


@dataclass(slots=True, eq=False)
class Entry:
    id: int
    topic: str  # the remote topic
    payload: bytes
    qos: int
    retain: bool
    properties: Properties
    enqueued_at: float
    expires_at: float | None
    size: int
    packet_id: int | None = None
    released: bool = False  # QoS 2: PUBREC received, PUBREL is what remains to send
    persisted: bool = True


class Outbox:
    def __init__(
        self,
        bridge: str,
        limits: OutboxLimits,
        store: OutboxStore | None,
        now: Callable[[], float],
        on_drop: Callable[[str, int], None],
    ) -> None:
        self.bridge = bridge
        self.limits = limits
        self.store = store
        self._now = now
        self._on_drop = on_drop
        self.queue: deque[Entry] = deque()
        self.inflight: dict[int, Entry] = {}
        self.reserved: set[int] = set()
        self.count = 0
        self.bytes = 0
        self.volatile = 0  # entries in queue with persisted False
        self._mem_bytes = 0
        self._spill_from: int | None = None
        self._spill_at: float | None = None  # enqueued_at of the first spilled entry
        self._spilled = 0  # entries on disk only
        self._last_id = 0
        self._ids = itertools.count(1)
        self._refilling = False
        # called when entries became available without a put (a refill finished)
        self.on_ready: Callable[[], None] | None = None

    # -- start-up ------------------------------------------------------------------------

    def load(self) -> int:
        """Take over what the store holds for this bridge (at start-up); the count."""
        store = self.store
        if store is None:
            return 0
        count, size, last_id, oldest = store.summary(self.bridge)
        if not count:
            return 0
        self.count += count
        self.bytes += size
        self._last_id = last_id
        self._spill_from = 0
        self._spill_at = oldest
        self._spilled = count
        self._refill()
        return count

    # -- putting -------------------------------------------------------------------------

    def put(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        properties: Properties,
        expires_at: float | None = None,
        *,
        volatile: bool = False,
    ) -> Entry | None:
        """Queue a message; None when it was dropped (drop_newest, or larger than
        ``max_bytes`` on its own). ``volatile`` (QoS 0 only) asks to skip the disk write
        when nothing persisted waits ahead of it (see the module docstring)."""
        lim = self.limits
        size = len(topic) + len(payload)
        if lim.max_bytes and size > lim.max_bytes:
            self._drop("too_large", 1)
            return None
        if not lim.drop_oldest and self._full(size):
            self._drop("outbox_full", 1)
            return None
        store = self.store
        now = self._now()
        entry_id = store.next_id() if store is not None else next(self._ids)
        entry = Entry(entry_id, topic, payload, qos, retain, properties, now, expires_at, size)
        self._last_id = entry_id
        self.count += 1
        self.bytes += size
        if store is None:
            self._keep(entry)
        elif self._spill_from is not None or not self._memory_room(size):
            if self._spill_from is None:
                self._spill_from = entry_id
                self._spill_at = now
            self._spilled += 1
            self._insert(entry)
        else:
            if volatile and qos == 0 and self.volatile == len(self.queue):
                entry.persisted = False
                self.volatile += 1
            else:
                self._insert(entry)
            self._keep(entry)
        if lim.drop_oldest:
            self._enforce()
        return entry

    def _full(self, size: int) -> bool:
        lim = self.limits
        return bool(
            (lim.max_messages and self.count + 1 > lim.max_messages)
            or (lim.max_bytes and self.bytes + size > lim.max_bytes)
        )

    def _over(self) -> bool:
        lim = self.limits
        return bool(
            (lim.max_messages and self.count > lim.max_messages)
            or (lim.max_bytes and self.bytes > lim.max_bytes)
        )

    def _enforce(self) -> None:
        dropped = 0
        q = self.queue
        while q and self._over():
            self._remove(q.popleft())
            dropped += 1
        if dropped:
            self._drop("outbox_full", dropped)

    def _memory_room(self, size: int) -> bool:
        lim = self.limits
        n = len(self.queue) + len(self.inflight)
        used = self._mem_bytes + size + ENTRY_OVERHEAD
        return n < lim.memory_entries and used <= lim.memory_bytes

    def _keep(self, entry: Entry) -> None:
        self.queue.append(entry)
        self._mem_bytes += entry.size + ENTRY_OVERHEAD
        if entry.packet_id is not None:
            self.reserved.add(entry.packet_id)

    def _insert(self, e: Entry) -> None:
        assert self.store is not None
        self.store.insert(
            self.bridge, e.id, e.topic, e.payload, e.qos, e.retain, e.properties,
            e.enqueued_at, e.expires_at, e.size, e.packet_id, e.released,
        )

    def persist_volatile(self) -> int:
        """Write every volatile entry still queued (the link could not take it now)."""
        n = self.volatile
        if not n:
            return 0
        for e in self.queue:
            if not e.persisted:
                e.persisted = True
                self._insert(e)
        self.volatile = 0
        return n

    # -- taking --------------------------------------------------------------------------

    def peek(self) -> Entry | None:
        """The next entry to send (dropping expired ones first), or None: empty, or
        the rest is on disk and being read back (``on_ready`` is called then)."""
        q = self.queue
        if len(q) <= self.limits.refill_batch // 2:
            self._maybe_refill()
        if not q:
            return None
        expired = 0
        now = self._now()
        max_age = self.limits.max_age
        while q:
            e = q[0]
            if (e.expires_at is not None and e.expires_at <= now) or (
                max_age and now - e.enqueued_at > max_age
            ):
                self._remove(q.popleft())
                expired += 1
                continue
            break
        if expired:
            self._drop("expired", expired)
            if len(q) <= self.limits.refill_batch // 2:
                self._maybe_refill()
        return q[0] if q else None

    def take(self) -> Entry:
        """Remove the entry :meth:`peek` returned from the queue; the caller then calls
        :meth:`sent` (QoS 1/2), :meth:`written` (QoS 0) or :meth:`discard`."""
        e = self.queue.popleft()
        if not e.persisted:
            self.volatile -= 1
        if e.packet_id is not None:
            self.reserved.discard(e.packet_id)
        return e

    def sent(self, e: Entry, packet_id: int) -> None:
        """``e`` went upstream at QoS 1/2 with ``packet_id``; it waits for its ack."""
        if e.qos == 2 and e.packet_id != packet_id and self.store is not None:
            self.store.assign(e.id, packet_id)
        e.packet_id = packet_id
        self.inflight[packet_id] = e

    def written(self, e: Entry) -> None:
        """``e`` was written upstream at QoS 0: it leaves."""
        self._remove(e)

    def discard(self, e: Entry, reason: str) -> None:
        """``e`` (taken, not in flight) cannot be sent at all: it leaves, counted."""
        self._remove(e)
        self._drop(reason, 1)

    def acked(self, packet_id: int, reason_code: int = 0) -> Entry | None:
        """PUBACK (QoS 1) or PUBCOMP (QoS 2), or an error PUBREC (>= 0x80): the entry
        leaves. None when no entry waits for that packet id."""
        e = self.inflight.pop(packet_id, None)
        if e is not None:
            self._remove(e)
            if reason_code >= 0x80:
                self._drop("rejected", 1)
        return e

    def released(self, packet_id: int) -> Entry | None:
        """PUBREC for a QoS 2 entry: from now on PUBREL is what is (re)sent."""
        e = self.inflight.get(packet_id)
        if e is None or e.qos != 2:
            return None
        if not e.released:
            e.released = True
            if self.store is not None:
                self.store.release(e.id)
        return e

    def expire(self) -> None:
        """Drop queued entries older than ``max_age`` (a periodic sweep; sending also
        checks). The oldest are at the front of the memory queue."""
        if self.limits.max_age:
            self.peek()

    # -- state ---------------------------------------------------------------------------

    @property
    def unsent(self) -> int:
        return self.count - len(self.inflight)

    def oldest(self) -> float | None:
        """``enqueued_at`` of the oldest entry, or None when empty."""
        candidates = []
        if self.inflight:
            candidates.append(next(iter(self.inflight.values())).enqueued_at)
        if self.queue:
            candidates.append(self.queue[0].enqueued_at)
        if not candidates and self._spill_at is not None and self._spill_from is not None:
            candidates.append(self._spill_at)
        return min(candidates) if candidates else None

    # -- internals -----------------------------------------------------------------------

    def _remove(self, e: Entry) -> None:
        self.count -= 1
        self.bytes -= e.size
        self._mem_bytes -= e.size + ENTRY_OVERHEAD
        if e.persisted and self.store is not None:
            self.store.delete(e.id)

    def _drop(self, reason: str, n: int) -> None:
        self._on_drop(reason, n)

    def _maybe_refill(self) -> None:
        store = self.store
        if self._spill_from is None or self._refilling or store is None:
            return
        self._refilling = True
        store.after_commit(self._refill)

    def _refill(self) -> None:
        """Read back spilled entries (committed, so the reader sees them) up to the
        memory budget, at least one."""
        self._refilling = False
        store = self.store
        start = self._spill_from
        if store is None or start is None:
            return
        lim = self.limits
        last: int | None = None
        next_at: float | None = None  # enqueued_at of the first entry left on disk
        loaded = 0
        for row in store.rows(self.bridge, start, lim.refill_batch):
            if loaded and not self._memory_room(row[8]):
                next_at = row[6]
                break
            (eid, topic, payload, qos, retain, props, at, exp, size, pid, released) = row
            e = Entry(eid, topic, payload, qos, retain, props, at, exp, size, pid, released)
            self._keep(e)
            last = eid
            next_at = at  # a lower bound when the batch ended first
            loaded += 1
        self._spilled -= loaded
        if last is None:
            if store.dirty:  # the next spilled rows are not committed yet
                self._refilling = True
                store.after_commit(self._refill)
                return
            if self._spilled:
                log.error(
                    "bridge %s: %d outbox entries expected on disk from id %d were not found",
                    self.bridge, self._spilled, start,
                )
                self.count -= self._spilled
                self._spilled = 0
            self._spill_from = self._spill_at = None
            return
        if last >= self._last_id or not self._spilled:
            self._spill_from = self._spill_at = None
        else:
            self._spill_from = last + 1
            self._spill_at = next_at
        if self.limits.drop_oldest:
            self._enforce()
        if self.queue and self.on_ready is not None:
            self.on_ready()
