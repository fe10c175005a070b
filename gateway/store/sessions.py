"""Durable sessions and retained messages: the node's SQLite file and its journal log.

:class:`SessionStore` is the journal the core writes through (``Session``, ``Node`` and
``Retainer`` call it for persistent sessions only) and the loader that rebuilds the
core's state at start-up. Writes go through a :class:`GroupCommitter`, so the transport
shell can hold acknowledgements until they are durable.

What is persisted, and where:
- in SQLite (a statement per change, committed by the group commit): every retained
  message;
- in the journal log first (:mod:`gateway.store.journal_log`: records appended to a
  file, one frame per group commit) and in SQLite from the next checkpoint on: a
  session whose expiry interval is > 0 (its row) and its subscriptions, every QoS 1/2
  delivery queued or inflight for such a session (its ``queue`` row, with
  its packet id once assigned and whether its PUBREC arrived), the packet ids of
  incoming QoS 2 messages awaiting PUBREL, and message bodies: in the queue row itself
  (columns ``topic`` to ``expires_at``) when the message went to one persistent session
  and its payload is at most ``INLINE_MAX`` bytes; otherwise, or once a second queue row
  of it exists, also once in table ``messages``, referenced by ``msg_id``.
QoS 0 deliveries and sessions with expiry 0 live in memory only.

The loop appends a record per change to the open :class:`LogSegment` of the batch (one
list append) and keeps the current *generation's* :class:`Delta` (one dict operation):
rows added since the last checkpoint by ref, removals of older rows, and so on. A
checkpoint (every ``CHECKPOINT_EVERY`` seconds while the log is written, as soon as the
log file reaches ``CHECKPOINT_BYTES``, on a space fault and at close) starts a new
generation; the writer applies the old delta to SQLite in the commit of the batch that
carries it, and recycles the old log file only after that commit. A delivery queued and
acknowledged between two checkpoints never reaches SQLite.

Invariants:
- Once a batch is committed, a queue row exists in SQLite with the log replayed over it
  exactly while its delivery is in a persistent session's ``inflight`` or ``mqueue``;
  ``ref`` orders a session's rows as they were queued. Refs and message ids are never
  reused (counters above every stored one, log included: start-up checkpoints the log
  before it reads the counters).
- What a crash leaves: (a) before a batch's log frame is complete, a torn tail, cut off
  at replay: nothing of that batch was acknowledged (a session's row, subscriptions and
  queue rows are all records, so a frame has a session's changes whole; a batch's
  retained messages, SQL, commit before its frame); (b) queue rows of no session
  (a file of an older version, which kept sessions in SQLite only) are removed at
  start-up; (c) during a checkpoint, before
  its commit: SQLite as before, every log file kept: replay gives the same state; after
  its commit and before the old file is recycled: records SQLite already has, which
  replay applies again (every record sets a key: idempotent).
- Every queue row can find its body: in its own columns (``topic`` not NULL), or else
  in the ``messages`` row ``msg_id``. A message gets its ``messages`` row in the same
  batch as its second queue row, or before it (the first row keeps its inline copy;
  both are the same message).
- A ``messages`` row is deleted with the last queue row of it that this process counted
  (written or loaded); rows unreferenced by any queue row otherwise (their session was
  deleted whole) are garbage, removed at start-up. A body is never deleted while a queue
  row of it exists.
- Start-up: SQLite as it is, then every log file of the last run replayed over it in
  generation order, applied to SQLite in one transaction, then the files deleted and
  the state loaded. If the disk has no room for that transaction, or it fails, the files
  stay, their delta becomes the first checkpoint's, and the state loads from an
  in-memory copy with the delta applied.
- A checkpoint waits while the disk lacks room for it (twice its rows' bytes; the
  records are durable in the log meanwhile): a full disk is never filled further by
  moving data from the log into SQLite, at run time, at start-up or at a clean stop.
- A damaged frame (valid ones after it) raises ``store_salvaged``.
- A file made before inline bodies gets the columns at start-up (:func:`upgrade_schema`);
  its rows (``topic`` NULL) keep their bodies in ``messages``.
"""

from __future__ import annotations

