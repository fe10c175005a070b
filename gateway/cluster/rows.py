"""The rows of the cluster-wide tables (:mod:`gateway.cluster.tables` exchanges them):
the hybrid logical clock, a last-writer-wins :class:`Table`, and its two kinds, the
retained messages (:class:`RetainedTable`) and the database tables read through an
adapter of :mod:`gateway.store.replicated` (:class:`DbTable`); their wire encoding.

Invariants:
- ``Hlc.tick()`` is strictly greater than every stamp this node made or observed.
- ``Table.merge`` applies a row only when its stamp is greater than the row's current
  stamp (a tombstone counts as a row); the merge is commutative, associative and
  idempotent.
- Applying a peer's row never produces a local change (no echo): the retained table
  sets ``applying`` around it, the database tables write through their own connection
  and remember the value they wrote.
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Callable
from typing import Any

from gateway.cluster import frames as F
from gateway.store.replicated import RowTable, TableMeta, digest
from protocols.context import Message

Stamp = tuple[int, int, str]
Value = dict[str, Any]
CHUNK = 500  # rows per TABLE frame at most
CHUNK_BYTES = 4 << 20  # ... and about this many bytes of values (frames stay far below
# frames.MAX_FRAME whatever the retained payloads)
TOMBSTONES_MAX = 100_000  # retained deletions remembered (oldest forgotten first)


class Hlc:
    """A hybrid logical clock (Kulkarni et al.): wall-clock milliseconds, a counter for
    events within one millisecond or behind a faster peer, and the node name as tie-break."""

    def __init__(self, node: str, now: Callable[[], float] = time.time) -> None:
        self.node = node
        self._now = now
        self.wall = 0
        self.logical = 0

    def tick(self) -> Stamp:
        pt = int(self._now() * 1000)
        if pt > self.wall:
            self.wall, self.logical = pt, 0
        else:
            self.logical += 1
        return (self.wall, self.logical, self.node)

    def observe(self, stamp: Stamp) -> None:
        wall, logical = stamp[0], stamp[1]
        if (wall, logical) > (self.wall, self.logical):
            self.wall, self.logical = wall, logical


def _stamp(obj: Any) -> Stamp:
    if (isinstance(obj, list) and len(obj) == 3 and isinstance(obj[0], int)
            and isinstance(obj[1], int) and isinstance(obj[2], str)
            and not isinstance(obj[0], bool) and not isinstance(obj[1], bool)):
        return (obj[0], obj[1], obj[2])
    raise ValueError(f"bad stamp {obj!r}")


class Table:
    """One replicated table: the stamps of its rows; values come from the local store."""

    name: str

    def __init__(self) -> None:
        self.stamps: dict[str, Stamp] = {}
        self.dead: dict[str, Stamp] = {}  # tombstones
        self.local_changes = 0
        self.remote_changes = 0
        self.last_change: float | None = None

    def stamp(self, key: str) -> Stamp | None:
        return self.stamps.get(key) or self.dead.get(key)

    def value(self, key: str) -> Value | None:
        raise NotImplementedError

    def apply(self, key: str, value: Value | None) -> None:
        raise NotImplementedError

    def check(self, key: str, value: Value | None) -> None:
        return None

    def saved(self, key: str, stamp: Stamp, value: Value | None) -> None:
        return None

    def record(self, key: str, stamp: Stamp, alive: bool) -> None:
        if alive:
            self.stamps[key] = stamp
            self.dead.pop(key, None)
        else:
            self.stamps.pop(key, None)
            self.dead[key] = stamp
            if len(self.dead) > TOMBSTONES_MAX:
                del self.dead[next(iter(self.dead))]
        self.last_change = time.time()

    def rows(self) -> list[list[Any]]:
        out: list[list[Any]] = []
        for key, stamp in self.stamps.items():
            value = self.value(key)
            if value is not None:
                out.append([key, list(stamp), value])
        out.extend([key, list(stamp), None] for key, stamp in self.dead.items())
        return out

    def merge(self, key: str, stamp: Stamp, value: Value | None) -> bool:
        """Apply a peer's row if it is newer; True when it was."""
        current = self.stamp(key)
        if current is not None and current >= stamp:
            return False
        self.check(key, value)
        self.apply(key, value)
        self.record(key, stamp, value is not None)
        self.saved(key, stamp, value)
        self.remote_changes += 1
        return True


