"""Space and write-health of the node's store: refusals, alarms, the reserve, vacuum.

:class:`StoreGuard` watches the file system under ``node.data_dir`` (``statvfs``), the
size of ``gateway.db`` and its WAL, and the group committer's fault state, and decides
whether the node takes new durable work:

- the store *refuses* (``Node.store_refusal = 0x97``) while a commit fails (any write
  error: ENOSPC, EIO, EROFS, ...), while less than ``reserve_size`` + 1 MiB (the WAL's
  size limit: a checkpoint needs the WAL and the pages it copies at once) is free on the
  file system besides the reserve (256 KiB + 1 MiB without a reserve), or while the store
  is at ``max_size``. Refusing means: QoS 1/2 publishes answered at once with 0x97 (MQTT 5;
  3.1.1: disconnect without PUBACK), persistent sessions refused at CONNECT (0x97; 3.1.1:
  0x03), QoS 0 retained messages delivered but not retained. Clean sessions, QoS 0,
  deliveries and their acknowledgements go on as usual;
- alarms: ``disk_full`` (out of space, or below the free minimum), ``high_disk_usage``
  (file-system usage at or above ``disk_high_watermark``), ``store_write_error`` (a
  commit fails for another reason: EIO, read-only, locked), ``store_size_limit``
  (``max_size`` reached). Each clears by itself when its condition ends;
- the reserve: a file of ``reserve_size`` bytes (``gateway.reserve``, preallocated with
  ``posix_fallocate``) released by the writer thread at the first ENOSPC, so that the
  failing commit, and the deletes and checkpoints after it, find room; made again once
  twice its size is free and the journal log's checkpoints do not wait for room (the
  reserve would take the room a deferred checkpoint or compaction needs); and a boot
  reserve (``gateway.reserve.boot``, 256 KiB) released
  only at start-up (:func:`release_leftover_reserve`), so that a node stopped on a full
  disk can open its file again;
- space back: a task on the writer thread runs ``PRAGMA incremental_vacuum`` (the store
  is created with ``auto_vacuum=INCREMENTAL``) when pages are free inside the file, and
  ``wal_checkpoint(TRUNCATE)``, so that deleted retained messages and drained queues
  give the file system its space back.

Invariants:
- ``node.store_refusal`` is non-zero exactly while :attr:`refusing` is a reason (it is set
  on every evaluation, which runs every ``check_interval``, after every commit (at most
  every 20 ms, measured on the writer thread) and on every change of the committer's fault).
- While a space fault lasts, the committer is asked to retry as soon as free space grows.
- At most one maintenance task is queued at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gateway.store.db import JOURNAL_SIZE_LIMIT, ensure_schema, open_db
from gateway.store.faults import StoreFault
from gateway.store.journal_log import log_bytes, log_dir
from gateway.store.salvage import SalvageReport, salvage
from gateway.store.sessions import upgrade_schema
from gateway.store.writer import GroupCommitter, Task

log = logging.getLogger("gateway.store")

RESERVE_NAME = "gateway.reserve"
# a second, small reserve released only at start-up: opening the file (its WAL index,
# WAL recovery) needs some room even when the last run ended on a full disk with the
# main reserve used up; without it such a start would fail, and systemd would loop
BOOT_RESERVE_NAME = "gateway.reserve.boot"
BOOT_RESERVE_SIZE = 256 * 1024
MIN_FREE = 256 * 1024  # the free minimum without a reserve
VACUUM_CHUNK = 256  # pages per incremental_vacuum step (checkpointed in between)
VACUUM_MIN_BYTES = 256 * 1024  # free pages inside the file worth giving back
COMMIT_CHECK_EVERY = 0.02  # seconds: at most one evaluation per this after commits (the
# writer thread measures the disk after the commit, the loop only decides: a statvfs on
# the loop thread handed the GIL to the writer and waited ~0.7 ms to get it back, issue
# 23 round 2; 20 ms at 10 MB/s of writes is 200 KB, well inside the 1 MB reserve)
# Past this share of ``max_size`` the writer measures after every commit: 20 ms of
# acknowledged writes went up to 45 % past a 2 MiB cap on a fast machine.
CAP_WATCH = 0.5
QUOTA_EXCEEDED = 0x97


class AlarmSink(Protocol):
    def activate(self, name: str, message: str, details: dict[str, Any] | None = None) -> None: ...
    def deactivate(self, name: str) -> bool: ...


class Refusable(Protocol):
    store_refusal: int


@dataclass(slots=True)
class SpaceSettings:
    reserve_size: int = 1024 * 1024
    max_size: int = 0  # 0: no cap
    disk_high_watermark: float = 0.9
    check_interval: float = 5.0


@dataclass(slots=True)
class Usage:
    total: int
    free: int  # for us (f_bavail), not counting the reserve file
    db_bytes: int  # gateway.db + its WAL + the journal log's files
    wal_bytes: int
    used: int  # bytes in use ((f_blocks - f_bfree) x f_frsize): not root's reserve

    @property
    def used_ratio(self) -> float:
        """As ``df`` shows it (Use%): used / (used + available to us). Root's reserved
        blocks count as neither, so on a file system with a large reserve this is well
        below ``1 - free / total``."""
        room = self.used + self.free
        return 0.0 if room <= 0 else self.used / room


class Reserve:
    """A preallocated file whose blocks the store may take back when the disk fills."""

    def __init__(self, path: Path, size: int) -> None:
        self.path = path
        self.size = size
        self.held = False

    def make(self) -> bool:
        """Allocate it (True when it now holds ``size`` bytes)."""
        if self.size <= 0:
            return False
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, self.size)
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("store reserve %s not made: %s", self.path, exc.strerror or exc)
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            self.held = False
            return False
        self.held = True
        return True

    def release(self) -> bool:
        """Delete it (any thread); True when that freed space."""
        if not self.held:
            return False
        self.held = False
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            log.error("store reserve %s not released: %s", self.path, exc)
            return False
        return True

    def bytes_held(self) -> int:
        try:
            return os.stat(self.path).st_blocks * 512 if self.held else 0
        except OSError:
            return 0


def release_leftover_reserve(data_dir: Path) -> None:
    """Start-up, before the store is opened: delete the reserve the last run left (its
    room may be needed to recover the WAL); :class:`StoreGuard` makes it again."""
    for name in (RESERVE_NAME, BOOT_RESERVE_NAME):
        with contextlib.suppress(OSError):
            os.unlink(data_dir / name)


def measure(data_dir: Path, db: Path) -> Usage:
    st = os.statvfs(data_dir)
    total = st.f_blocks * st.f_frsize
    free = st.f_bavail * st.f_frsize
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    db_bytes = wal = 0
    with contextlib.suppress(OSError):
        db_bytes = os.stat(db).st_size
    with contextlib.suppress(OSError):
        wal = os.stat(f"{db}-wal").st_size
    # the journal log's files are the store's too (the size cap counts them)
    return Usage(total, free, db_bytes + wal + log_bytes(log_dir(db)), wal, used)


def maintain(conn: sqlite3.Connection, urgent: bool = False, budget: float = 2.0
             ) -> dict[str, int]:
    """Writer thread: give free pages back (incremental vacuum, in chunks with a
    checkpoint after each, so the WAL never holds much) when 256 KiB or more are free
    inside the file, and, then or when ``urgent`` (space is short), truncate the WAL.
    Readers are waited for at most 100 ms per checkpoint (commits queue behind this).
    Returns pages freed, pages left free and the page size."""
    deadline = time.monotonic() + budget
    page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    auto_vacuum = conn.execute("PRAGMA auto_vacuum").fetchone()[0]
    free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    freed = 0
    vacuum = auto_vacuum == 2 and free * page_size >= VACUUM_MIN_BYTES
    if not (vacuum or urgent):
        return {"freed_pages": 0, "free_pages": free, "page_size": page_size}
    conn.execute("PRAGMA busy_timeout=100")
    try:
        while vacuum and free > 0 and time.monotonic() < deadline:
            conn.execute(f"PRAGMA incremental_vacuum({VACUUM_CHUNK})").fetchall()
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
            left = conn.execute("PRAGMA freelist_count").fetchone()[0]
            freed += free - left
            if left >= free:
                break
            free = left
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        conn.execute("PRAGMA busy_timeout=5000")
    return {"freed_pages": freed, "free_pages": free, "page_size": page_size}


class StoreGuard:
    """See the module docstring. Runs on the event loop; ``start`` then ``stop``."""

    def __init__(
        self,
        data_dir: Path,
        db: Path,
        committer: GroupCommitter,
        node: Refusable,
        alarms: AlarmSink,
        settings: SpaceSettings,
        schemas: tuple[str, ...] = (),
    ) -> None:
        self.data_dir = data_dir
        self.schemas = schemas  # DDL to run on a file salvaged while running
        self.db = db
        self.committer = committer
        self.node = node
        self.alarms = alarms
        self.settings = settings
        self.reserve = Reserve(data_dir / RESERVE_NAME, settings.reserve_size)
        self.boot_reserve = Reserve(data_dir / BOOT_RESERVE_NAME,
                                    BOOT_RESERVE_SIZE if settings.reserve_size else 0)
        self.usage: Usage | None = None
        self.refusing: str | None = None  # why, while refusing
        self.refusals_started = 0
        self.maintenance_runs = 0
        self.pages_freed = 0
        self._disk_full = False
        self._high = False
        self._maintaining = False
        self._urgent = False  # space is short: checkpoints truncate the WAL
        self._salvaging = False
        self.salvage_report: SalvageReport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last_eval = 0.0
        self._fault_free_at = 0  # free bytes when the current space fault began
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- life cycle ----------------------------------------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        c = self.committer
        c.on_fault = self._on_fault
        c.on_commit = self._on_commit
        data_dir, db = self.data_dir, self.db
        c.probe = lambda: measure(data_dir, db)
        c.probe_every = COMMIT_CHECK_EVERY
        c.release_space = self.reserve.release
        usage = measure(self.data_dir, self.db)
        if self.settings.reserve_size and usage.free >= 2 * self.settings.reserve_size:
            self.reserve.make()
        self._make_boot_reserve(usage)
        self.evaluate()
        self._tick()

    def _make_boot_reserve(self, usage: Usage) -> None:
        size = self.boot_reserve.size
        if size and not self.boot_reserve.held and usage.free >= 4 * size:
            self.boot_reserve.make()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        c = self.committer
        c.on_fault = c.on_commit = c.probe = None
        c.release_space = None

    def _tick(self) -> None:
        self.evaluate()
        self.maintain(self._urgent)
        assert self._loop is not None
        self._timer = self._loop.call_later(self.settings.check_interval, self._tick)

    # -- events ----------------------------------------------------------------------

    def _on_fault(self, fault: StoreFault | None) -> None:
        if fault is not None:
            log.error("store cannot write (%s): %s; refusing durable work until it can",
                      fault.kind, fault.message)
            if fault.space:
                with contextlib.suppress(OSError):
                    self._fault_free_at = measure(self.data_dir, self.db).free
            if fault.kind == "corrupt":
                self._salvage_online()
        self.evaluate()

    # -- corruption found while running ------------------------------------------------

    def _salvage_online(self) -> None:
        """The file went bad under us: on the writer thread, close it, move it aside,
        salvage it into a fresh one and write there from now on; the pending writes are
        then retried on the fresh file. The node keeps serving throughout (refusing
        durable work until the retry succeeds); no restart is needed."""
        if self._salvaging:
            return
        self._salvaging = True
        db, schemas = self.db, self.schemas
        reports: list[SalvageReport] = []

        def run(conn: sqlite3.Connection) -> sqlite3.Connection:
            conn.close()
            reports.append(salvage(db))
            fresh = open_db(db, check_same_thread=False)
            for ddl in schemas:
                ensure_schema(fresh, ddl)
            upgrade_schema(fresh)  # a salvaged queue table of an older release
            return fresh

        def done(_: object, error: BaseException | None) -> None:
            self._salvaging = False
            if error is not None:
                log.error("store salvage while running failed: %s", error)
                self.alarms.activate(
                    "store_corrupt", f"{db} is malformed and could not be salvaged: {error}",
                    {"path": str(db), "error": str(error)},
                )
                return
            report = reports[0]
            self.salvage_report = report
            log.error("%s", report.summary())
            self.alarms.activate("store_salvaged", report.summary(), report.as_dict())
            self.committer.retry()

        self.committer.submit(Task(run, done, replaces=True))

    def _on_commit(self, usage: Usage | None) -> None:
        """After a commit: decide with what the writer thread measured just after it
        (``usage``, at most every ``COMMIT_CHECK_EVERY``; None: not measured this time)."""
        if usage is not None:
            self.evaluate(usage)

    # -- the decision --------------------------------------------------------------

    def evaluate(self, usage: Usage | None = None) -> None:
        """Measure (unless ``usage`` was measured already) and decide."""
        if self._loop is not None:
            self._last_eval = self._loop.time()
        s = self.settings
        if usage is None:
            try:
                usage = measure(self.data_dir, self.db)
            except OSError as exc:
                log.error("store: cannot measure %s: %s", self.data_dir, exc)
                return
        self.usage = usage
        fault = self.committer.fault
        # room for the reserve's worth of writes plus a full WAL to be checkpointed into
        # the main file (the two hold the same pages for a while)
        low_water = (s.reserve_size if s.reserve_size else MIN_FREE) + JOURNAL_SIZE_LIMIT
        if self._disk_full:  # hysteresis: clear only with a margin
            low_water += low_water // 4
        space_low = usage.free < low_water
        cap = s.max_size and usage.db_bytes >= s.max_size
        near_cap = s.max_size and usage.db_bytes >= s.max_size * CAP_WATCH
        self.committer.probe_every = 0.0 if near_cap else COMMIT_CHECK_EVERY
        # a space fault: retry as soon as there is more room than when it began
        if fault is not None and fault.space and usage.free > self._fault_free_at:
            self._fault_free_at = usage.free
            self.committer.retry()
            fault = self.committer.fault
        disk_full = (fault is not None and fault.space) or space_low
        self._disk_full = disk_full
        self._alarm(
            "disk_full",
            disk_full,
            f"the store's file system is full: {_mb(usage.free)} free of {_mb(usage.total)}"
            f" (minimum {_mb(low_water)}); QoS 1/2 publishes and persistent sessions are"
            " refused",
            {"path": str(self.data_dir), "free": usage.free, "total": usage.total,
             "min_free": low_water, "reserve_held": self.reserve.held,
             "fault": fault.as_dict() if fault is not None else None},
        )
        # hysteresis: once raised, cleared 2 points below the watermark (no flapping)
        high = usage.used_ratio >= s.disk_high_watermark - (0.02 if self._high else 0.0)
        self._high = high
        self._alarm(
            "high_disk_usage",
            high,
            f"the store's file system is {usage.used_ratio:.0%} used "
            f"(watermark {s.disk_high_watermark:.0%})",
            {"path": str(self.data_dir), "usage": round(usage.used_ratio, 4),
             "watermark": s.disk_high_watermark, "free": usage.free, "total": usage.total},
        )
        write_error = fault is not None and not fault.space
        self._alarm(
            "store_write_error",
            write_error,
            f"the store cannot write ({fault.kind}): {fault.message}; QoS 1/2 publishes and"
            " persistent sessions are refused" if fault is not None else "",
            {"path": str(self.db), **(fault.as_dict() if fault is not None else {})},
        )
        self._alarm(
            "store_size_limit",
            bool(cap),
            f"the store is at its size cap: {_mb(usage.db_bytes)} of {_mb(s.max_size)}"
            " (durability.max_size); QoS 1/2 publishes and persistent sessions are refused",
            {"path": str(self.db), "size": usage.db_bytes, "max_size": s.max_size},
        )
        why = None
        if fault is not None:
            why = f"write error ({fault.kind})" if not fault.space else "disk full"
        elif space_low:
            why = "disk full"
        elif cap:
            why = "size cap"
        if why != self.refusing:
            if why is not None:
                self.refusals_started += 1
                log.warning("store refusing durable work: %s", why)
            else:
                log.warning("store accepting durable work again")
            self.refusing = why
        self.node.store_refusal = QUOTA_EXCEEDED if why is not None else 0
        if (
            not self.reserve.held
            and s.reserve_size
            and fault is None
            and usage.free >= 2 * s.reserve_size
            and not self.committer.log_waits_for_room
            and self.reserve.make()
        ):
            log.info("store reserve of %s made again", _mb(s.reserve_size))
        if fault is None:
            self._make_boot_reserve(usage)
        self._urgent = bool(disk_full or cap or high)
        if self._urgent and not self._maintaining:
            self.maintain(True)

    def _alarm(self, name: str, on: bool, message: str, details: dict[str, Any]) -> None:
        if on:
            self.alarms.activate(name, message, details)
        else:
            self.alarms.deactivate(name)

    # -- space back ----------------------------------------------------------------

    def maintain(self, urgent: bool = False) -> None:
        """Queue one vacuum/checkpoint task on the writer thread (at most one queued)."""
        if self._maintaining:
            return
        self._maintaining = True
        self.committer.submit(Task(lambda conn: maintain(conn, urgent), self._maintained))

    def _maintained(self, result: dict[str, int] | None, error: BaseException | None) -> None:
        self._maintaining = False
        self.maintenance_runs += 1
        if error is not None:
            log.debug("store maintenance failed: %s", error)
            return
        if result and result["freed_pages"]:
            self.pages_freed += result["freed_pages"]
            log.info("store gave back %s (incremental vacuum)",
                     _mb(result["freed_pages"] * result["page_size"]))
            self.evaluate()

    # -- views -----------------------------------------------------------------------

    def view(self) -> dict[str, Any]:
        u = self.usage
        fault = self.committer.fault
        return {
            "path": str(self.db),
            "writable": fault is None,
            "refusing": self.refusing,
            "fault": fault.as_dict() if fault is not None else None,
            "disk_total": u.total if u else None,
            "disk_free": u.free if u else None,
            "disk_usage": round(u.used_ratio, 4) if u else None,
            "db_bytes": u.db_bytes if u else None,
            "wal_bytes": u.wal_bytes if u else None,
            "max_size": self.settings.max_size,
            "disk_high_watermark": self.settings.disk_high_watermark,
            "reserve_size": self.settings.reserve_size,
            "reserve_held": self.reserve.held,
            "commit_failures": self.committer.failures,
            "pages_freed": self.pages_freed,
        }


def store_schemas() -> tuple[str, ...]:
    """The DDL of every module that keeps tables in ``gateway.db`` (run on a file
    salvaged while running, where a table may be missing)."""
    from gateway.bridge.store import SCHEMA as BRIDGE
    from gateway.cluster.outbox import SCHEMA as CLUSTER
    from gateway.store.banned import SCHEMA as BANNED
    from gateway.store.extensions import SCHEMA as EXTENSIONS
    from gateway.store.lwm2m import SCHEMA as LWM2M
    from gateway.store.sessions import SCHEMA as SESSIONS
    from gateway.store.users import SCHEMA as USERS

    return (SESSIONS, BANNED, USERS, LWM2M, BRIDGE, CLUSTER, EXTENSIONS)


def _mb(n: int) -> str:
    if n >= 1024 * 1024:
        return f"{n / 1048576:.1f} MiB"
    return f"{n / 1024:.0f} KiB"
