"""Durable per-peer outboxes and the receiver's de-duplication marks, in ``gateway.db``.

A QoS 1/2 message forwarded to node N gets the next sequence number of N's outbox and a
row in ``cluster_outbox``; the row is written through the node's
:class:`~gateway.store.writer.GroupCommitter` during ``Node.publish``, so the transport
shell holds the publisher's PUBACK/PUBREC until the row is committed. The record is sent
only after that commit, and its row is deleted when N acknowledges a sequence number at
or above it; N acknowledges only after its own writes for the batch (the deliveries to
persistent sessions and its ``cluster_inbox`` mark) are committed. A record that N has
applied but whose acknowledgement was lost is sent again and dropped by N as a duplicate
(sequence number at or below N's mark for this sender's epoch): exactly once.

Tables:
- ``cluster_meta(key, value)``: ``epoch``, a random id of this database; a receiver keeps
  its marks per (sender, epoch), so a node whose database was replaced starts afresh.
- ``cluster_outbox(peer, seq, record)``: unacknowledged records (the frame encoding of
  :mod:`gateway.cluster.frames` without the sequence number).
- ``cluster_seq(peer, last)``: the highest sequence number the peer acknowledged, so
  numbering never goes back when the outbox is empty.
- ``cluster_inbox(origin, epoch, applied)``: the highest sequence number applied per
  sender.
- ``cluster_members(name, addr)``: nodes joined by hand or learnt from peers.

Invariants:
- Sequence numbers of one outbox increase by one per record, across restarts.
- A record is in memory (``Outbox.records``) exactly while its row exists (durable node)
  or until acknowledged (memory-only node); the oldest are dropped, and counted, beyond
  ``max_len``.
"""

from __future__ import annotations

import logging
import secrets
import sqlite3
from collections import deque
from collections.abc import Callable

from gateway.store.writer import GroupCommitter

log = logging.getLogger("gateway.cluster")

SCHEMA = """
CREATE TABLE IF NOT EXISTS cluster_meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS cluster_outbox(
    peer TEXT NOT NULL,
    seq INTEGER NOT NULL,
    record BLOB NOT NULL,
    PRIMARY KEY (peer, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS cluster_seq(peer TEXT PRIMARY KEY, last INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS cluster_inbox(
    origin TEXT PRIMARY KEY,
    epoch TEXT NOT NULL,
    applied INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS cluster_members(name TEXT PRIMARY KEY, addr TEXT NOT NULL);
"""




class ClusterStore:
    """The cluster's rows in ``gateway.db`` (or nothing, on a memory-only node)."""

    def __init__(self, conn: sqlite3.Connection | None, committer: GroupCommitter | None) -> None:
        self.conn = conn  # loop thread, start-up reads
        self.committer = committer
        self.epoch = secrets.token_hex(8)
        if conn is not None:
            conn.executescript(SCHEMA)
            row = conn.execute("SELECT value FROM cluster_meta WHERE key='epoch'").fetchone()
            if row is None:
                conn.execute("INSERT INTO cluster_meta VALUES ('epoch', ?)", (self.epoch,))
            else:
                self.epoch = row[0]

    @property
    def durable(self) -> bool:
        return self.committer is not None

    def add(self, sql: str, params: tuple[object, ...]) -> None:
        if self.committer is not None:
            self.committer.add(sql, params)

    def after_commit(self, callback: Callable[[], None]) -> None:
        if self.committer is None:
            callback()
        else:
            self.committer.after_commit(callback)

    # -- members -------------------------------------------------------------------

    def members(self) -> dict[str, str]:
        if self.conn is None:
            return {}
        return dict(self.conn.execute("SELECT name, addr FROM cluster_members"))

    def member_saved(self, name: str, addr: str) -> None:
        self.add("INSERT OR REPLACE INTO cluster_members VALUES (?,?)", (name, addr))

    def member_deleted(self, name: str) -> None:
        self.add("DELETE FROM cluster_members WHERE name=?", (name,))

    # -- receiver marks ------------------------------------------------------------

    def inbox(self) -> dict[str, tuple[str, int]]:
        if self.conn is None:
            return {}
        return {
            o: (e, a)
            for o, e, a in self.conn.execute("SELECT origin, epoch, applied FROM cluster_inbox")
        }

    def applied_saved(self, origin: str, epoch: str, applied: int) -> None:
        self.add("INSERT OR REPLACE INTO cluster_inbox VALUES (?,?,?)", (origin, epoch, applied))

    # -- outboxes ------------------------------------------------------------------

    def outbox(self, peer: str, max_len: int) -> Outbox:
        box = Outbox(peer, self, max_len)
        if self.conn is not None:
            row = self.conn.execute("SELECT last FROM cluster_seq WHERE peer=?", (peer,)).fetchone()
            last = row[0] if row else 0
            for seq, record in self.conn.execute(
                "SELECT seq, record FROM cluster_outbox WHERE peer=? ORDER BY seq", (peer,)
            ):
                box.records.append((seq, bytes(record)))
                last = max(last, seq)
            box.next_seq = last + 1
            box.committed = last
        return box

    def peers_with_outbox(self) -> list[str]:
        if self.conn is None:
            return []
        return [r[0] for r in self.conn.execute("SELECT DISTINCT peer FROM cluster_outbox")]

    def outbox_deleted(self, peer: str) -> None:
        self.add("DELETE FROM cluster_outbox WHERE peer=?", (peer,))