class RetainedTable(Table):
    """Retained messages: key the topic, value the message (the DATA record encoding).

    With a :class:`TableMeta` the stamps and tombstones are kept in ``cluster_tables``
    (value digest: publish time and payload hash), written in one transaction per
    ``poll`` (a crash loses at most the last ``poll`` seconds of stamps: those messages
    get their publish time as stamp again, as without it)."""

    name = "retained"

    def __init__(self, retainer: Any, meta: TableMeta | None = None) -> None:
        super().__init__()
        self.retainer = retainer
        self.applying = False
        self.meta = meta
        self._unsaved: dict[str, tuple[Stamp, Value | None]] = {}

    def remember(self, key: str, stamp: Stamp, message: Message | None) -> None:
        if self.meta is not None:
            self._unsaved[key] = (stamp, None if message is None else fingerprint(message))

    def saved(self, key: str, stamp: Stamp, value: Value | None) -> None:
        self.remember(key, stamp, None if value is None else self.retainer.get(key))

    def flush(self) -> None:
        """Write the stamps remembered since the last flush (one transaction)."""
        meta, unsaved = self.meta, self._unsaved
        if meta is None or not unsaved:
            return
        self._unsaved = {}
        with meta.batch():
            for key, (stamp, value) in unsaved.items():
                meta.save(self.name, key, stamp, value)

    def load(self, hlc: Hlc) -> None:
        """At start: the retained messages restored from disk get their saved stamp
        when the saved digest matches (else their publish time), the saved tombstones
        come back."""
        saved = self.meta.load(self.name) if self.meta is not None else {}
        retainer = self.retainer
        for topic in retainer.topics():
            m = retainer.get(topic)
            if m is None:
                continue
            known = saved.get(topic)
            stamp = (known[0] if known is not None and known[1] == digest(fingerprint(m))
                     else (int(m.timestamp * 1000), 0, ""))
            hlc.observe(stamp)
            self.record(topic, stamp, True)
        for topic, (stamp, d) in saved.items():
            if d is None and topic not in self.stamps:
                hlc.observe(stamp)
                self.record(topic, stamp, False)

    def value(self, key: str) -> Value | None:
        m = self.retainer.get(key)
        return None if m is None else encode(m)

    def check(self, key: str, value: Value | None) -> None:
        if value is not None:
            m = decode(value)
            if m.topic != key:
                raise ValueError("retained row: topic and key differ")

    def apply(self, key: str, value: Value | None) -> None:
        self.applying = True
        try:
            if value is None:
                self.retainer.delete(key)
            else:
                self.retainer.store(decode(value))
        finally:
            self.applying = False


def chunks(rows: list[list[Any]]) -> list[list[list[Any]]]:
    """``rows`` cut into frames of at most :data:`CHUNK` rows and about
    :data:`CHUNK_BYTES` of retained payload (a row bigger than that goes alone)."""
    out: list[list[list[Any]]] = []
    cur: list[list[Any]] = []
    size = 0
    for row in rows:
        value = row[2]
        n = len(value.get("m", "")) if isinstance(value, dict) else 0
        if cur and (len(cur) >= CHUNK or size + n > CHUNK_BYTES):
            out.append(cur)
            cur, size = [], 0
        cur.append(row)
        size += n
    if cur:
        out.append(cur)
    return out


def fingerprint(m: Message) -> Value:
    """What identifies a retained message across a restart (its saved digest)."""
    return {"ts": m.timestamp, "p": hashlib.sha256(m.payload).hexdigest()}


