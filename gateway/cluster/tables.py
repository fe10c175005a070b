"""Cluster-wide tables: retained messages, banned clients, built-in users (with their
rules) and the run-time rules, the same on every node.

Each table is a last-writer-wins map: every row carries the stamp of its last write, a
hybrid logical clock (HLC) value ``(wall ms, logical, origin node)``; a row received with a
greater stamp replaces the local one, a smaller or equal one is ignored. A deletion is a
row too (a tombstone), so it wins over older writes like any other write. The merge is
commutative, associative and idempotent, so nodes that saw the same writes in any order,
any number of times, hold the same tables: there is nothing to reconcile after a partition
but exchanging rows.

How rows travel (TABLE frames, JSON, on the control link we dialled to each peer):

- when a control link comes up, each side sends its whole tables (a *snapshot*, in chunks,
  the last marked ``end``), so a node that joins, rejoins or heals gets every row it lacks
  and gives every row the other lacks;
- a local change is sent at once to every linked peer; a row that changed this node's
  table (it was newer) is passed on to every linked peer but the one it came from (a core
  so relays to its replicants and from them, and a full mesh needs no more: a row that is
  not newer stops there).

Where changes come from: the retainer tells of every retained message stored or deleted
(:attr:`gateway.core.retainer.Retainer.on_change`), except while the cluster applies one
itself (``applying``); the database tables are read every ``poll`` seconds and compared
with what this node last had, so a ban added with ``gatewayctl`` (another process) is
found like one added through the API.

Invariants:
- ``Hlc.tick()`` is strictly greater than every stamp this node made or observed.
- A row is applied to the local store only when its stamp is greater than the row's
  current stamp; applying it never produces a local change (no echo).
- After two linked nodes exchanged snapshots and no write happened since, their tables
  are equal (row for row, same stamps).
- Nothing a peer sends is executed: rows are JSON, checked by the table's adapter before
  they are written (a bad row is logged and dropped).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

from gateway.cluster import frames as F
from gateway.store.replicated import RowTable, TableMeta, digest
from protocols.context import Message

log = logging.getLogger("gateway.cluster")

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


class TableSync:
    """Every replicated table of this node, and their exchange with the linked peers."""

    def __init__(self, node: str, send: Callable[[str, bytes], bool],
                 linked: Callable[[], list[str]], *, poll: float = 0.5) -> None:
        self.hlc = Hlc(node)
        self.send = send  # (peer, frame) on our control link to it
        self.linked = linked  # the peers whose control link from us is open
        self.poll_interval = poll
        self.tables: dict[str, Table] = {}
        # peer -> table -> snapshot state ("sent", then "synced" once its snapshot ended)
        self.peer_state: dict[str, dict[str, str]] = {}
        self._pending: list[tuple[str, list[Any], str | None]] = []
        self._flush_handle: asyncio.Handle | None = None
        self._poll_handle: asyncio.TimerHandle | None = None

    # -- tables ----------------------------------------------------------------------

    def add_retained(self, retainer: Any, meta: TableMeta | None = None) -> RetainedTable:
        """The retained messages (restored from disk: their saved stamps with ``meta``,
        else their publish time)."""
        table = RetainedTable(retainer, meta)
        table.load(self.hlc)
        self.tables[table.name] = table
        retainer.on_change = self._retained_changed
        return table

    def add_db(self, rows: RowTable, meta: TableMeta, *, deleted: Value | None = None
               ) -> DbTable:
        table = DbTable(rows, meta, deleted=deleted)
        self.tables[table.name] = table
        for row in table.load(self.hlc):
            self._queue(table.name, row, None)
        return table

    def _retained_changed(self, topic: str, message: Message | None) -> None:
        table = self.tables["retained"]
        assert isinstance(table, RetainedTable)
        if table.applying:
            return
        stamp = self.hlc.tick()
        table.record(topic, stamp, message is not None)
        table.remember(topic, stamp, message)
        table.local_changes += 1
        self._queue("retained", [topic, list(stamp), None if message is None
                                 else encode(message)], None)

    def local_change(self, name: str, key: str, stamp: Stamp | None, value: Value | None
                     ) -> None:
        """A row of table ``name`` written here (``stamp``: a given creation stamp, else
        the clock's next): recorded and sent to every linked peer."""
        table = self.tables[name]
        if stamp is None:
            stamp = self.hlc.tick()
        else:
            self.hlc.observe(stamp)
        table.record(key, stamp, value is not None)
        table.local_changes += 1
        self._queue(name, [key, list(stamp), value], None)

    @contextlib.contextmanager
    def injecting(self, sends_tables: bool) -> Iterator[None]:
        """Context: a peer's DATA forward is being applied. A retained message in it is
        never stamped here (it is not a local write). From a peer that sends tables (its
        HELLO says so) it is not kept at all: its stamped row comes on the control link
        and is applied in stamp order, so a forward queued during a partition and
        delivered after the heal cannot undo a newer write. From a peer without tables
        (an older version, or ``cluster.tables`` off there) it is kept as before."""
        table = self.tables.get("retained")
        if not isinstance(table, RetainedTable):
            yield
            return
        if sends_tables:
            table.retainer.paused = True
        else:
            table.applying = True
        try:
            yield
        finally:
            table.retainer.paused = False
            table.applying = False

    # -- life cycle ------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()

        def tick() -> None:
            self.poll()
            self._poll_handle = loop.call_later(self.poll_interval, tick)

        self._poll_handle = loop.call_later(self.poll_interval, tick)

    def stop(self) -> None:
        for h in (self._poll_handle, self._flush_handle):
            if h is not None:
                h.cancel()
        retained = self.tables.get("retained")
        if isinstance(retained, RetainedTable):
            retained.retainer.on_change = None
            with contextlib.suppress(Exception):
                retained.flush()

    def poll(self) -> None:
        for table in self.tables.values():
            if isinstance(table, RetainedTable):
                try:
                    table.flush()
                except Exception:
                    log.exception("cluster: saving the retained stamps failed")
            if isinstance(table, DbTable):
                try:
                    changes = table.poll(self.hlc)
                except Exception:
                    log.exception("cluster: reading table %s failed", table.name)
                    continue
                for row in changes:
                    self._queue(table.name, row, None)

    # -- the wire --------------------------------------------------------------------

    def _queue(self, tbl: str, row: list[Any], exclude: str | None) -> None:
        self._pending.append((tbl, row, exclude))
        if self._flush_handle is None:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # at start-up, before the loop: the snapshots carry it
            self._flush_handle = loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        pending, self._pending = self._pending, []
        if not pending:
            return
        for peer in self.linked():
            by_table: dict[str, list[list[Any]]] = {}
            for tbl, row, exclude in pending:
                if exclude != peer:
                    by_table.setdefault(tbl, []).append(row)
            for tbl, rows in by_table.items():
                for chunk in chunks(rows):
                    self.send(peer, F.control(F.TABLE, {"t": tbl, "rows": chunk}))

    def link_up(self, peer: str) -> None:
        """Our control link to ``peer`` is up: send it every table."""
        state = self.peer_state.setdefault(peer, {})
        for name, table in self.tables.items():
            rows = table.rows()
            parts = chunks(rows) or [[]]
            for i, chunk in enumerate(parts):
                self.send(peer, F.control(F.TABLE, {
                    "t": name, "rows": chunk, "snapshot": True, "end": i == len(parts) - 1}))
            state[name] = "sent" if state.get(name) != "synced" else "synced"

    def link_down(self, peer: str) -> None:
        self.peer_state.pop(peer, None)

    def received(self, peer: str, msg: dict[str, Any]) -> None:
        """A TABLE frame from ``peer``: merge its rows, pass the newer ones on."""
        name = msg.get("t")
        table = self.tables.get(name) if isinstance(name, str) else None
        rows = msg.get("rows")
        if table is None or not isinstance(rows, list):
            log.warning("cluster: %s sent rows of an unknown table %r", peer, name)
            return
        assert isinstance(name, str)
        batch = table.meta.batch() if isinstance(table, DbTable) else contextlib.nullcontext()
        with batch:
            self._merge_rows(peer, name, table, rows)
        if msg.get("end"):
            self.peer_state.setdefault(peer, {})[name] = "synced"

    def _merge_rows(self, peer: str, name: str, table: Table, rows: list[Any]) -> None:
        for row in rows:
            try:
                if not isinstance(row, list) or len(row) != 3 or not isinstance(row[0], str):
                    raise ValueError("bad row")
                stamp = _stamp(row[1])
                value = row[2]
                if value is not None and not isinstance(value, dict):
                    raise ValueError("bad row value")
                self.hlc.observe(stamp)
                if table.merge(row[0], stamp, value):
                    self._queue(name, row, peer)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("cluster: dropped a row of table %s from %s: %s", name, peer, exc)

    # -- views -----------------------------------------------------------------------

    def view(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, table in self.tables.items():
            peers = {p: s.get(name, "waiting") for p, s in self.peer_state.items()}
            out[name] = {
                "rows": len(table.stamps), "tombstones": len(table.dead),
                "local_changes": table.local_changes, "remote_changes": table.remote_changes,
                "last_change": table.last_change, "peers": peers,
                "state": "synced" if all(s == "synced" for s in peers.values()) else "syncing",
            }
        return out