class Outbox:
    """One peer's unacknowledged QoS 1/2 forwards (see module docstring)."""

    def __init__(self, peer: str, store: ClusterStore, max_len: int) -> None:
        self.peer = peer
        self.store = store
        self.max_len = max_len
        self.records: deque[tuple[int, bytes]] = deque()  # (seq, body) in seq order
        self.next_seq = 1
        self.committed = 0  # records up to here are durable (may be sent)
        self.sent = 0  # records up to here were written to the current data link
        self.acked = 0
        self.dropped = 0
        self._waiting = False

    def __len__(self) -> int:
        return len(self.records)

    def append(self, body: bytes, on_durable: Callable[[], None]) -> int:
        seq = self.next_seq
        self.next_seq = seq + 1
        records = self.records
        if self.max_len and len(records) >= self.max_len:
            old, _ = records.popleft()
            self.dropped += 1
            self.store.add("DELETE FROM cluster_outbox WHERE peer=? AND seq=?", (self.peer, old))
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.warning(
                    "cluster outbox for %s full (%d): dropped its oldest message (%d so far)",
                    self.peer, self.max_len, self.dropped,
                )
        records.append((seq, body))
        self.store.add("INSERT INTO cluster_outbox VALUES (?,?,?)", (self.peer, seq, body))
        if not self._waiting:
            self._waiting = True
            self.store.after_commit(lambda: self._durable(seq, on_durable))
        return seq

    def _durable(self, upto: int, on_durable: Callable[[], None]) -> None:
        # every record up to ``upto`` is committed; later ones may be in the next batch
        self.committed = max(self.committed, upto)
        last = self.next_seq - 1
        if last > upto:
            self.store.after_commit(lambda: self._durable(last, on_durable))
        else:
            self._waiting = False
        on_durable()

    def ack(self, seq: int) -> int:
        """The peer applied everything up to ``seq``; how many records that freed."""
        if seq <= self.acked:
            return 0
        self.acked = seq
        records = self.records
        n = 0
        while records and records[0][0] <= seq:
            records.popleft()
            n += 1
        if n:
            self.store.add(
                "DELETE FROM cluster_outbox WHERE peer=? AND seq<=?", (self.peer, seq)
            )
        self.store.add("INSERT OR REPLACE INTO cluster_seq VALUES (?,?)", (self.peer, seq))
        return n

    def take(self, seqs: set[int]) -> list[int]:
        """Remove the unacknowledged records numbered in ``seqs`` (to send elsewhere);
        the numbers removed. The receiver's mark skips the gaps."""
        kept: deque[tuple[int, bytes]] = deque()
        taken: list[int] = []
        for seq, body in self.records:
            if seq in seqs:
                taken.append(seq)
                self.store.add("DELETE FROM cluster_outbox WHERE peer=? AND seq=?",
                               (self.peer, seq))
            else:
                kept.append((seq, body))
        self.records = kept
        return taken

    def unsent(self) -> list[tuple[int, bytes]]:
        """Committed records not yet written to the current link, in order."""
        out = []
        for seq, body in self.records:
            if seq > self.committed:
                break
            if seq > self.sent:
                out.append((seq, body))
        return out

    def rewind(self) -> None:
        """A new data link: everything unacknowledged goes again."""
        self.sent = self.acked