def encode(m: Message) -> Value:
    return {"m": base64.b64encode(F.encode_message(m)).decode()}


def decode(value: Value) -> Message:
    data = value.get("m")
    if not isinstance(data, str):
        raise ValueError("retained row without a message")
    try:
        m = F.decode_body(base64.b64decode(data, validate=True)).message
    except (F.FrameError, ValueError) as exc:
        raise ValueError(f"bad retained row: {exc}") from None
    m.retain = True
    return m


class DbTable(Table):
    """A database table read through a :class:`RowTable` adapter."""

    def __init__(self, rows: RowTable, meta: TableMeta, *, deleted: Value | None = None
                 ) -> None:
        super().__init__()
        self.name = rows.name
        self.rows_ = rows
        self.meta = meta
        self.deleted = deleted  # what a vanished row becomes (rules: a tombstone row)
        self.values: dict[str, Value] = {}
        self._fingerprint: object = None  # of the table when last read

    def value(self, key: str) -> Value | None:
        return self.values.get(key)

    def check(self, key: str, value: Value | None) -> None:
        if not isinstance(key, str):
            raise ValueError("bad key")
        if value is not None and not isinstance(value, dict):
            raise ValueError("bad value")
        self.rows_.check(key, value)

    def apply(self, key: str, value: Value | None) -> None:
        self.rows_.write(key, value)
        if value is None:
            self.values.pop(key, None)
        else:
            self.values[key] = value

    def saved(self, key: str, stamp: Stamp, value: Value | None) -> None:
        self.meta.save(self.name, key, stamp, value)

    def load(self, hlc: Hlc) -> list[list[Any]]:
        """At start: stamps from the meta table; rows changed while the node was down
        (or never stamped) are local changes now. Returns those changes."""
        meta = self.meta.load(self.name)
        for _, (stamp, _d) in meta.items():
            hlc.observe(stamp)
        with self.meta.batch():
            return self._load(hlc, meta)

    def _load(self, hlc: Hlc, meta: dict[str, tuple[Stamp, str | None]]) -> list[list[Any]]:
        changes: list[list[Any]] = []
        self._fingerprint = self.rows_.fingerprint()
        current = self.rows_.read()
        for key, value in current.items():
            known = meta.get(key)
            if known is not None and known[1] == digest(value):
                self.record(key, known[0], True)
                self.values[key] = value
            else:
                changes.extend(self._local(hlc, key, value))
        for key, (stamp, d) in meta.items():
            if key in current:
                continue
            if d is None:
                self.record(key, stamp, False)
            else:
                changes.extend(self._local(hlc, key, self.deleted))
        return changes

    def poll(self, hlc: Hlc) -> list[list[Any]]:
        """The rows that changed locally since the last look, stamped (the table is read
        only when its fingerprint moved)."""
        fingerprint = self.rows_.fingerprint()
        if fingerprint is not None and fingerprint == self._fingerprint:
            return []
        self._fingerprint = fingerprint
        current = self.rows_.read()
        changes: list[list[Any]] = []
        with self.meta.batch():
            for key, value in current.items():
                if self.values.get(key) != value:
                    changes.extend(self._local(hlc, key, value))
            for key in [k for k in self.values if k not in current]:
                changes.extend(self._local(hlc, key, self.deleted))
        return changes

    def _local(self, hlc: Hlc, key: str, value: Value | None) -> list[list[Any]]:
        if value is None and key not in self.values and key in self.dead:
            return []
        if value is not None and value is self.deleted:
            # a vanished row of a table that keeps tombstone rows (rules): write the
            # tombstone, so the next look finds the row as recorded here
            self.rows_.write(key, value)
        stamp = hlc.tick()
        if value is None:
            self.values.pop(key, None)
        else:
            self.values[key] = value
        self.record(key, stamp, value is not None)
        self.saved(key, stamp, value)
        self.local_changes += 1
        return [[key, list(stamp), value]]
