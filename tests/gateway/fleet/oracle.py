"""DuckDB as an independent oracle: the job's rollups recomputed straight from the raw
JSON lines, with the job's acceptance rules written again in SQL."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ACCEPTED = """
with raw as (
    select * from read_json(
        '{raw}/telemetry/*/*/*/*.jsonl.gz',
        format = 'newline_delimited', ignore_errors = true, hive_partitioning = true,
        columns = {{v: 'INTEGER', device: 'VARCHAR', seq: 'BIGINT', ts: 'DOUBLE',
                   rx_ts: 'DOUBLE', topic: 'VARCHAR', metrics: 'MAP(VARCHAR, VARCHAR)'}}
    )
), typed as (
    select *, cast(ingest_date as date) as ingest,
           date '1970-01-01' + cast(floor(ts / 86400) as integer) as event_date
    from raw
    where v = 1 and device is not null and seq is not null
      and ts >= 946684800 and ts < 4102444800 and rx_ts >= 946684800 and rx_ts < 4102444800
), accepted as (
    select * from typed
    where ingest - event_date between -1 and {lookback}
    qualify row_number() over (
        partition by device, event_date, seq order by rx_ts, ingest, gw, site, ts, topic) = 1
), vals as (
    select event_date, site, device, ts, e.key as metric, try_cast(e.value as double) as value
    from accepted, unnest(map_entries(metrics)) as u(e)
)
select * from vals where value is not null and isfinite(value)
"""

STATS = """count(*) as count, min(value) as min, max(value) as max, avg(value) as avg,
           stddev_samp(value) as stddev"""


def rollups(raw: Path, lookback: int = 2) -> dict[str, list[tuple[Any, ...]]]:
    """``rollup_5m`` and ``rollup_site_1h`` as sorted tuples keyed like the job's output:
    (event_date, device, metric, window epoch, count, min, max, avg, stddev) and
    (event_date, site, metric, hour epoch, count, min, max, avg, stddev, p95, devices)."""
    import duckdb

    con = duckdb.connect()
    con.execute("set threads = 2")
    con.execute("set enable_progress_bar = false")
    con.execute("create table vals as " + ACCEPTED.format(raw=raw.as_posix(), lookback=lookback))
    five = con.execute(
        f"""select event_date, device, metric, floor(ts / 300) * 300 as w, {STATS}
            from vals group by all order by all"""
    ).fetchall()
    hourly = con.execute(
        f"""select event_date, site, metric, floor(ts / 3600) * 3600 as h, {STATS},
                   quantile_cont(value, 0.95) as p95, count(distinct device) as devices
            from vals group by all order by all"""
    ).fetchall()
    return {"rollup_5m": five, "rollup_site_1h": hourly}


def query(sql: str) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` on a fresh in-memory DuckDB."""
    import duckdb

    con = duckdb.connect()
    con.execute("set enable_progress_bar = false")
    return con.execute(sql).fetchall()


def job_rollups(out: Path) -> dict[str, list[tuple[Any, ...]]]:
    """The same tuples read from the job's Parquet output."""

    def read(table: str, key: str, time: str, extra: str = "") -> list[tuple[Any, ...]]:
        return query(
            f"""select event_date, {key}, metric, epoch({time}) as t,
                       count, min, max, avg, stddev {extra}
                from read_parquet('{out}/{table}/*/*.parquet', hive_partitioning = true)
                order by all"""
        )

    return {
        "rollup_5m": read("rollup_5m", "device", "window_start"),
        "rollup_site_1h": read("rollup_site_1h", "site", "hour", ", p95, devices"),
    }
