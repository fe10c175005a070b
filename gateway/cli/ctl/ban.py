"""``gatewayctl ban``: banned clients, in the node's database.

    gatewayctl ban [--config FILE] add KIND VALUE [--reason TEXT] [--duration 1h | --until T]
    gatewayctl ban [--config FILE] delete KIND VALUE
    gatewayctl ban [--config FILE] list [--all] [--json]

KIND is ``clientid``, ``username``, ``peerhost`` (an IP address) or ``cidr`` (a
network). The database is ``{node.data_dir}/gateway.db``, found like ``gatewayd`` finds it:
the ``--config`` file, then ``GATEWAY_*`` environment variables (``GATEWAY_NODE__DATA_DIR``).
A running ``gatewayd`` picks changes up within about a second and kicks clients that a new
ban matches. Errors are one line and exit status 1.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import click

from gateway.config import ConfigError, load_config, parse_duration
from gateway.store.banned import KINDS, Ban, BanError, BannedStore
from gateway.store.db import db_path

T = TypeVar("T")

KIND = click.Choice(KINDS)


@click.group(name="ban", help="Ban clients by client id, user name, address or network.")
@click.option(
    "-c",
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="gatewayd's configuration file (to find node.data_dir).",
)
@click.pass_context
def ban(ctx: click.Context, config_path: Path | None) -> None:
    ctx.obj = config_path


@contextmanager
def _store(ctx: click.Context) -> Iterator[BannedStore]:
    try:
        config = load_config(ctx.obj, environ=os.environ)
    except ConfigError as exc:
        raise click.ClickException(f"invalid configuration: {exc.message}") from None
    path = db_path(config.node.data_dir)
    try:
        store = BannedStore.open(path)
    except sqlite3.Error as exc:
        raise click.ClickException(f"{path}: {exc}") from None
    try:
        yield store
    finally:
        store.close()


def _run(action: Callable[[], T]) -> T:
    try:
        return action()
    except BanError as exc:
        raise click.ClickException(str(exc)) from None
    except sqlite3.Error as exc:
        raise click.ClickException(f"database: {exc}") from None


def _parse_until(text: str) -> float:
    """Wall-clock seconds from epoch seconds or an ISO 8601 time (local time if naive)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise click.BadParameter(
            "expected epoch seconds or an ISO 8601 time such as 2030-01-31T12:00"
        ) from None


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "never"
    return dt.datetime.fromtimestamp(epoch).astimezone().isoformat(timespec="seconds")


@ban.command(name="add")
@click.argument("kind", type=KIND)
@click.argument("value")
@click.option("--reason", default="", help="Why (shown by list and in the logs).")
@click.option("--duration", metavar="DURATION", help='How long: "30m", "2h", "7d" or seconds.')
@click.option("--until", metavar="TIME", help="Until when: epoch seconds or ISO 8601.")
@click.option("--by", "created_by", default="gatewayctl", show_default=True,
              help="Who bans (recorded).")
@click.pass_context
def add_cmd(
    ctx: click.Context,
    kind: str,
    value: str,
    reason: str,
    duration: str | None,
    until: str | None,
    created_by: str,
) -> None:
    """Ban VALUE of KIND (forever unless --duration or --until); replaces an existing ban."""
    if duration is not None and until is not None:
        raise click.UsageError("give --duration or --until, not both")
    seconds: float | None = None
    expires_at: float | None = None
    if duration is not None:
        try:
            seconds = parse_duration(duration)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--duration") from None
    if until is not None:
        expires_at = _parse_until(until)
        if expires_at <= time.time():
            raise click.BadParameter("the time is in the past", param_hint="--until")
    with _store(ctx) as store:
        added = _run(
            lambda: store.add(
                kind,
                value,
                reason=reason,
                created_by=created_by,
                duration=seconds,
                expires_at=expires_at,
            )
        )
    click.echo(f"banned {added.kind} {added.value} until {_when(added.expires_at)}")


@ban.command(name="delete")
@click.argument("kind", type=KIND)
@click.argument("value")
@click.pass_context
def delete_cmd(ctx: click.Context, kind: str, value: str) -> None:
    """Lift the ban on VALUE of KIND."""
    with _store(ctx) as store:
        found = _run(lambda: store.delete(kind, value))
    if not found:
        raise click.ClickException(f"no ban on {kind} {value}")
    click.echo(f"unbanned {kind} {value}")


def _as_dict(b: Ban) -> dict[str, object]:
    return {
        "kind": b.kind,
        "value": b.value,
        "reason": b.reason,
        "by": b.created_by,
        "at": b.created_at,
        "until": b.expires_at,
    }


@ban.command(name="list")
@click.option("--all", "show_all", is_flag=True, help="Include expired bans.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@click.pass_context
def list_cmd(ctx: click.Context, show_all: bool, as_json: bool) -> None:
    """The bans in force (or all of them)."""
    with _store(ctx) as store:
        bans = _run(store.all if show_all else store.active)
    if as_json:
        for b in bans:
            click.echo(json.dumps(_as_dict(b), ensure_ascii=False))
        return
    if not bans:
        click.echo("no bans")
        return
    rows = [("KIND", "VALUE", "UNTIL", "BY", "REASON")]
    rows += [(b.kind, b.value, _when(b.expires_at), b.created_by, b.reason) for b in bans]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
