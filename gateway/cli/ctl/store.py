"""``gatewayctl store``: check and salvage the node's files by hand, on a stopped node.

    gatewayctl store check   [--config FILE | --data-dir DIR] [--full] [--json]
    gatewayctl store salvage [--config FILE | --data-dir DIR] [--force] [--json]
    gatewayctl store vacuum  [--config FILE | --data-dir DIR]

``check`` runs ``PRAGMA quick_check`` (``--full``: ``integrity_check``) on every
``gateway.db`` of the data directory (the node's, and its workers' in subdirectories)
and reads every sealed fleet archive segment (``archive/raw/**/*.jsonl.gz``) to its end;
exit 0 when all is sound, 1 when something is not (each problem on a line). ``salvage``
moves a malformed ``gateway.db`` aside (``gateway.db.corrupt-<time>``) and salvages what
can be read into a fresh one (what ``gatewayd`` does by itself at start), then says which
data survived; ``--force`` salvages a file that checks sound too. ``vacuum`` rewrites the
file with ``auto_vacuum=INCREMENTAL`` (files made before it existed need this once for
deleted data to give space back) and needs free space of about the file's size.

These work on files, not through the API: ``gatewayd`` must be stopped (a file open by a
running process is refused, exit 2). Bad input (no such directory, an unreadable
configuration) is one line and exit 2.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import click

from gateway.config import ConfigError, load_config
from gateway.fleet.spool import complete_members
from gateway.store.db import DB_NAME
from gateway.store.queue import QUEUE_DB_NAME
from gateway.store.salvage import check, is_corruption, salvage
from gateway.store.walcheck import check_wal


class BadInput(click.ClickException):
    exit_code = 2


@click.group(name="store", help="Check and salvage the node's files (gatewayd stopped).")
@click.option("-c", "--config", "config_path", default=None,
              type=click.Path(dir_okay=False, path_type=Path),
              help="gatewayd's configuration file (to find node.data_dir).")
@click.option("--data-dir", "data_dir", default=None, type=click.Path(path_type=Path),
              help="The data directory (instead of the configuration's node.data_dir).")
@click.pass_context
def store(ctx: click.Context, config_path: Path | None, data_dir: Path | None) -> None:
    ctx.obj = (config_path, data_dir)


def _data_dir(ctx: click.Context) -> tuple[Path, Path]:
    """(data dir, fleet archive root)."""
    config_path, data_dir = ctx.obj
    archive: Path | None = None
    if data_dir is None:
        try:
            config = load_config(config_path, environ=os.environ)
        except ConfigError as exc:
            raise BadInput(f"invalid configuration: {exc.message}") from None
        data_dir = Path(config.node.data_dir)
        archive = config.fleet.archiver.dir
    if not data_dir.is_dir():
        raise BadInput(f"{data_dir}: no such data directory")
    return data_dir, archive if archive is not None else data_dir / "archive"


def _databases(data_dir: Path) -> list[Path]:
    dbs = [data_dir / DB_NAME] if (data_dir / DB_NAME).exists() else []
    dbs += sorted(p for p in data_dir.glob(f"*/{DB_NAME}") if p.is_file())
    dbs += [data_dir / QUEUE_DB_NAME] if (data_dir / QUEUE_DB_NAME).exists() else []
    return dbs


def _open_by(path: Path) -> int | None:
    """The pid of a process holding ``path`` (or its WAL) open, if any (Linux /proc)."""
    targets = {str(path.resolve()), f"{path.resolve()}-wal"}
    me = os.getpid()
    for pid_dir in Path("/proc").glob("[0-9]*"):
        if int(pid_dir.name) == me:
            continue
        try:
            for fd in (pid_dir / "fd").iterdir():
                try:
                    if os.readlink(fd) in targets:
                        return int(pid_dir.name)
                except OSError:
                    continue
        except OSError:
            continue
    return None


def _refuse_if_open(dbs: list[Path]) -> None:
    for db in dbs:
        pid = _open_by(db)
        if pid is not None:
            raise BadInput(f"{db} is open by process {pid} (gatewayd running?): stop it first")


def torn_segments(archive: Path) -> list[tuple[Path, str]]:
    """Sealed archive segments that do not read to their end (gzip damaged or cut)."""
    out: list[tuple[Path, str]] = []
    raw = archive / "raw"
    if not raw.is_dir():
        return out
    for seg in sorted(raw.rglob("*.jsonl.gz")):
        try:
            data = seg.read_bytes()
        except OSError as exc:
            out.append((seg, exc.strerror or str(exc)))
            continue
        end = max((e for e, _ in complete_members(data)), default=0)
        if end < len(data):
            out.append((seg, f"readable to byte {end} of {len(data)}"))
    return out


@store.command(name="check")
@click.option("--full", is_flag=True, help="integrity_check instead of quick_check (slower).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def check_cmd(ctx: click.Context, full: bool, as_json: bool) -> None:
    """Check every gateway.db and archive segment of the data directory."""
    data_dir, archive = _data_dir(ctx)
    dbs = _databases(data_dir)
    _refuse_if_open(dbs)
    result: dict[str, Any] = {"databases": {}, "segments": {}}
    bad = False
    for db in dbs:
        wal = check_wal(Path(f"{db}-wal"))  # first: opening the file checkpoints the WAL
        problems = check(db, quick=not full)
        if wal is not None and wal.damaged:
            problems.append(
                f"WAL damaged at frame {wal.first_bad} of {wal.frames}: "
                f"{wal.later_commits} committed transactions after it are lost"
            )
        result["databases"][str(db)] = problems
        bad = bad or bool(problems)
    for seg, why in torn_segments(archive):
        result["segments"][str(seg)] = why
        bad = True
    if as_json:
        click.echo(json.dumps(result, indent=2))
    else:
        if not dbs:
            click.echo(f"{data_dir}: no {DB_NAME} (a new node)")
        for db, problems in result["databases"].items():
            if not problems:
                click.echo(f"{db}: ok")
            else:
                what = "malformed" if is_corruption(problems) else "not checked"
                click.echo(f"{db}: {what}: {problems[0]}"
                           + (f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""))
        for seg, why in result["segments"].items():
            click.echo(f"{seg}: torn segment, {why} (the fleet job skips the rest)")
    ctx.exit(1 if bad else 0)


@store.command(name="salvage")
@click.option("--force", is_flag=True, help="Salvage even a file that checks sound.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def salvage_cmd(ctx: click.Context, force: bool, as_json: bool) -> None:
    """Move a malformed gateway.db aside and salvage it into a fresh one."""
    data_dir, _ = _data_dir(ctx)
    dbs = _databases(data_dir)
    if not dbs:
        raise BadInput(f"{data_dir}: no {DB_NAME} to salvage")
    _refuse_if_open(dbs)
    reports = []
    for db in dbs:
        problems = check(db)
        if not problems and not force:
            if not as_json:
                click.echo(f"{db}: ok, nothing to salvage (--force to do it anyway)")
            continue
        if problems and not is_corruption(problems) and not force:
            raise click.ClickException(f"{db}: cannot be checked: {problems[0]}")
        report = salvage(db, problems or ["salvage forced"])
        reports.append(report.as_dict())
        if not as_json:
            click.echo(report.summary())
            for table, n in sorted(report.tables.items()):
                click.echo(f"  {table}: {n} rows")
            for err in report.errors[:10]:
                click.echo(f"  note: {err}")
    if as_json:
        click.echo(json.dumps(reports, indent=2))


@store.command(name="vacuum")
@click.pass_context
def vacuum_cmd(ctx: click.Context) -> None:
    """Rewrite gateway.db with incremental auto-vacuum (needs free space of its size)."""
    data_dir, _ = _data_dir(ctx)
    dbs = _databases(data_dir)
    _refuse_if_open(dbs)
    for db in dbs:
        conn = sqlite3.connect(db, isolation_level=None)
        try:
            before = os.stat(db).st_size
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            conn.execute("VACUUM")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            mode = conn.execute("PRAGMA auto_vacuum").fetchone()[0]
        except sqlite3.Error as exc:
            raise click.ClickException(f"{db}: {exc}") from None
        finally:
            conn.close()
        click.echo(f"{db}: {before} -> {os.stat(db).st_size} bytes, "
                   f"auto_vacuum={'incremental' if mode == 2 else mode}")
