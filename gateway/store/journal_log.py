"""The journal log: an append-only file in front of SQLite for the queue hot path.

Every QoS 1/2 delivery of a persistent session used to be inserted into SQLite's
``queue`` table and deleted again a few ms later, after its PUBACK: two B-tree changes,
a WAL write and an fsync per group commit. Now those changes (queue rows, message
bodies, packet ids, PUBREC marks, awaited PUBRELs, the sessions and their subscriptions,
the deletion of a session) are *records* appended to a log file, and SQLite sees only
what is still pending at a *checkpoint*: rows queued and removed between two
checkpoints never touch it. A persistent session's whole state is in the log, so one
frame carries it (a CONNECT's session row no longer costs a SQLite transaction).

Files: ``{data_dir}/gateway.journal/<generation>.log`` (12 decimal digits). A file is a
sequence of frames, one per group commit: ``<u32 length><u32 crc32>`` (little endian)
then ``length`` bytes, a pickle (protocol 5, stable across Python versions) of a list
of record lists. Records (one tuple or int each; :meth:`Delta.apply` reads them):

- an 18-tuple: a queue row (``ref`` first, columns of ``sessions._QUEUE_COLS``) added;
- an ``int``: the queue row of that ref removed;
- a 10-tuple: a ``messages`` row (a body) added;
- ``("p", ref, packet_id)``, ``("r", ref)``: a packet id assigned, a PUBREC received;
- ``("x", msg_id)``: a ``messages`` row deleted;
- ``("a", client_id, packet_id, present)``: an awaited PUBREL added or removed;
- ``("s", client_id, expiry_interval, disconnected_at, created_at)``: a ``sessions`` row
  saved (an existing row keeps its ``created_at``);
- ``("S", client_id, filter, qos, no_local, rap, rh, sid)``: a subscription saved;
- ``("U", client_id, filter)``: a subscription deleted;
- ``("D", client_id)``: the session deleted, with its subscriptions, queue rows and
  awaited PUBRELs;
- ``None``: a queue row added and removed again before its frame was written (the
  delivery was acknowledged within one group commit): the frame carries neither.

Every record sets a key to a value (or deletes it), so replaying a prefix of the records
again, or a log whose records SQLite already has, gives the same state (idempotent).

Invariants:
- A frame is appended with one ``pwritev`` at the end of the last good frame, then
  ``fdatasync``; only then does the group commit report success (held output leaves).
  A failed write or sync truncates the file back to the last good frame (or, if that
  fails too, the next frame overwrites it), so a file never has a bad frame followed
  by good ones unless the disk damaged it.
- Replay (start-up): the files in generation order, every frame whose CRC holds. A bad
  frame with nothing valid after it is a torn tail (a write cut by a crash: never
  acknowledged) and is dropped silently. A bad frame with a valid frame after it is
  damage: the good frames before and after it are kept (a lost removal re-delivers a
  message, at least once still holds; a lost addition is the loss the alarm reports).
- A generation's records go to SQLite only by a checkpoint: the delta of that
  generation (kept by the loop as it appends, :class:`Delta`) is applied in one SQLite
  transaction, and only after the commit are the generation's files deleted. A crash in
  between leaves files whose records SQLite already has: replay is idempotent.
- A checkpoint runs only with room for it (:func:`checkpoint_room`): its rows are
  written twice (SQLite's WAL, then the main file) while the log still holds them, so on
  a nearly full disk it would take the last free bytes (and a restart would then fail to
  open the database). Until the room is there, the records stay in the log, which is
  as durable. Checkpointed files are recycled only while the file system has
  ``RECYCLE_ROOM`` free after the checkpoint, deleted otherwise.
- A *compaction* gives a full disk the log's dead bytes back without SQLite: the
  pending delta, as records (:meth:`Delta.records`), is the first frame of a new
  generation, and the older files are deleted only after that frame is durable. A crash
  in between leaves the old files and the frame: replaying both gives the same delta
  (the frame's records set every key again, after the old ones).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import sqlite3
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.store.bulk import delete_pairs, insert_rows, update_column, where_in

log = logging.getLogger("gateway.store")

LOG_DIR_NAME = "gateway.journal"
_HEADER = struct.Struct("<II")
_SUFFIX = ".log"
PREALLOCATE = 128 * 1024  # a log file grows by this much at a time (zeros, synced)
RECYCLE_MAX = 2 * 1024 * 1024  # a checkpointed file larger than this is deleted
RECYCLE_ROOM = 4 * 1024 * 1024  # nor is one recycled with less than this free after it
# room a checkpoint needs besides twice its rows' bytes: the pages of a small
# transaction, the WAL index, the main file's growth by whole pages
CHECKPOINT_HEADROOM = 256 * 1024
_ROW_BYTES = 160  # a queue or messages row without its payload, with its index entries
QUEUE_WIDTH = 18
BODY_WIDTH = 10
_PACKET_ID = 6
_RELEASED = 7
_TOPIC = 9
_PAYLOAD = 10
QUEUE_COLS = (
    "ref, client_id, msg_id, qos, retain, sub_ids, packet_id, released, share, "
    "topic, payload, mqos, mretain, props, publisher, username, ts, expires_at"
)


def log_dir(db: str | Path) -> Path:
    """The directory of the journal log of the database file ``db``."""
    return Path(db).parent / LOG_DIR_NAME


def log_files(directory: Path) -> list[tuple[int, Path]]:
    """``(generation, path)`` of every log file in ``directory``, oldest first."""
    out: list[tuple[int, Path]] = []
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return out
    for name in names:
        stem, dot, ext = name.partition(".")
        if dot and "." + ext == _SUFFIX and stem.isdigit():
            out.append((int(stem), directory / name))
    out.sort()
    return out


def log_bytes(directory: Path) -> int:
    """Bytes the log files take (for the space accounting)."""
    total = 0
    for _, p in log_files(directory):
        with contextlib.suppress(OSError):
            total += os.stat(p).st_size
    return total


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class JournalLog:
    """The log file being appended to (the writer thread's; nothing else touches it).

    A file's blocks are written (zeros, then fdatasync) before frames go into them, and
    a checkpointed file is recycled as the next generation's: appending a frame then
    changes no file-system metadata, so its fdatasync depends on no file-system journal
    commit (an ext4 that aborts its journal, ``errors=remount-ro``, lost the last frames
    of a growing file in tests/gateway/store/test_storage_faults.py; SQLite's WAL, which
    it rewrites in place, kept them). Frames of the file's earlier generation left in it
    fail the CRC, which is seeded with the generation."""

    def __init__(self, directory: Path, generation: int) -> None:
        self.directory = directory
        self.generation = generation
        self._fd = -1  # opened at the first write of a generation
        self._end = 0  # offset after the last good frame
        self._alloc = 0  # bytes of the file written (zeros or frames) and synced
        self.frames = 0
        self.bytes = 0  # appended since start (all generations)

    @property
    def size(self) -> int:
        """Bytes of frames in the current generation's file."""
        return self._end

    def append(self, chunks: list[list[Any]]) -> None:
        """One frame of ``chunks`` (lists of records), durable on return."""
        data = pickle.dumps(chunks, 5)
        head = _HEADER.pack(len(data), zlib.crc32(data, self.generation & 0xFFFFFFFF))
        if self._fd < 0:
            self._open()
        fd = self._fd
        end = self._end
        n = len(head) + len(data)
        if end + n > self._alloc:
            self._grow(end + n)
        # O_DSYNC: the write returns once the data is durable (one system call, one
        # release and re-take of the GIL, instead of a write and an fdatasync)
        done = os.pwritev(fd, [head, data], end)
        while done < n:  # a short write (rare): the rest
            done += os.pwrite(fd, (head + data)[done:], end + done)
        # a frame that failed above is overwritten by the next one: nothing valid follows
        self._end = end + n
        self.frames += 1
        self.bytes += n

    def _grow(self, need: int) -> None:
        size = max(need, self._alloc + PREALLOCATE)
        size = -(-size // PREALLOCATE) * PREALLOCATE
        zeros = bytes(min(size - self._alloc, PREALLOCATE))
        off = self._alloc
        while off < size:
            off += os.pwrite(self._fd, zeros[: size - off], off)
        os.fsync(self._fd)  # the size and the blocks, before any frame relies on them
        self._alloc = size

    def _open(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / f"{self.generation:012d}{_SUFFIX}"
        existed = path.exists()  # recycled: its blocks are written
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_DSYNC, 0o600)
        try:
            alloc = os.fstat(fd).st_size
            if not existed:
                _sync_dir(self.directory)  # the file's name is durable before its frames
        except OSError:
            os.close(fd)
            raise
        self._fd, self._end, self._alloc = fd, 0, alloc

    def rotate(self, generation: int) -> None:
        """Appends go to generation ``generation`` from now on."""
        if generation == self.generation:
            return  # a retried checkpoint: the file stays open at its last good frame
        self.close()
        self.generation = generation

    def remove_before(self, generation: int, recycle: bool = True) -> None:
        """The files of the generations before ``generation`` are checkpointed: the
        largest becomes ``generation``'s file (if ``recycle`` and that has none yet),
        the rest go."""
        old = [(p.stat().st_size, g, p) for g, p in log_files(self.directory) if g < generation]
        if not old:
            return
        new = self.directory / f"{generation:012d}{_SUFFIX}"
        old.sort()
        if recycle and self._fd < 0 and not new.exists() and old[-1][0] <= RECYCLE_MAX:
            os.replace(old.pop()[2], new)
        for _, _, p in old:
            p.unlink(missing_ok=True)
        _sync_dir(self.directory)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._end = 0
            self._alloc = 0


@dataclass
class Damage:
    """A bad frame with valid frames after it (not a torn tail)."""

    path: Path
    offset: int
    lost_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "offset": self.offset, "lost_bytes": self.lost_bytes}


@dataclass
class Replayed:
    delta: Delta
    frames: int = 0
    torn: list[tuple[Path, int]] = field(default_factory=list)  # (file, offset cut)
    damage: list[Damage] = field(default_factory=list)


def _frame_at(data: bytes, off: int, seed: int) -> int:
    """The end of a valid frame at ``off``, or -1."""
    if off + _HEADER.size > len(data):
        return -1
    length, crc = _HEADER.unpack_from(data, off)
    end: int = off + _HEADER.size + length
    if length == 0 or end > len(data):
        return -1
    if zlib.crc32(memoryview(data)[off + _HEADER.size : end], seed) != crc:
        return -1
    return end


def read_frames(path: Path, generation: int) -> tuple[list[bytes], int, list[Damage]]:
    """The payloads of the valid frames of ``path`` (of ``generation``), the offset
    where its tail begins (a torn frame, zeros, or an earlier generation's frames) and
    the damage found before that: a frame whose length is plausible but whose CRC fails,
    followed by a valid frame."""
    data = path.read_bytes()
    seed = generation & 0xFFFFFFFF
    frames: list[bytes] = []
    damage: list[Damage] = []
    off = 0
    n = len(data)
    while off < n:
        end = _frame_at(data, off, seed)
        if end > 0:
            frames.append(data[off + _HEADER.size : end])
            off = end
            continue
        if off + _HEADER.size <= n:
            length = _HEADER.unpack_from(data, off)[0]
            nxt = off + _HEADER.size + length
            if length and nxt < n and _frame_at(data, nxt, seed) > 0:
                damage.append(Damage(path, off, nxt - off))
                off = nxt
                continue
        return frames, off, damage
    return frames, n, damage


def replay(directory: Path, below: int | None = None) -> Replayed:
    """Every record of the log files in ``directory`` (of generations below ``below``),
    as one :class:`Delta` over the SQLite state."""
    out = Replayed(Delta())
    delta = out.delta
    for gen, path in log_files(directory):
        if below is not None and gen >= below:
            continue
        frames, tail, damage = read_frames(path, gen)
        out.damage += damage
        if tail < path.stat().st_size:
            out.torn.append((path, tail))
        for payload in frames:
            try:
                chunks = pickle.loads(payload)
            except Exception as exc:  # a valid CRC over bytes we did not write: damage
                out.damage.append(Damage(path, -1, len(payload)))
                log.error("journal log %s: a frame does not load: %s", path, exc)
                continue
            for records in chunks:
                delta.apply(records)
            out.frames += 1
    return out


class Delta:
    """What the records of one or more generations change in SQLite, kept merged per key
    (the loop keeps the current generation's as it appends records; replay rebuilds it):

    - ``rows``: queue rows added (and not removed) in these generations, by ref, in their
      latest state; a removal of such a row just drops it;
    - ``gone``: refs of older rows (in SQLite, or not: deleting is idempotent) removed;
    - ``pids`` / ``released``: packet ids and PUBREC marks of older rows;
    - ``bodies`` / ``bodies_gone``: the same for ``messages`` rows by message id;
    - ``awaiting``: (client, packet id) -> present, the last state;
    - ``sessions``: ``sessions`` rows saved, by client, in their latest state;
    - ``subs``: (client, filter) -> a ``subscriptions`` row saved, or None: deleted;
    - ``dead``: clients whose older session, subscriptions, queue rows and awaited
      PUBRELs are all deleted (a client's entries of these generations were dropped at
      that point)."""

    __slots__ = (
        "rows", "gone", "pids", "released", "bodies", "bodies_gone", "awaiting", "sessions",
        "subs", "dead",
    )

    def __init__(self) -> None:
        self.rows: dict[int, tuple[Any, ...]] = {}
        self.gone: list[int] = []
        self.pids: dict[int, int | None] = {}
        self.released: dict[int, None] = {}
        self.bodies: dict[int, tuple[Any, ...]] = {}
        self.bodies_gone: list[int] = []
        self.awaiting: dict[tuple[str, int], bool] = {}
        self.sessions: dict[str, tuple[str, int, float | None, float]] = {}
        self.subs: dict[tuple[str, str], tuple[Any, ...] | None] = {}
        self.dead: list[str] = []

    def empty(self) -> bool:
        return not (
            self.rows or self.gone or self.pids or self.released or self.bodies
            or self.bodies_gone or self.awaiting or self.sessions or self.subs or self.dead
        )

    def split_deletions(self) -> Delta:
        """Move the deletions of rows older than this delta (and of bodies, clients,
        awaited PUBRELs) into a new delta, leaving the additions and updates here.
        Applying the new one, then this one, gives what applying this one gave (its
        statements run deletions first too)."""
        out = Delta()
        out.gone, self.gone = self.gone, []
        out.bodies_gone, self.bodies_gone = self.bodies_gone, []
        out.dead, self.dead = self.dead, []
        for key in [k for k, present in self.awaiting.items() if not present]:
            out.awaiting[key] = self.awaiting.pop(key)
        return out

    def records(self) -> list[Any]:
        """Records that replay (:meth:`apply`, into an empty delta) to this delta: the
        one frame of a compaction."""
        out: list[Any] = [("D", cid) for cid in self.dead]
        out += self.gone
        out += [("x", mid) for mid in self.bodies_gone]
        out += self.bodies.values()
        out += self.rows.values()
        out += [("p", ref, pid) for ref, pid in self.pids.items()]
        out += [("r", ref) for ref in self.released]
        out += [("a", cid, pid, present) for (cid, pid), present in self.awaiting.items()]
        out += [("s", *row) for row in self.sessions.values()]
        out += [("S", *row) if row else ("U", *key) for key, row in self.subs.items()]
        return out

    def size_estimate(self) -> int:
        """About how many bytes applying this delta writes into SQLite's pages."""
        n = _ROW_BYTES * (
            len(self.rows) + len(self.bodies) + len(self.awaiting) + len(self.sessions)
            + len(self.subs)
        )
        n += sum(len(r[_PAYLOAD] or b"") + len(r[_TOPIC] or "") for r in self.rows.values())
        n += sum(len(b[2] or b"") + len(b[1]) for b in self.bodies.values())
        return n + 16 * (len(self.gone) + len(self.pids) + len(self.bodies_gone))

    # the loop's fast paths (SessionStore inlines add and remove) and replay share these

    def removed(self, ref: int) -> None:
        if self.rows.pop(ref, None) is None:
            self.gone.append(ref)
            if self.pids:
                self.pids.pop(ref, None)
            if self.released:
                self.released.pop(ref, None)

    def assigned(self, ref: int, pid: int | None) -> None:
        row = self.rows.get(ref)
        if row is not None:
            self.rows[ref] = (*row[:_PACKET_ID], pid, *row[_PACKET_ID + 1 :])
        else:
            self.pids[ref] = pid

    def release(self, ref: int) -> None:
        row = self.rows.get(ref)
        if row is not None:
            self.rows[ref] = (*row[:_RELEASED], 1, *row[_RELEASED + 1 :])
        else:
            self.released[ref] = None

    def body_gone(self, mid: int) -> None:
        if self.bodies.pop(mid, None) is None:
            self.bodies_gone.append(mid)

    def client_deleted(self, client_id: str) -> None:
        rows = self.rows
        for ref in [ref for ref, row in rows.items() if row[1] == client_id]:
            del rows[ref]
        for key in [k for k in self.awaiting if k[0] == client_id]:
            del self.awaiting[key]
        self.sessions.pop(client_id, None)
        if self.subs:
            for skey in [k for k in self.subs if k[0] == client_id]:
                del self.subs[skey]
        self.dead.append(client_id)

    def session_saved(
        self, client_id: str, expiry: int, disconnected_at: float | None, created_at: float
    ) -> None:
        """The session's row (an existing one keeps its ``created_at``, as SQLite's
        upsert does)."""
        old = self.sessions.get(client_id)
        if old is not None:
            created_at = old[3]
        self.sessions[client_id] = (client_id, expiry, disconnected_at, created_at)

    def apply(self, records: Iterable[Any]) -> None:
        """Replay ``records`` (see the module docstring) into this delta. Unlike the
        loop's own changes, a removal also deletes from SQLite when the row was added
        in the replayed records: a crash after a checkpoint's commit leaves records that
        SQLite already has, their rows included."""
        rows = self.rows
        for r in records:
            if r is None:
                continue
            if type(r) is int:
                rows.pop(r, None)
                self.removed(r)
                continue
            n = len(r)
            if n == QUEUE_WIDTH:
                rows[r[0]] = r
            elif n == BODY_WIDTH:
                self.bodies[r[0]] = r
            else:
                tag = r[0]
                if tag == "p":
                    self.assigned(r[1], r[2])
                elif tag == "r":
                    self.release(r[1])
                elif tag == "x":
                    self.bodies.pop(r[1], None)
                    self.body_gone(r[1])
                elif tag == "a":
                    self.awaiting[(r[1], r[2])] = r[3]
                elif tag == "s":
                    self.session_saved(r[1], r[2], r[3], r[4])
                elif tag == "S":
                    self.subs[(r[1], r[2])] = r[1:]
                elif tag == "U":
                    self.subs[(r[1], r[2])] = None
                elif tag == "D":
                    self.client_deleted(r[1])
                else:
                    raise ValueError(f"unknown journal record {r[:1]!r}")

    def statements(self) -> Iterator[tuple[str, Sequence[Any]]]:
        """The SQL that applies this delta over the state before it."""
        for cid in self.dead:
            yield "DELETE FROM queue WHERE client_id=?", (cid,)
            yield "DELETE FROM awaiting_rel WHERE client_id=?", (cid,)
            yield "DELETE FROM sessions WHERE client_id=?", (cid,)
            yield "DELETE FROM subscriptions WHERE client_id=?", (cid,)
        if self.gone:
            yield from where_in("DELETE FROM queue WHERE ref", self.gone)
        if self.bodies_gone:
            yield from where_in("DELETE FROM messages WHERE id", self.bodies_gone)
        if self.bodies:
            yield from insert_rows(
                "INSERT OR REPLACE INTO messages", BODY_WIDTH, list(self.bodies.values())
            )
        if self.rows:
            yield from insert_rows(
                f"INSERT OR REPLACE INTO queue({QUEUE_COLS})", QUEUE_WIDTH,
                list(self.rows.values()),
            )
        if self.pids:
            yield from update_column("queue", "ref", "packet_id", list(self.pids.items()))
        if self.released:
            yield from where_in("UPDATE queue SET released=1 WHERE ref", list(self.released))
        if self.awaiting:
            gone = [k for k, present in self.awaiting.items() if not present]
            added = [k for k, present in self.awaiting.items() if present]
            if gone:
                yield from delete_pairs("awaiting_rel", ("client_id", "packet_id"), gone)
            if added:
                yield from insert_rows("INSERT OR IGNORE INTO awaiting_rel", 2, added)
        if self.sessions:
            yield from insert_rows(
                "INSERT INTO sessions(client_id, expiry_interval, disconnected_at, created_at)",
                4, list(self.sessions.values()),
                " ON CONFLICT(client_id) DO UPDATE SET expiry_interval=excluded.expiry_interval,"
                " disconnected_at=excluded.disconnected_at",
            )
        if self.subs:
            unsubscribed = [k for k, row in self.subs.items() if row is None]
            saved = [row for row in self.subs.values() if row is not None]
            if unsubscribed:
                yield from delete_pairs("subscriptions", ("client_id", "filter"), unsubscribed)
            if saved:
                yield from insert_rows("INSERT OR REPLACE INTO subscriptions", 7, saved)


@dataclass
class Room:
    """Whether a checkpoint of a delta fits on the file system now."""

    free: int  # bytes free for the unprivileged (statvfs f_bavail)
    need: int  # twice the delta's bytes and the headroom

    @property
    def fits(self) -> bool:
        return self.free >= self.need

    @property
    def recycle(self) -> bool:
        """Room to keep the checkpointed file for the next generation."""
        return self.free - self.need >= RECYCLE_ROOM


def checkpoint_room(directory: Path, deltas: Sequence[Delta]) -> Room:
    """The room for a checkpoint of ``deltas`` into the database beside ``directory``
    (unmeasurable: assumed to fit, as before this check existed)."""
    need = CHECKPOINT_HEADROOM + 2 * sum(d.size_estimate() for d in deltas)
    try:
        st = os.statvfs(directory if directory.exists() else directory.parent)
    except OSError:
        return Room(need + RECYCLE_ROOM, need)
    return Room(st.f_bavail * st.f_frsize, need)


def apply_deltas(conn: sqlite3.Connection, deltas: Sequence[Delta]) -> None:
    """Apply ``deltas`` (oldest first) in one transaction (a checkpoint)."""
    conn.execute("BEGIN")
    try:
        for delta in deltas:
            for sql, params in delta.statements():
                conn.execute(sql, params)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def durable_copy(db: str | Path) -> sqlite3.Connection:
    """An in-memory copy of ``db`` with its journal log replayed over it: what a start-up
    would load (for tests and inspection; the files are not changed)."""
    src = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    mem = sqlite3.connect(":memory:", isolation_level=None)
    try:
        src.backup(mem)
    finally:
        src.close()
    apply_deltas(mem, [replay(log_dir(db)).delta])
    return mem


class LogSegment:
    """A loop turn's records for the log (an item of the group commit's batch, like a
    :class:`~gateway.store.writer.Segment`). ``generation`` is the log generation its
    records belong to; the first segment of a generation carries ``checkpoint``, the
    delta of the generation before it, for the writer to apply once it rotated."""

    __slots__ = ("generation", "records", "adds", "checkpoint", "recycle", "compaction")

    def __init__(
        self, generation: int, checkpoint: Delta | None = None, recycle: bool = True
    ) -> None:
        self.generation = generation
        self.records: list[Any] = []
        # ref -> index in ``records`` of the queue rows this segment adds, so that a
        # removal (or a packet id) while it is open changes the row in place
        self.adds: dict[int, int] = {}
        self.checkpoint = checkpoint
        self.recycle = recycle  # the checkpointed file may become this generation's
        # records = the whole pending delta of the generations before (a compaction:
        # the older files go once this generation's first frame is durable)
        self.compaction = False

    def empty(self) -> bool:
        return not self.records and self.checkpoint is None

    def statements(self) -> list[tuple[str, Sequence[Any]]]:
        return []  # its records go to the log, not to SQLite
