"""gateway.store.salvage and walcheck on real SQLite files (no gatewayd): a sound file
checks clean; damage is found, moved aside and salvaged by the table copy (the path CI
takes: Debian 12's sqlite3 .recover does not work); a torn WAL tail is not damage, a
damaged frame in the middle is."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gateway.store.db import ensure_schema, open_db
from gateway.store.salvage import check, is_corruption, salvage
from gateway.store.sessions import SCHEMA
from gateway.store.walcheck import check_wal
from tests.fsfaults import corrupt


def _make(path: Path, n: int = 300) -> None:
    conn = open_db(path)
    ensure_schema(conn, SCHEMA)
    conn.execute("BEGIN")
    for i in range(n):
        conn.execute("INSERT INTO retained VALUES (?,?,?,?,?,?,?,?)",
                     (f"r/{i}", b"p" * 300, 1, None, "c", None, 0.0, None))
    conn.execute("INSERT INTO sessions VALUES ('keeper', 60, NULL, 0)")
    conn.execute("COMMIT")
    conn.close()


def _leaf(path: Path, table: str) -> tuple[int, int]:
    conn = sqlite3.connect(path)
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    pages = [r[0] for r in conn.execute(
        "SELECT pageno FROM dbstat WHERE name=? AND pagetype='leaf' ORDER BY pageno", (table,))]
    conn.close()
    return pages[len(pages) // 2], size


def test_sound_file_checks_clean(tmp_path: Path) -> None:
    db = tmp_path / "gateway.db"
    _make(db)
    assert check(db) == []
    assert check(tmp_path / "missing.db") == []


def test_leaf_damage_salvaged_by_copy_keeps_the_rest(tmp_path: Path) -> None:
    db = tmp_path / "gateway.db"
    _make(db)
    page, size = _leaf(db, "retained")
    corrupt(db, (page - 1) * size + 8, 1024)
    problems = check(db)
    assert problems and is_corruption(problems)
    report = salvage(db, problems, use_cli=False)
    assert report.method == "copy"
    assert Path(report.moved_to).exists()
    assert report.tables["sessions"] == 1
    assert 200 < report.tables["retained"] < 300  # one leaf's rows lost, not the table
    assert check(db) == []
    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
    conn.close()


def test_header_damage_read_through_a_rebuilt_header(tmp_path: Path) -> None:
    db = tmp_path / "gateway.db"
    _make(db)
    corrupt(db, 0, 100)
    report = salvage(db, use_cli=False)
    assert report.tables["retained"] == 300 and report.tables["sessions"] == 1
    assert any("header" in e for e in report.errors)


def test_locked_or_full_is_not_corruption() -> None:
    assert not is_corruption(["database or disk is full"])
    assert not is_corruption(["database is locked"])
    assert is_corruption(["*** in database main ***", "Page 7: btreeInitPage() returns 11"])


def _wal_db(tmp_path: Path) -> tuple[Path, Path, sqlite3.Connection]:
    db = tmp_path / "w.db"
    conn = open_db(db)
    conn.execute("PRAGMA wal_autocheckpoint=0")
    ensure_schema(conn, SCHEMA)
    for i in range(20):
        conn.execute("INSERT INTO retained VALUES (?,?,?,?,?,?,?,?)",
                     (f"r/{i}", b"p" * 3000, 1, None, "c", None, 0.0, None))
    return db, Path(f"{db}-wal"), conn  # the connection stays open: the WAL stays


def test_wal_middle_damage_found_torn_tail_not(tmp_path: Path) -> None:
    _db, wal, conn = _wal_db(tmp_path)
    found = check_wal(wal)
    assert found is not None and found.first_bad is None and found.valid == found.frames
    # a torn tail: the last frame cut short is just not a whole frame; garbage in it is
    # the end of the WAL, not damage
    frame = 24 + 4096
    last = 32 + (found.frames - 1) * frame
    corrupt(wal, last + 40, 16)
    tail = check_wal(wal)
    assert tail is not None and tail.first_bad == found.frames - 1 and not tail.damaged
    corrupt(wal, 32 + 2 * frame + 100, 16)  # inside frame 2: committed frames follow
    middle = check_wal(wal)
    assert middle is not None and middle.damaged and middle.first_bad == 2
    assert middle.later_commits > 0
    conn.close()
