"""A malformed store: detect it, move it aside, salvage what can be read into a fresh one.

Used at start-up by :func:`open_checked` (``gatewayd``), and by a person through
``gatewayctl store check|salvage`` on a stopped node's data directory.

Salvage, in order of preference:

1. ``sqlite3 <moved> .recover`` (the sqlite3 command-line shell, when installed): it
   reads every page it can, including rows of tables whose b-tree is damaged, and rows
   it cannot place go to a table ``lost_and_found``. Its SQL is run into the fresh file.
2. Otherwise a copy in Python, table by table: the schema from ``sqlite_master``, then
   the rows in rowid order, 500 at a time; on a read error the copy skips ahead (to
   rowid + 1, + 2, + 4, ... up to + 2^20) and goes on from the first row it can read
   again; a WITHOUT ROWID table is read in key order until its first error.

Invariants:
- The malformed file and its WAL are never changed or deleted: they are renamed to
  ``<name>.corrupt-<UTC time>`` (and ``...-wal``), so a person can try harder later.
- The fresh file has the project's pragmas (WAL, ``auto_vacuum=INCREMENTAL``) and every
  table the old one had (or could be recovered); the modules add missing ones as usual.
- :class:`SalvageReport` says, per table, how many rows survived, and per kind of data
  (sessions, retained, outboxes, users, bans, lwm2m) whether any did.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gateway.store.db import open_db
from gateway.store.walcheck import WalCheck, check_wal

log = logging.getLogger("gateway.store")

CHUNK = 500
MAX_SKIP = 1 << 20
RECOVER_TIMEOUT = 600.0

# the tables of each kind of data, for the report
KINDS: dict[str, tuple[str, ...]] = {
    "sessions": ("sessions", "subscriptions", "queue", "messages", "awaiting_rel"),
    "retained": ("retained",),
    "outboxes": ("bridge_outbox", "cluster_outbox", "cluster_inbox", "cluster_seq"),
    "users": ("users", "user_rules"),
    "bans": ("banned", "banned_version"),
    "lwm2m": ("lwm2m_registrations", "lwm2m_downlink"),
}


class StoreError(Exception):
    """A store file that cannot be checked or salvaged (one line for a person)."""


@dataclass
class SalvageReport:
    path: str
    moved_to: str
    method: str  # "recover" (sqlite3 .recover) or "copy"
    problems: list[str]  # what the check found
    tables: dict[str, int] = field(default_factory=dict)  # rows recovered per table
    lost_and_found: int = 0
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def survived(self) -> dict[str, int]:
        """Rows recovered per kind of data (kinds with no table in the file left out)."""
        out: dict[str, int] = {}
        for kind, tables in KINDS.items():
            present = [t for t in tables if t in self.tables]
            if present:
                out[kind] = sum(self.tables[t] for t in present)
        return out

    def summary(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in self.survived().items()) or "nothing"
        lost = f", {self.lost_and_found} unplaced rows" if self.lost_and_found else ""
        return (f"{self.path} was malformed ({self.problems[0] if self.problems else '?'}); "
                f"moved to {self.moved_to}; salvaged by {self.method}: {kinds}{lost}")

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["survived"] = self.survived()
        return d


def check(path: Path, *, quick: bool = True) -> list[str]:
    """Problems of the database at ``path`` ([] when it is sound). Opens it read-write
    (so a WAL is read; closing it checkpoints the WAL into the file, as any last close
    does), changes no data. A missing file is sound (it will be created)."""
    if not path.exists():
        return []
    conn: sqlite3.Connection | None = None
    try:
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA busy_timeout=5000")
        rows = conn.execute(f"PRAGMA {'quick_check' if quick else 'integrity_check'}")
        problems = [str(r[0]) for r in rows.fetchall()]
    except sqlite3.Error as exc:
        return [str(exc)]
    finally:
        if conn is not None:
            conn.close()
    return [] if problems == ["ok"] else problems


def is_corruption(problems: list[str]) -> bool:
    """True when ``problems`` say the file is malformed (not merely locked or unreadable:
    a locked file, a missing directory or no permission is no reason to move it away)."""
    if not problems:
        return False
    text = " ".join(problems).lower()
    transient = ("locked", "unable to open", "readonly", "read-only", "permission", "busy",
                 "disk is full", "disk i/o", "out of memory", "interrupted")
    return not any(t in text for t in transient)


def move_aside(path: Path, now: float | None = None) -> Path:
    """Rename the file and its WAL to ``<name>.corrupt-<UTC time>``; drop its -shm
    (an index of the WAL, rebuilt from it)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))
    moved = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while moved.exists():
        n += 1
        moved = path.with_name(f"{path.name}.corrupt-{stamp}.{n}")
    os.replace(path, moved)
    for suffix in ("-wal", "-journal"):
        side = Path(f"{path}{suffix}")
        if side.exists():
            os.replace(side, Path(f"{moved}{suffix}"))
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f"{path}-shm")
    return moved