import json
import logging
import shutil
import sqlite3
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.store.journal_log import (
    PREALLOCATE,
    QUEUE_COLS,
    Delta,
    JournalLog,
    LogSegment,
    Replayed,
    apply_deltas,
    checkpoint_room,
    log_bytes,
    log_dir,
    log_files,
    replay,
)
from gateway.store.writer import GroupCommitter
from protocols.context import Delivery, Message, SubOptions
from protocols.mqtt.packets import NO_PROPERTIES, Properties

log = logging.getLogger("gateway.store")

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions(
    client_id TEXT PRIMARY KEY,
    expiry_interval INTEGER NOT NULL,
    disconnected_at REAL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS subscriptions(
    client_id TEXT NOT NULL,
    filter TEXT NOT NULL,
    qos INTEGER NOT NULL,
    no_local INTEGER NOT NULL,
    rap INTEGER NOT NULL,
    rh INTEGER NOT NULL,
    sid INTEGER,
    PRIMARY KEY (client_id, filter)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS messages(
    id INTEGER PRIMARY KEY,
    topic TEXT NOT NULL,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    props TEXT,
    publisher TEXT,
    username TEXT,
    ts REAL,
    expires_at REAL
);
CREATE TABLE IF NOT EXISTS queue(
    ref INTEGER PRIMARY KEY,
    client_id TEXT NOT NULL,
    msg_id INTEGER NOT NULL,
    qos INTEGER NOT NULL,
    retain INTEGER NOT NULL,
    sub_ids TEXT,
    packet_id INTEGER,
    released INTEGER NOT NULL DEFAULT 0,
    share TEXT,
    topic TEXT,
    payload BLOB,
    mqos INTEGER,
    mretain INTEGER,
    props TEXT,
    publisher TEXT,
    username TEXT,
    ts REAL,
    expires_at REAL
);
CREATE INDEX IF NOT EXISTS queue_by_client ON queue(client_id, ref);
CREATE TABLE IF NOT EXISTS awaiting_rel(
    client_id TEXT NOT NULL,
    packet_id INTEGER NOT NULL,
    PRIMARY KEY (client_id, packet_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS retained(
    topic TEXT PRIMARY KEY,
    payload BLOB NOT NULL,
    qos INTEGER NOT NULL,
    props TEXT,
    publisher TEXT,
    username TEXT,
    ts REAL,
    expires_at REAL
);
"""

_PROP_FIELDS = (
    "payload_format_indicator",
    "message_expiry_interval",
    "content_type",
    "response_topic",
    "correlation_data",
    "user_properties",
)


# the columns of an inline body, added to ``queue`` after its first release
_INLINE_COLUMNS = (
    ("topic", "TEXT"),
    ("payload", "BLOB"),
    ("mqos", "INTEGER"),
    ("mretain", "INTEGER"),
    ("props", "TEXT"),
    ("publisher", "TEXT"),
    ("username", "TEXT"),
    ("ts", "REAL"),
    ("expires_at", "REAL"),
)


def upgrade_schema(conn: sqlite3.Connection) -> None:
    """Give a ``queue`` table made before inline bodies their columns (idempotent)."""
    have = {r[1] for r in conn.execute("PRAGMA table_info(queue)")}
    if not have:
        return
    for name, kind in _INLINE_COLUMNS:
        if name not in have:
            conn.execute(f"ALTER TABLE queue ADD COLUMN {name} {kind}")


def dump_props(p: Properties) -> str | None:
    if p is NO_PROPERTIES:
        return None
    d: dict[str, Any] = {}
    for name in _PROP_FIELDS:
        v = getattr(p, name)
        if v is None or v == ():
            continue
        if name == "correlation_data":
            v = v.hex()
        d[name] = v
    return json.dumps(d, separators=(",", ":")) if d else None


def load_props(s: str | None) -> Properties:
    if not s:
        return NO_PROPERTIES
    d = json.loads(s)
    if "correlation_data" in d:
        d["correlation_data"] = bytes.fromhex(d["correlation_data"])
    if "user_properties" in d:
        d["user_properties"] = tuple((k, v) for k, v in d["user_properties"])
    return Properties(**d)


_QUEUE_COLS = QUEUE_COLS
_BODY = 9  # the first inline column of a queue row
_NO_BODY = (None,) * 9
# Bodies of at most this many payload bytes go inline. A queue row is updated later
# (its packet id once an offline session's queue drains), and SQLite rewrites the whole
# row: a row with overflow pages (a body of a few KiB) would be written twice, and on a
# full disk such an update needs room a small row does not (the disk-full recovery of
# tests/gateway/store/test_storage_faults.py). Below this, the row stays inside one
# leaf page, which the update writes anyway.
INLINE_MAX = 1024
# a checkpoint (the log's pending rows into SQLite, its files recycled) at least this
# often while the log is written, and as soon as the log file reaches CHECKPOINT_BYTES
# (SQLite's WAL limit, gateway.store.db, for the same reason: a small card holds the
# log and the rows it carries into SQLite at the same time)
CHECKPOINT_EVERY = 5.0
CHECKPOINT_BYTES = 1024 * 1024
DELETE_AHEAD_ROOM = 128 * 1024  # free bytes a deferred checkpoint's deletions need
_TICK = 0.5


class Reporting(Protocol):
    """Where start-up reports a damaged log (:class:`gateway.admin.admin.Admin`)."""

    @property
    def alarms(self) -> Any: ...
    @property
    def salvage_reports(self) -> list[dict[str, Any]]: ...


@dataclass
class StoredSession:
    client_id: str
    expiry_interval: int
    disconnected_at: float | None
    created_at: float
    subscriptions: dict[str, SubOptions] = field(default_factory=dict)
    deliveries: list[Delivery] = field(default_factory=list)  # in queue order
    released: set[int] = field(default_factory=set)
    awaiting_rel: set[int] = field(default_factory=set)


class SessionStore:
    def __init__(
        self,
        conn: sqlite3.Connection,
        committer: GroupCommitter,
        reporting: Reporting | None = None,
    ) -> None:
        self.conn = conn  # used on the loop thread for start-up reads only
        self.committer = committer
        self.reporting = reporting
        self._next_msg = 1
        self._next_ref = 1
        # message id -> how many queue rows this process wrote or loaded for it and has
        # not deleted, for the messages with two or more (a message with a store_id and
        # no entry has one: a message for one session costs nothing here). Rows deleted
        # with their whole session are not counted down: their bodies stay until the
        # next start-up collects them.
        self._msg_refs: dict[int, int] = {}
        # ids of the messages with a ``messages`` row (written or pending): those that
        # reached a second queue row. The others have their body inline in their one row.
        self._bodies: set[int] = set()
        self._is_open = committer.is_open
        upgrade_schema(conn)
        db = conn.execute("PRAGMA database_list").fetchone()[2]
        if not db:
            raise ValueError("the session store needs a database file (its log goes beside it)")
        self.log_dir = log_dir(db)
        found = log_files(self.log_dir)
        self._gen = found[-1][0] + 1 if found else 1
        self._replay_below = self._gen  # the files left by the last run
        if committer.log is None:
            committer.log = JournalLog(self.log_dir, self._gen)
        self._log = committer.log
        committer.before_close = self._closing
        # the current generation's changes for the next checkpoint, and its open segment
        self._delta = Delta()
        self._rows = self._delta.rows
        self._seg: LogSegment | None = None
        self._segments = 0  # segments of the current generation
        self._checkpointed_at = time.monotonic()
        self._timer: Any = None
        self._room_checked_at = 0.0
        self.deferring = False  # checkpoints wait for room (see _checkpoint_if_room)
        self.replayed: Replayed | None = None

    # -- start-up ------------------------------------------------------------------

    def _replay(self) -> sqlite3.Connection:
        """Apply the log files of the last run to SQLite (and delete them); the
        connection to load from. If SQLite cannot take them (a full disk), the files
        stay, their delta becomes the first checkpoint's, and the state loads from an
        in-memory copy with the delta applied."""
        c = self.conn
        r = self.replayed = replay(self.log_dir, self._replay_below)
        if r.damage:
            self._report_damage(r)
        if r.torn:  # a frame cut by the crash (never acknowledged), zeros, old frames
            log.debug("journal log: replay stopped at %s", ", ".join(
                f"{p.name}:{off}" for p, off in r.torn))
        # queue rows of sessions that do not exist (a crash between the log frame and
        # the SQLite commit of one batch, which acknowledged neither) are garbage
        if r.delta.empty():
            c.execute("DELETE FROM queue WHERE client_id NOT IN (SELECT client_id FROM sessions)")
            return c
        room = checkpoint_room(self.log_dir, [r.delta])
        if not room.fits:
            log.warning("journal log: %d frames not checkpointed at start-up, %s free and "
                        "about %s needed; kept, loaded from memory", r.frames,
                        _kib(room.free), _kib(room.need))
            return self._load_from_memory(r.delta)
        try:
            apply_deltas(c, [r.delta])
            c.execute("DELETE FROM queue WHERE client_id NOT IN (SELECT client_id FROM sessions)")
        except sqlite3.Error as exc:
            log.error("journal log: %d frames could not be checkpointed (%s); kept, "
                      "loaded from memory", r.frames, exc)
            return self._load_from_memory(r.delta)
        for gen, path in log_files(self.log_dir):
            if gen < self._replay_below:
                path.unlink(missing_ok=True)
        return c

    def _load_from_memory(self, delta: Delta) -> sqlite3.Connection:
        """The log files stay; their delta becomes the first checkpoint's (taken once
        the disk has room for it) and the state loads from an in-memory copy of SQLite
        with the delta applied."""
        mem = sqlite3.connect(":memory:", isolation_level=None)
        self.conn.backup(mem)
        apply_deltas(mem, [delta])
        self._delta = delta
        self._rows = delta.rows
        self._segments = 1
        return mem

    def _report_damage(self, r: Replayed) -> None:
        first = r.damage[0]
        lost = sum(d.lost_bytes for d in r.damage)
        copy = first.path.with_name(f"{first.path.name}.damaged-{int(time.time())}")
        try:
            shutil.copyfile(first.path, copy)
        except OSError:
            copy = first.path
        msg = (f"journal log {first.path} damaged at offset {first.offset}: {lost} bytes in "
               f"{len(r.damage)} place(s) skipped, the frames around them replayed; copy in {copy}")
        log.error("%s", msg)
        if self.reporting is not None:
            details = {"path": str(first.path), "copy": str(copy), "lost_bytes": lost,
                       "damage": [d.as_dict() for d in r.damage]}
            self.reporting.alarms.activate("store_salvaged", msg, details)
            self.reporting.salvage_reports.append({"summary": msg, **details})

    def load(self) -> tuple[list[StoredSession], list[Message]]:
        """Everything persisted (SQLite, then the journal log replayed over it), as the
        core needs it; also collects garbage. Starts the checkpoint timer."""
        c = self._replay()
        try:
            return self._load(c)
        finally:
            if c is not self.conn:
                c.close()
            self._start_timer()

    def _load(self, c: sqlite3.Connection) -> tuple[list[StoredSession], list[Message]]:
        refs: dict[int, int] = {}
        c.execute("DELETE FROM messages WHERE id NOT IN (SELECT msg_id FROM queue)")
        # message ids live in queue rows too (inline bodies have no messages row)
        self._next_msg = max(
            c.execute("SELECT MAX(id) FROM messages").fetchone()[0] or 0,
            c.execute("SELECT MAX(msg_id) FROM queue").fetchone()[0] or 0,
        ) + 1
        self._next_ref = (c.execute("SELECT MAX(ref) FROM queue").fetchone()[0] or 0) + 1
        sessions: dict[str, StoredSession] = {}
        for cid, expiry, disc, created in c.execute(
            "SELECT client_id, expiry_interval, disconnected_at, created_at FROM sessions"
        ):
            sessions[cid] = StoredSession(cid, expiry, disc, created)
        for cid, f, qos, nl, rap, rh, sid in c.execute(
            "SELECT client_id, filter, qos, no_local, rap, rh, sid FROM subscriptions"
        ):
            s = sessions.get(cid)
            if s is not None:
                s.subscriptions[f] = SubOptions(qos, bool(nl), bool(rap), rh, sid)
        messages: dict[int, Message] = {}
        for row in c.execute(
            "SELECT id, topic, payload, qos, retain, props, publisher, username, ts, "
            "expires_at FROM messages"
        ):
            m = Message(
                row[1], row[2], row[3], bool(row[4]), load_props(row[5]), row[6] or "",
                row[7], row[8] or 0.0, row[9],
            )
            m.store_id = row[0]
            messages[row[0]] = m
        bodies = set(messages)
        for row in c.execute(f"SELECT {_QUEUE_COLS} FROM queue ORDER BY ref"):
            ref, cid, msg_id, qos, retain, sub_ids, pid, released, share = row[:_BODY]
            s = sessions.get(cid)
            if s is None:
                continue
            body = messages.get(msg_id)
            if body is None:
                if row[_BODY] is None:
                    continue  # no body anywhere (cannot happen: see the invariants)
                topic, payload, mqos, mretain, props, pub, user, ts, exp = row[_BODY:]
                body = Message(
                    topic, payload, mqos, bool(mretain), load_props(props), pub or "",
                    user, ts or 0.0, exp,
                )
                body.store_id = msg_id
                messages[msg_id] = body
            ids = tuple(int(x) for x in sub_ids.split(",")) if sub_ids else ()
            share_t = tuple(json.loads(share)) if share else None
            d = Delivery(body, qos, bool(retain), ids, pid, pid is not None, share_t)
            d.ref = ref
            s.deliveries.append(d)
            refs[msg_id] = refs.get(msg_id, 0) + 1
            if released and pid is not None:
                s.released.add(pid)
        self._msg_refs = {mid: n for mid, n in refs.items() if n > 1}
        self._bodies = bodies
        for cid, pid in c.execute("SELECT client_id, packet_id FROM awaiting_rel"):
            s = sessions.get(cid)
            if s is not None:
                s.awaiting_rel.add(pid)
        retained = []
        for topic, payload, qos, props, pub, user, ts, exp in c.execute(
            "SELECT topic, payload, qos, props, publisher, username, ts, expires_at FROM retained"
        ):
            retained.append(
                Message(topic, payload, qos, True, load_props(props), pub or "", user, ts, exp)
            )
        return list(sessions.values()), retained

    # -- the journal (called on the loop thread) ---------------------------------------

    def session_saved(
        self, client_id: str, expiry: int, created_at: float, disconnected_at: float | None
    ) -> None:
        self._segment().records.append(("s", client_id, expiry, disconnected_at, created_at))
        self._delta.session_saved(client_id, expiry, disconnected_at, created_at)

    def session_deleted(self, client_id: str) -> None:
        self._segment().records.append(("D", client_id))
        self._delta.client_deleted(client_id)

    def subscribed(self, client_id: str, topic_filter: str, o: SubOptions) -> None:
        row = (
            client_id,
            topic_filter,
            o.qos,
            int(o.no_local),
            int(o.retain_as_published),
            o.retain_handling,
            o.subscription_id,
        )
        self._segment().records.append(("S", *row))
        self._delta.subs[(client_id, topic_filter)] = row

    def unsubscribed(self, client_id: str, topic_filter: str) -> None:
        self._segment().records.append(("U", client_id, topic_filter))
        self._delta.subs[(client_id, topic_filter)] = None

    def _segment(self) -> LogSegment:
        """This turn's open log segment (a new one once the last was handed to the
        writer or another write followed it)."""
        seg = self._seg
        if seg is None or not self._is_open(seg):
            # the writer's count, read once a batch
            if self._log.size >= CHECKPOINT_BYTES and self._checkpoint_if_room(True):
                return self._seg  # type: ignore[return-value]
            seg = self._seg = LogSegment(self._gen)
            self._segments += 1
            self.committer.add_segment(seg)
        return seg

    def queued(self, client_id: str, d: Delivery) -> None:
        seg = self._seg
        if seg is None or not self._is_open(seg):
            seg = self._segment()
        m = d.message
        mid = m.store_id
        if mid is None and len(m.payload) > INLINE_MAX:  # a large body: messages row
            mid = m.store_id = self._next_msg
            self._next_msg += 1
            self._body_row(seg, m, mid)
            body: tuple[Any, ...] = _NO_BODY
        elif mid is None:  # its first queue row: the body goes inline
            mid = m.store_id = self._next_msg
            self._next_msg += 1
            props = m.properties
            body = (
                m.topic,
                m.payload,
                m.qos,
                int(m.retain),
                None if props is NO_PROPERTIES else dump_props(props),
                m.publisher,
                m.username,
                m.timestamp,
                m.expires_at,
            )
        else:
            self._msg_refs[mid] = self._msg_refs.get(mid, 1) + 1
            body = _NO_BODY
            if mid not in self._bodies:  # a second row: the body gets its messages row
                self._body_row(seg, m, mid)
        d.ref = ref = self._next_ref
        self._next_ref = ref + 1
        ids = d.subscription_ids
        share = d.share
        row = (
            ref,
            client_id,
            mid,
            d.qos,
            int(d.retain),
            ",".join(map(str, ids)) if ids else None,
            d.packet_id,
            0,
            json.dumps(share) if share else None,
            *body,
        )
        records = seg.records
        seg.adds[ref] = len(records)
        records.append(row)
        self._rows[ref] = row

    def _body_row(self, seg: LogSegment, m: Message, mid: int) -> None:
        """Message ``mid`` needs a ``messages`` row (a large body, or a second queue
        row). A first row that carries the body inline keeps it (the same message)."""
        self._bodies.add(mid)
        row = (
            mid,
            m.topic,
            m.payload,
            m.qos,
            int(m.retain),
            dump_props(m.properties),
            m.publisher,
            m.username,
            m.timestamp,
            m.expires_at,
        )
        seg.records.append(row)
        self._delta.bodies[mid] = row

    def assigned(self, d: Delivery) -> None:
        ref = d.ref
        if ref is None:
            return
        seg = self._segment()
        self._delta.assigned(ref, d.packet_id)
        i = seg.adds.get(ref)
        if i is None:
            seg.records.append(("p", ref, d.packet_id))
        else:  # added by this segment: the row itself gets the packet id
            seg.records[i] = self._rows[ref]

    def released(self, d: Delivery) -> None:
        ref = d.ref
        if ref is None:
            return
        self._segment().records.append(("r", ref))
        self._delta.release(ref)

    def removed(self, d: Delivery) -> None:
        ref = d.ref
        if ref is None:
            return
        d.ref = None
        seg = self._seg
        if seg is None or not self._is_open(seg):
            seg = self._segment()
        i = seg.adds.pop(ref, None)
        if i is None:
            seg.records.append(ref)
        else:  # added by this segment, not written yet: the frame gets neither
            seg.records[i] = None
        if self._rows.pop(ref, None) is None:  # else: added this generation, never in SQLite
            self._delta.removed(ref)
        m = d.message
        mid = m.store_id
        if mid is None:
            return
        refs = self._msg_refs
        if refs:
            n = refs.pop(mid, 1) - 1
            if n > 1:
                refs[mid] = n
            if n > 0:
                return
        # the last queue row of this message: its body goes too (inline: with that row)
        m.store_id = None
        bodies = self._bodies
        if mid in bodies:
            bodies.discard(mid)
            seg.records.append(("x", mid))
            self._delta.body_gone(mid)

    def awaiting_rel_added(self, client_id: str, packet_id: int) -> None:
        self._segment().records.append(("a", client_id, packet_id, True))
        self._delta.awaiting[(client_id, packet_id)] = True

    def awaiting_rel_removed(self, client_id: str, packet_id: int) -> None:
        self._segment().records.append(("a", client_id, packet_id, False))
        self._delta.awaiting[(client_id, packet_id)] = False

    # -- checkpoints (on the loop; the writer applies them) ------------------------------

    def checkpoint(self, recycle: bool = True) -> None:
        """Close the current generation: its delta goes to SQLite with the next commit,
        and its log files are recycled or deleted after that commit."""
        old = self._delta
        self._delta = Delta()
        self._rows = self._delta.rows
        self._gen += 1
        self._segments = 0
        self._checkpointed_at = time.monotonic()
        seg = self._seg = LogSegment(self._gen, old, recycle)
        self.committer.add_segment(seg)

    def _checkpoint_if_room(self, throttle: bool = False) -> bool:
        """Checkpoint if the file system has room for it (journal_log.checkpoint_room);
        else the records stay in the log, and one WARNING says so until a checkpoint
        fits again. ``throttle``: measure at most once per tick (the commit path)."""
        now = time.monotonic()
        if throttle and now < self._room_checked_at + _TICK:
            return False
        self._room_checked_at = now
        room = checkpoint_room(self.log_dir, [self._delta])
        if not room.fits:
            self._delete_ahead(room.free)
            if self._compact_if_worth(room.free):
                return True
            if not self.deferring:
                log.warning("journal log: checkpoints deferred, %s free and about %s needed;"
                            " the records stay in the log until the sessions drain or the"
                            " disk has room", _kib(room.free), _kib(room.need))
                self.deferring = self.committer.log_waits_for_room = True
            return False
        if self.deferring:
            log.warning("journal log: checkpoints again (%s free)", _kib(room.free))
            self.deferring = self.committer.log_waits_for_room = False
        self.checkpoint(room.recycle)
        return True

    def _delete_ahead(self, free: int) -> None:
        """No room for a checkpoint: the delta's deletions go to SQLite with the next
        commit (a few pages each; idempotent, so replay may repeat them), so that the
        space guard's vacuum gives their pages back and the rest fits later."""
        if free < DELETE_AHEAD_ROOM:
            return
        ahead = self._delta.split_deletions()
        if ahead.empty():
            return
        add = self.committer.add
        for sql, params in ahead.statements():
            add(sql, params)

    def _compact_if_worth(self, free: int) -> bool:
        """No room for a checkpoint: if the pending delta is much smaller than the log
        files (the sessions drained), rewrite it as a new generation's first frame, so
        the older files go (journal_log: compaction)."""
        records = self._delta.size_estimate()
        held = log_bytes(self.log_dir)
        new_file = -(-(records + 4096) // PREALLOCATE) * PREALLOCATE
        if held < max(4 * records, new_file + 2 * PREALLOCATE) or free < new_file + 4096:
            return False
        self._gen += 1
        self._segments = 1  # the delta stays pending: a checkpoint still has work
        self._checkpointed_at = time.monotonic()
        seg = self._seg = LogSegment(self._gen)
        seg.compaction = True
        seg.records = self._delta.records()
        self.committer.add_segment(seg)
        log.warning("journal log: compacted (%s of log files for about %s of pending "
                    "records; no room to checkpoint into SQLite)", _kib(held), _kib(records))
        return True

    def _start_timer(self) -> None:
        loop = self.committer.loop
        self._timer = loop.call_later(_TICK, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self._written():
            c = self.committer
            jlog = c.log
            size = jlog.size if jlog is not None else 0
            fault = c.fault
            if (
                size >= CHECKPOINT_BYTES
                or time.monotonic() - self._checkpointed_at >= CHECKPOINT_EVERY
                or (fault is not None and fault.space)  # a checkpoint frees log space
            ):
                self._checkpoint_if_room()
        self._start_timer()

    def _closing(self) -> None:
        """The committer closes: the last checkpoint goes with its last commit."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._written():
            self._checkpoint_if_room()

    def _written(self) -> bool:
        """Records of the current generation exist (so a checkpoint has work)."""
        if self._segments:
            return True
        seg = self._seg
        return seg is not None and seg.generation == self._gen and bool(seg.records)

    def retained_saved(self, m: Message) -> None:
        self.committer.add(
            "INSERT OR REPLACE INTO retained VALUES (?,?,?,?,?,?,?,?)",
            (
                m.topic,
                m.payload,
                m.qos,
                dump_props(m.properties),
                m.publisher,
                m.username,
                m.timestamp,
                m.expires_at,
            ),
        )

    def retained_deleted(self, topic: str) -> None:
        self.committer.add("DELETE FROM retained WHERE topic=?", (topic,))


def _kib(n: int) -> str:
    return f"{n // 1024} KiB"
