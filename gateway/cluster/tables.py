"""Cluster-wide tables: retained messages, banned clients, built-in users (with their
rules) and the run-time rules, the same on every node.

Each table is a last-writer-wins map: every row carries the stamp of its last write, a
hybrid logical clock (HLC) value ``(wall ms, logical, origin node)``; a row received with a
greater stamp replaces the local one, a smaller or equal one is ignored. A deletion is a
row too (a tombstone), so it wins over older writes like any other write. The merge is
commutative, associative and idempotent, so nodes that saw the same writes in any order,
any number of times, hold the same tables: there is nothing to reconcile after a partition
but exchanging rows.

The rows themselves (clock, tables, encoding) are in :mod:`gateway.cluster.rows`;
:func:`open_tables` builds this node's set at start (:mod:`gateway.cluster.delayed` adds
the delayed messages).

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
import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gateway.cluster import frames as F
from gateway.cluster.rows import (  # noqa: F401 - the rows' names, re-exported
    CHUNK,
    CHUNK_BYTES,
    TOMBSTONES_MAX,
    DbTable,
    Hlc,
    RetainedTable,
    Stamp,
    Table,
    Value,
    _stamp,
    chunks,
    decode,
    encode,
    fingerprint,
)
from gateway.store.replicated import RowTable, TableMeta
from protocols.context import Message

if TYPE_CHECKING:
    from gateway.cluster.delayed import DelayedTable
    from gateway.cluster.state import Context

log = logging.getLogger("gateway.cluster")


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
            extra = getattr(table, "extra_view", None)
            if extra is not None:  # the delayed table: held, taken over
                out[name].update(extra())
        return out


def open_tables(ctx: Context, tables: TableSync) -> DelayedTable:
    """This node's replicated tables, registered with ``tables`` and started: retained
    messages (with the retainer on), the delayed messages (their publisher is attached
    later, ``Cluster.attach_delayed``), and with a data directory the bans, users,
    auto-subscribe topics and rules; the stamps in ``cluster_tables`` of ``gateway.db``."""
    from gateway.cluster.delayed import DelayedTable
    from gateway.store.db import db_path, open_db
    from gateway.store.replicated import (
        AutoSubscribeRows,
        BannedRows,
        RuleRows,
        UserRows,
    )

    data_dir = ctx.settings.data_dir
    conn = open_db(db_path(data_dir)) if data_dir is not None else None
    meta = TableMeta(conn) if conn is not None else None
    if ctx.node.settings.retainer_enable:
        tables.add_retained(ctx.node.retainer, meta)
    peers = ctx.peers

    def cores(up: bool) -> list[str]:
        return [p.name for p in peers.values()
                if p.role != "replicant" and (not up or p.state == "up")]

    def reachable(name: str) -> bool:
        peer = peers.get(name)
        return peer is not None and peer.state in ("up", "partial")

    delayed = DelayedTable(
        ctx.name, tables, cores_up=lambda: cores(True), cores_known=lambda: cores(False),
        origin_up=reachable, grace=2 * ctx.settings.heartbeat_timeout,
        take_over=not ctx.replicant)
    tables.tables[delayed.name] = delayed
    if data_dir is not None and conn is not None and meta is not None:
        tables.add_db(BannedRows(conn), meta)
        tables.add_db(UserRows(conn), meta)
        tables.add_db(AutoSubscribeRows(conn), meta)
        tables.add_db(RuleRows(Path(data_dir) / "rules.db"), meta, deleted={"spec": None})
    tables.start()
    return delayed