def salvage(
    path: Path, problems: list[str] | None = None, *, use_cli: bool = True
) -> SalvageReport:
    """Move ``path`` aside and salvage it into a fresh file at ``path``."""
    started = time.monotonic()
    if problems is None:
        problems = check(path)
    moved = move_aside(path)
    report = SalvageReport(str(path), str(moved), "copy", problems)
    cli = shutil.which("sqlite3") if use_cli else None
    done = False
    if cli is not None:
        try:
            _recover_cli(cli, moved, path, report)
            report.method = "recover"
            done = True
        except (OSError, subprocess.SubprocessError, sqlite3.Error, StoreError) as exc:
            report.errors.append(f"sqlite3 .recover failed ({exc}); copying table by table")
            for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)
    if not done:
        _copy(moved, path, report)
    _count(path, report)
    report.seconds = round(time.monotonic() - started, 3)
    return report


def _recover_cli(cli: str, moved: Path, fresh: Path, report: SalvageReport) -> None:
    # .recover reads the moved file's WAL too (same name + -wal)
    out = subprocess.run(
        [cli, "-bail", str(moved), ".recover"],
        capture_output=True, timeout=RECOVER_TIMEOUT,
    )
    sql = out.stdout.decode("utf-8", "surrogateescape")
    err = out.stderr.decode(errors="replace").strip()
    # Debian 12's sqlite3 3.40.1 answers .recover with "sql error: SQL logic error" and
    # a script without data, exit 0: only a script that ends in COMMIT is a result
    if "error" in err.lower() or not sql.rstrip().endswith("COMMIT;"):
        raise StoreError(
            err.splitlines()[0] if err else f"no usable output (exit {out.returncode})"
        )
    open_db(fresh).close()  # the project's pragmas first (auto_vacuum before any table)
    load = subprocess.run(
        [cli, str(fresh)], input=sql.encode("utf-8", "surrogateescape"),
        capture_output=True, timeout=RECOVER_TIMEOUT,
    )
    if load.returncode != 0:
        lines = load.stderr.decode(errors="replace").strip().splitlines()
        report.errors.extend(lines[:5])


def _copy(moved: Path, fresh: Path, report: SalvageReport) -> None:
    source = moved
    if not _header_sound(moved):
        repaired = _repair_header(moved)
        if repaired is not None:
            report.errors.append(f"file header damaged: read through a rebuilt header "
                                 f"(page size {repaired[1]})")
            source = repaired[0]
    try:
        _copy_from(source, fresh, report)
    finally:
        leftovers = [Path(f"{moved}-shm")]  # the reader's WAL index: not worth keeping
        if source != moved:
            leftovers += [source, Path(f"{source}-wal"), Path(f"{source}-shm")]
        for p in leftovers:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)


MAGIC = b"SQLite format 3\x00"


