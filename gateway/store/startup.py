"""The store's start-up and guard, as :class:`gateway.app.Gateway` uses them (kept here so
the assembly in app.py stays a few lines).

- :func:`prepare` runs before anything opens ``gateway.db``: the reserves left by the
  last run are freed, the WAL is checked for damage and the file for corruption, a
  malformed file is moved aside and salvaged (alarms ``store_wal_damaged``,
  ``store_salvaged``; the reports go to ``admin.salvage_reports`` for the status API).
- :func:`check` salvages one file (also when opening it failed with "malformed" after a
  clean quick_check).
- :func:`guard` builds and starts the :class:`~gateway.store.space.StoreGuard` from
  ``[durability]``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from gateway.store.db import db_path
from gateway.store.queue import QUEUE_DB_NAME
from gateway.store.salvage import keep_damaged_wal, open_checked, salvage
from gateway.store.space import (
    AlarmSink,
    Refusable,
    SpaceSettings,
    StoreGuard,
    release_leftover_reserve,
    store_schemas,
)
from gateway.store.writer import GroupCommitter


class Reporting(Protocol):
    """What of :class:`gateway.admin.admin.Admin` the start-up reports to."""

    @property
    def alarms(self) -> AlarmSink: ...
    @property
    def salvage_reports(self) -> list[dict[str, Any]]: ...


def prepare(data_dir: Path, check_dirs: Iterable[Path], check_on_start: bool,
            admin: Reporting | None) -> None:
    """Free the leftover reserves of ``data_dir``; check (and salvage) the
    ``gateway.db`` of each of ``check_dirs`` and the node's ``rules.db`` when
    ``check_on_start``."""
    release_leftover_reserve(data_dir)
    if check_on_start:
        for d in sorted(set(check_dirs)):
            check(db_path(d), admin)
        queues = data_dir / QUEUE_DB_NAME  # webhook queues, rules made at run time
        if queues.exists():
            check(queues, admin)


def check(path: Path, admin: Reporting | None, problems: list[str] | None = None) -> None:
    """Salvage ``path`` if malformed (or, given ``problems``, at once); the alarm
    ``store_salvaged`` says what survived, ``store_wal_damaged`` what a damaged WAL lost."""
    wal = keep_damaged_wal(path) if problems is None else None
    if wal is not None and admin is not None:
        found, copy = wal
        admin.alarms.activate(
            "store_wal_damaged",
            f"{path}-wal was damaged at frame {found.first_bad} of {found.frames}: "
            f"{found.later_commits} committed transactions after it are lost; copy in {copy}",
            {"path": str(path), "copy": str(copy), **found.as_dict()},
        )
    report = open_checked(path) if problems is None else salvage(path, problems)
    if report is not None and admin is not None:
        admin.alarms.activate("store_salvaged", report.summary(), report.as_dict())
        admin.salvage_reports.append(report.as_dict())


def guard(config: Any, committer: GroupCommitter, node: Refusable,
          alarms: AlarmSink) -> StoreGuard:
    """A started :class:`StoreGuard` for ``config.node.data_dir`` and ``[durability]``."""
    d = config.durability
    settings = SpaceSettings(d.reserve_size, d.max_size, d.disk_high_watermark,
                             d.check_interval)
    data_dir = Path(config.node.data_dir)
    g = StoreGuard(data_dir, db_path(data_dir), committer, node, alarms, settings,
                   store_schemas())
    g.start()
    return g
