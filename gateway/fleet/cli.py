"""``gateway-fleet``: ship a unit's segments, generate a synthetic fleet, run the job.

    gateway-fleet ship [--config /etc/gateway/gateway.toml]
    gateway-fleet generate --out DIR --devices N --days D
    gateway-fleet run --raw DIR --out DIR [--start D --end D] [--master URL]
                      [--lookback-days N] [--fail-on-dq]

Also runnable with spark-submit (``spark-submit gateway/fleet/__main__.py run ...``), in
which case spark-submit's ``--master`` applies unless ``--master`` is given here too.

Exit status: 0 done; 1 nothing to read or a bad range (``ship``: the pass failed, see
the status file); 2 usage error or a bad configuration; 3 ``--fail-on-dq`` and a
data-quality threshold was exceeded (``ship``: another pass is running). PySpark is
imported only by ``run``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys

import click

from gateway import __version__
from gateway.fleet.settings import DqThresholds, JobSettings

EXIT_NO_INPUT = 1
EXIT_USAGE = 2
EXIT_DQ = 3
EXIT_BUSY = 3
DEFAULT_CONFIG = "/etc/gateway/gateway.toml"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="gateway-fleet")
def main() -> None:
    """Fleet telemetry: synthetic data and the PySpark consolidation job."""


@main.command()
@click.option(
    "-c",
    "--config",
    "config_path",
    envvar="GATEWAY_CONFIG",
    default=DEFAULT_CONFIG,
    show_default=True,
    help="The unit's gateway.toml ([fleet.archiver], [fleet.shipper]).",
)
@click.option("--rclone", default="rclone", show_default=True, help="The rclone binary.")
def ship(config_path: str, rclone: str) -> None:
    """Move sealed segments to the central store (one pass; a timer runs it)."""
    import logging

    from gateway.config import ConfigError, load_config
    from gateway.fleet import shipper

    logging.basicConfig(level=logging.WARNING, format="gateway-fleet: %(message)s")
    try:
        config = load_config(config_path)
    except (ConfigError, OSError) as exc:
        click.echo(f"gateway-fleet: {config_path}: {getattr(exc, 'message', exc)}", err=True)
        sys.exit(EXIT_USAGE)
    if not config.fleet.shipper.enable:
        click.echo("gateway-fleet: fleet.shipper.enable is false: nothing to do", err=True)
        return
    try:
        result, status = shipper.ship(config, rclone=rclone)
    except shipper.Busy as exc:
        click.echo(f"gateway-fleet: {exc}", err=True)
        sys.exit(EXIT_BUSY)
    except shipper.ShipError as exc:
        click.echo(f"gateway-fleet: ship failed: {exc}", err=True)
        sys.exit(EXIT_NO_INPUT)
    dropped = f", {len(result.dropped)} dropped (spool full)" if result.dropped else ""
    click.echo(
        f"shipped {len(result.shipped)} segments ({result.shipped_bytes:,} bytes){dropped}; "
        f"{status.pending_segments} pending ({status.pending_bytes:,} bytes)"
    )


@main.command()
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Raw root to write.")
@click.option("--devices", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--days", type=click.IntRange(min=1), default=2, show_default=True)
@click.option(
    "--start",
    type=click.DateTime(["%Y-%m-%d"]),
    default="2024-01-01",
    show_default=True,
    help="First day (UTC).",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=1),
    default=60.0,
    show_default=True,
    help="Seconds between a device's readings.",
)
@click.option("--seed", type=int, default=1, show_default=True)
def generate(
    out: str, devices: int, days: int, start: dt.datetime, interval: float, seed: int
) -> None:
    """Write a synthetic fleet (duplicates, late rows, silent devices, corrupt lines)."""
    from gateway.fleet.generate import FleetSpec, generate_fleet

    spec = FleetSpec(devices=devices, days=days, start=start.date(), interval=interval, seed=seed)
    manifest = generate_fleet(out, spec, progress=lambda m: click.echo(m, err=True))
    click.echo(
        f"wrote {manifest['telemetry_lines']:,} telemetry and {manifest['event_lines']:,} event "
        f"lines in {manifest['segments']:,} segments under {out}"
    )


def _threshold(
    _ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]
) -> DqThresholds:
    thresholds = DqThresholds()
    names = set(thresholds.as_dict())
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or name not in names:
            raise click.BadParameter(
                f"expected NAME=RATIO with NAME one of {', '.join(sorted(names))}"
            )
        try:
            ratio = float(value)
        except ValueError:
            raise click.BadParameter(f"{item}: not a number") from None
        thresholds = dataclasses.replace(thresholds, **{name: ratio})
    return thresholds


@main.command()
@click.option("--raw", required=True, help="Raw root (holds telemetry/ and events/).")
@click.option("--out", required=True, help="Output root for the tables and _dq/.")
@click.option("--start", type=click.DateTime(["%Y-%m-%d"]), help="First event date.")
@click.option("--end", type=click.DateTime(["%Y-%m-%d"]), help="Last event date.")
@click.option("--master", help="Spark master URL (default: local[*], or spark-submit's).")
@click.option(
    "--lookback-days",
    type=click.IntRange(min=0),
    default=2,
    show_default=True,
    help="Days after its event date a row may still arrive.",
)
@click.option(
    "--full",
    is_flag=True,
    help="Ignore the checkpoint: rebuild every date present (then write the checkpoint).",
)
@click.option("--fail-on-dq", is_flag=True, help="Exit 3 when a data-quality ratio is exceeded.")
@click.option(
    "--dq-threshold",
    "dq",
    multiple=True,
    callback=_threshold,
    metavar="NAME=RATIO",
    help="Override a data-quality threshold (repeatable).",
)
def run(
    raw: str,
    out: str,
    start: dt.datetime | None,
    end: dt.datetime | None,
    master: str | None,
    lookback_days: int,
    full: bool,
    fail_on_dq: bool,
    dq: DqThresholds,
) -> None:
    """Consolidate raw segments into Parquet tables and a data-quality report.

    Without --start/--end the run is incremental: only the dates that segments not seen
    before (per {out}/_checkpoint) can change are rebuilt; nothing new, nothing done."""
    from gateway.fleet import checkpoint, job
    from gateway.fleet import dq as dq_report

    settings = JobSettings(
        raw=raw,
        out=out,
        start=start.date() if start else None,
        end=end.date() if end else None,
        lookback_days=lookback_days,
        dq=dq,
    )
    say = job.stderr_progress()
    say("starting Spark")
    owned = job.active_session() is None  # a session we start is one we stop
    spark = job.spark_session(master)
    say(f"Spark {spark.version} on {spark.sparkContext.master}")
    incremental = start is None and end is None
    try:
        if incremental:
            listing = checkpoint.list_raw(spark, raw)
            seen = None if full else checkpoint.load(spark, out)
            todo = checkpoint.plan(listing, seen, lookback_days)
            if todo is None and any(listing.values()):
                click.echo(f"nothing new since the last run: {out} unchanged")
                return
            if todo is not None:
                say(f"{todo.new_segments:,} new segments: rebuilding {todo.start} .. {todo.end}")
                settings = dataclasses.replace(settings, start=todo.start, end=todo.end)
        result = job.run(spark, settings, say)
        if incremental and todo is not None:
            checkpoint.save(spark, out, listing, todo.changed)
            say(f"checkpoint: {len(todo.changed)} ingest dates recorded")
    except (job.NoInput, ValueError) as exc:
        click.echo(f"gateway-fleet: {exc}", err=True)
        sys.exit(EXIT_NO_INPUT)
    finally:
        if owned:
            spark.stop()
    click.echo(dq_report.summary(result.report))
    click.echo(f"done in {result.seconds:.1f}s: {out}")
    if fail_on_dq and not result.report["ok"]:
        sys.exit(EXIT_DQ)