def _header_sound(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError:
        return False
    if len(head) < 100 or head[:16] != MAGIC:
        return False
    ps = int.from_bytes(head[16:18], "big")
    ps = 65536 if ps == 1 else ps
    return ps >= 512 and ps & (ps - 1) == 0


def _guess_page_size(data: bytes) -> int:
    """The page size at which the most pages start like b-tree pages (flag 2, 5, 10, 13
    and a sane cell count), SQLite's default 4096 on a tie."""
    best, best_score = 4096, -1
    for ps in (4096, 1024, 2048, 8192, 16384, 32768, 65536, 512):
        pages = len(data) // ps
        if pages < 2:
            continue
        score = 0
        for n in range(1, min(pages, 2000)):
            off = n * ps
            flag = data[off]
            cells = int.from_bytes(data[off + 3 : off + 5], "big")
            if flag in (2, 5, 10, 13) and cells <= ps // 4:
                score += 1
        if score > best_score:
            best, best_score = ps, score
    return best


def _repair_header(moved: Path) -> tuple[Path, int] | None:
    """A copy of ``moved`` (and its WAL) with a plausible 100-byte header in place of a
    damaged one (no auto-vacuum, no freelist: the copy reads b-trees only), or None."""
    try:
        data = moved.read_bytes()
    except OSError:
        return None
    if len(data) < 1024:
        return None
    ps = _guess_page_size(data)
    head = bytearray(100)
    head[:16] = MAGIC
    head[16:18] = (1 if ps == 65536 else ps).to_bytes(2, "big")
    head[18], head[19] = 1, 1  # legacy journal: the WAL is not read through this copy
    head[21], head[22], head[23] = 64, 32, 32
    head[24:28] = (1).to_bytes(4, "big")
    head[28:32] = (len(data) // ps).to_bytes(4, "big")
    head[40:44] = (1).to_bytes(4, "big")  # schema cookie
    head[44:48] = (4).to_bytes(4, "big")  # schema format
    head[56:60] = (1).to_bytes(4, "big")  # UTF-8
    head[92:96] = (1).to_bytes(4, "big")
    head[96:100] = (3040001).to_bytes(4, "big")
    copy = moved.with_name(moved.name + ".header")
    copy.write_bytes(bytes(head) + data[100:])
    return copy, ps


def _copy_from(moved: Path, fresh: Path, report: SalvageReport) -> None:
    dst = open_db(fresh)
    try:
        try:
            src = sqlite3.connect(f"file:{moved}?mode=ro", uri=True, isolation_level=None)
            schema = src.execute(
                "SELECT type, name, sql, "
                "(SELECT COUNT(*) FROM pragma_table_info(m.name) WHERE pk > 0) "
                "FROM sqlite_master m WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite_%' "
                "ORDER BY CASE type WHEN 'table' THEN 0 WHEN 'index' THEN 1 ELSE 2 END"
            ).fetchall()
        except sqlite3.Error as exc:
            report.errors.append(f"schema unreadable: {exc}")
            return
        for kind, name, sql, _ in schema:
            try:
                dst.execute(sql)
            except sqlite3.Error as exc:
                report.errors.append(f"{kind} {name}: {exc}")
                continue
            if kind == "table":
                without_rowid = "without rowid" in sql.lower()
                n = _copy_table(src, dst, name, without_rowid, report)
                report.tables[name] = n
        src.close()
    finally:
        dst.close()


def _copy_table(
    src: sqlite3.Connection, dst: sqlite3.Connection, name: str, without_rowid: bool,
    report: SalvageReport,
) -> int:
    q = '"' + name.replace('"', '""') + '"'
    cols = ['"' + r[1].replace('"', '""') + '"' for r in dst.execute(f"PRAGMA table_info({q})")]
    marks = ",".join("?" * len(cols))
    plain = f"INSERT OR IGNORE INTO {q}({','.join(cols)}) VALUES ({marks})"
    with_rowid = f"INSERT OR IGNORE INTO {q}(rowid,{','.join(cols)}) VALUES (?,{marks})"
    copied = 0
    if without_rowid:
        dst.execute("BEGIN")
        try:
            for row in src.execute(f"SELECT {','.join(cols)} FROM {q}"):
                _insert(dst, plain, row)
                copied += 1
        except sqlite3.Error as exc:
            report.errors.append(f"{name}: rows after {copied} unreadable: {exc}")
        dst.execute("COMMIT")
        return copied
    after = -(1 << 62)
    try:  # the highest rowid bounds the skipping (None if unreadable: MAX_SKIP does)
        top = src.execute(f"SELECT MAX(rowid) FROM {q}").fetchone()[0]
    except sqlite3.Error:
        top = None
    limit = CHUNK
    skips = 0
    refined = False
    while True:
        try:
            rows = src.execute(
                f"SELECT rowid, {','.join(cols)} FROM {q} WHERE rowid > ? "
                f"ORDER BY rowid LIMIT {limit}",
                (after,),
            ).fetchall()
        except sqlite3.Error as exc:
            if limit > 1:  # read one row at a time up to the damage
                limit = 1
                continue
            if skips == 0:
                where = "from the start" if copied == 0 else f"after rowid {after}"
                report.errors.append(f"{name}: unreadable {where}: {exc}")
            if after < 0 and copied == 0:
                after = 0  # our rowids are positive: probe from there
            # skip ahead past the damage: +1, +2, +4, ... from the last row read
            step = 1 << skips
            nxt = after + step if top is None else min(after + step, top - 1)
            if step > MAX_SKIP or nxt <= after:
                report.errors.append(f"{name}: nothing readable after rowid {after}")
                break
            after = nxt
            skips += 1
            continue
        if skips and not refined:
            refined = True
            # the last step may have jumped over readable rows: back to the lowest
            # start that reads (a binary search between the last failing start and this)
            lo, hi = after - (1 << (skips - 1)), after
            while hi - lo > 1:
                mid = (lo + hi) // 2
                try:
                    src.execute(f"SELECT rowid FROM {q} WHERE rowid > ? ORDER BY rowid "
                                "LIMIT 1", (mid,)).fetchall()
                    hi = mid
                except sqlite3.Error:
                    lo = mid
            if hi != after:
                after = hi
                skips = 0
                continue
        if skips and rows:
            report.errors.append(f"{name}: readable again from rowid {rows[0][0]}")
        if not rows:
            break
        skips = 0
        refined = False
        limit = CHUNK
        dst.execute("BEGIN")
        for row in rows:
            _insert(dst, with_rowid, row)
        dst.execute("COMMIT")
        copied += len(rows)
        after = rows[-1][0]
    return copied


def _insert(dst: sqlite3.Connection, sql: str, row: tuple[Any, ...]) -> None:
    with contextlib.suppress(sqlite3.Error):  # a row that breaks a constraint is left out
        dst.execute(sql, row)


def _count(path: Path, report: SalvageReport) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        names = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'"
        )]
        for name in names:
            q = '"' + name.replace('"', '""') + '"'
            n = conn.execute(f"SELECT COUNT(*) FROM {q}").fetchone()[0]
            if name == "lost_and_found":
                report.lost_and_found = n
            else:
                report.tables[name] = n
    finally:
        conn.close()


