"""Test doubles for the bridge's unit tests: a committer whose commits the test triggers,
a dialer whose links the test completes, and an upstream broker made of the project's own
codec in server role (so what the client writes is decoded, not pattern-matched)."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gateway.bridge.client import UpstreamClient
from gateway.bridge.store import OutboxStore
from gateway.store.db import open_db
from protocols.mqtt import Connection, Packet, Role


class ManualCommitter:
    """The GroupCommitter's contract, committed when the test says so."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.ops: list[tuple[str, Sequence[Any]]] = []
        self.callbacks: list[Callable[[], None]] = []
        self.commits = 0

    @property
    def dirty(self) -> bool:
        return bool(self.ops)

    def add(self, sql: str, params: Sequence[Any] = ()) -> None:
        self.ops.append((sql, params))

    def after_commit(self, callback: Callable[[], None]) -> None:
        if not self.ops:
            callback()
        else:
            self.callbacks.append(callback)

    def commit(self) -> None:
        ops, self.ops = self.ops, []
        if ops:
            self.conn.execute("BEGIN")
            for sql, params in ops:
                self.conn.execute(sql, params)
            self.conn.execute("COMMIT")
            self.commits += 1
        callbacks, self.callbacks = self.callbacks, []
        for cb in callbacks:
            cb()


def make_store(path: Path) -> tuple[OutboxStore, ManualCommitter]:
    db = path / "gateway.db"
    committer = ManualCommitter(open_db(db))
    return OutboxStore(open_db(db), committer), committer


def count_rows(store: OutboxStore, bridge: str = "b") -> int:
    row = store.conn.execute(
        "SELECT COUNT(*) FROM bridge_outbox WHERE bridge=?", (bridge,)
    ).fetchone()
    return int(row[0])


class FakeLink:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed, "write on a closed link"
        self.written.append(data)

    def close(self) -> None:
        self.closed = True


class FakeDialer:
    """Every ``dial`` makes a FakeLink; the test decides what happens to it."""

    def __init__(self) -> None:
        self.links: list[FakeLink] = []

    def dial(self, client: UpstreamClient) -> FakeLink:
        link = FakeLink()
        self.links.append(link)
        return link

    @property
    def last(self) -> FakeLink:
        return self.links[-1]


class FakeUpstream:
    """The broker end of one FakeLink: decodes what the client wrote, encodes replies."""

    def __init__(self, client: UpstreamClient, link: FakeLink) -> None:
        self.client = client
        self.link = link
        self.conn = Connection(Role.SERVER)
        self._read = 0

    def received(self) -> list[Packet]:
        """Every packet the client wrote since the last call."""
        new = self.link.written[self._read:]
        self._read = len(self.link.written)
        for data in new:
            self.conn.receive_data(data)
        out = []
        while (p := self.conn.next_event()) is not None:
            out.append(p)
        return out

    def send(self, *packets: Packet) -> None:
        data = b"".join(self.conn.send(p) for p in packets)
        self.client.data_received(self.link, data)