def keep_damaged_wal(path: Path) -> tuple[WalCheck, Path] | None:
    """Start-up, before anything opens ``path``: if its WAL is damaged in the middle
    (:mod:`gateway.store.walcheck`), copy it to ``<name>-wal.corrupt-<UTC time>`` (SQLite
    will drop the transactions after the damage when the file is opened) and say so."""
    wal = Path(f"{path}-wal")
    found = check_wal(wal)
    if found is None or not found.damaged:
        return None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    copy = wal.with_name(f"{wal.name}.corrupt-{stamp}")
    shutil.copyfile(wal, copy)
    log.error(
        "store %s: WAL frame %d of %d is damaged; %d later frames (%d committed "
        "transactions) will be dropped; a copy is in %s",
        path, found.first_bad, found.frames, found.later_frames, found.later_commits, copy,
    )
    return found, copy


def open_checked(path: Path) -> SalvageReport | None:
    """Start-up: ``PRAGMA quick_check`` of ``path``; a malformed file is salvaged (and
    the report returned). A file that is merely unreadable (locked, no permission) is
    left for the caller's open to fail on, with its own clear error."""
    problems = check(path)
    if not is_corruption(problems):
        if problems:
            log.error("store %s not checked: %s", path, problems[0])
        return None
    log.error("store %s is malformed: %s", path, "; ".join(problems[:3]))
    report = salvage(path, problems)
    log.error("%s", report.summary())
    for err in report.errors[:10]:
        log.warning("salvage: %s", err)
    return report
