"""The fleet consolidation job written again in DuckDB SQL: the benchmark's opponent.

Same input (the raw JSON-lines segments), same rules (see gateway/fleet/tables.py), same
seven tables written as Parquet partitioned by event_date, and the same line counts for the
data-quality report. One DuckDB connection, ``threads`` threads (2 to match Spark
``local[2]``).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.fleet.settings import JobSettings

MIN_EPOCH, MAX_EPOCH = 946_684_800, 4_102_444_800


def _read(kind: str, raw: Path, columns: str) -> str:
    return f"""
    select *, cast(ingest_date as date) as ingest from read_json(
        '{raw.as_posix()}/{kind}/ingest_date=*/site=*/gw=*/*.jsonl.gz',
        format = 'newline_delimited', ignore_errors = true, hive_partitioning = true,
        hive_types_autocast = false, columns = {{{columns}}})"""


_COMMON = "v: 'INTEGER', device: 'VARCHAR', seq: 'BIGINT', ts: 'DOUBLE', rx_ts: 'DOUBLE'"
_TELEMETRY = ", topic: 'VARCHAR', metrics: 'MAP(VARCHAR, VARCHAR)'"


def run(
    raw: Path, out: Path, s: JobSettings, threads: int = 2, say: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run the pipeline for every date present; returns line counts and row counts."""
    import duckdb

    con = duckdb.connect()
    con.execute(f"set threads = {threads}")
    con.execute("set enable_progress_bar = false")
    con.execute("set preserve_insertion_order = false")
    con.execute("set TimeZone = 'UTC'")
    lb = s.lookback_days
    ok_time = f"""ts >= {MIN_EPOCH} and ts < {MAX_EPOCH}
                  and rx_ts >= {MIN_EPOCH} and rx_ts < {MAX_EPOCH}"""
    event_date = "date '1970-01-01' + cast(floor(ts / 86400) as integer)"
    # DuckDB's ignore_errors drops a malformed line instead of keeping it: count the lines
    # separately (read_csv with one column), as Spark counts them in PERMISSIVE mode.
    con.execute(
        f"""create table tel as select *, case when {ok_time} then {event_date} end as event_date
            from ({_read("telemetry", raw, _COMMON + _TELEMETRY)})"""
    )
    con.execute(
        f"""create table ev as select *, case when {ok_time} then {event_date} end as event_date
            from ({_read("events", raw, _COMMON + ", event: 'VARCHAR'")})"""
    )
    lines = con.execute(
        f"""select count(*) from read_csv('{raw.as_posix()}/telemetry/*/*/*/*.jsonl.gz',
            columns = {{'line': 'VARCHAR'}}, delim = '\\x01', quote = '', escape = '',
            header = false)"""
    ).fetchall()[0][0]
    start, end = con.execute("select min(ingest), max(ingest) from tel").fetchall()[0]
    say(f"duckdb: read {lines:,} telemetry lines")
    # a malformed line comes back as a row of nulls
    status = f"""case when v is null and device is null and seq is null and ts is null
            then 'corrupt'
        when v is null or v <> 1 then 'version'
        when device is null or seq is null then 'null_key'
        when not ({ok_time}) then 'bad_time'
        when ingest - event_date not between -1 and {lb} then 'outside_window' else 'ok' end"""
    counts = dict(
        con.execute(
            f"""select {status} as st, count(*) from tel
                where coalesce(event_date, ingest) between '{start}' and '{end}' group by st"""
        ).fetchall()
    )
    counts["corrupt"] = (
        counts.get("corrupt", 0) + lines - con.execute("select count(*) from tel").fetchall()[0][0]
    )
    rng = f"event_date between '{start}' and '{end}'"
    con.execute(
        f"""create table clean as
        with rows as (
            select event_date, site, gw, device, seq, ts, rx_ts, topic, ingest,
                   map_from_entries(list_filter(
                       list_transform(map_entries(coalesce(metrics, map())),
                                      lambda e: struct_pack(key := e.key,
                                                       value := try_cast(e.value as double))),
                       lambda e: e.value is not null and isfinite(e.value))) as m,
                   cardinality(coalesce(metrics, map())) as n_in
            from tel where {status} = 'ok' and {rng}
        ), ranked as (
            select *, count(*) over (partition by device, event_date, seq) as copies
            from rows
            qualify row_number() over (partition by device, event_date, seq
                                       order by rx_ts, ingest, gw, site, ts, topic) = 1
        ), stepped as (
            select *, seq - lag(seq) over w - 1 as step, lag(ts) over w as prev_ts
            from ranked window w as (partition by device, event_date order by seq)
        )
        select event_date, site, gw, device, seq, to_timestamp(ts) as ts,
               to_timestamp(rx_ts) as rx_ts, topic, m as metrics,
               cast(n_in - cardinality(m) as integer) as bad_values,
               cast(copies - 1 as integer) as duplicates,
               cast(case when step between 1 and {s.seq_reset_cap} then step else 0 end
                    as integer) as seq_gap,
               coalesce(step > {s.seq_reset_cap}, false) as seq_reset,
               rx_ts - ts > {s.late_tolerance} as is_late,
               coalesce(ts < prev_ts - {s.ooo_tolerance}, false) as is_out_of_order
        from stepped"""
    )
    tables: dict[str, str] = {}
    tables["telemetry"] = "select * from clean"
    con.execute(
        """create table vals as select event_date, site, gw, device, seq, ts, e.key as metric,
           e.value as value from clean, unnest(map_entries(metrics)) as u(e)"""
    )
    stats = """count(value) as count, min(value) as min, max(value) as max, avg(value) as avg,
               stddev_samp(value) as stddev"""
    tables["rollup_5m"] = f"""select event_date, device, metric,
        to_timestamp(floor(epoch(ts) / 300) * 300) as window_start, max(site) as site,
        max(gw) as gw, {stats} from vals group by all"""
    tables["rollup_site_1h"] = f"""select event_date, site, metric,
        date_trunc('hour', ts) as hour, {stats}, quantile_cont(value, 0.95) as p95,
        count(distinct device) as devices
        from vals group by all"""
    tables["anomalies"] = f"""select * exclude (n) from (
        select event_date, site, gw, device, metric, ts, seq, value,
               avg(value) over w as mean, stddev_samp(value) over w as stddev,
               (value - avg(value) over w) / stddev_samp(value) over w as z,
               count(value) over w as n
        from vals window w as (partition by device, event_date, metric))
        where n >= {s.z_min_count} and stddev > 0 and abs(z) >= {s.z_threshold}"""
    # events: the whole history up to the end, deduplicated per device-day
    con.execute(
        f"""create table events as select event_date, site, gw, device, seq, ts, event
        from ev where v = 1 and device is not null and seq is not null and {ok_time}
          and ingest - event_date between -1 and {lb}
          and event in ('connected', 'disconnected') and event_date <= '{end}'
        qualify row_number() over (partition by device, event_date, seq
                                   order by rx_ts, ingest, gw, site, ts, event) = 1"""
    )
    run_end = dt.datetime.combine(end + dt.timedelta(days=1), dt.time(), dt.UTC).timestamp()
    midnight = "epoch(cast(event_date as timestamp))"
    con.execute(
        f"""create table sessions as
        with e as (
            select *, lead(ts) over w as next_ts, lag(ts) over w as prev_ts,
                   lag(event) over w as prev_event
            from events window w as (partition by device order by ts, seq)
        ), spans as (
            select site, gw, device, ts as s, coalesce(next_ts, {run_end}) as e,
                   false as start_inferred, next_ts is null as open
            from e where event = 'connected'
            union all
            select site, gw, device, greatest(coalesce(prev_ts, {midnight}), {midnight}),
                   ts, true, false
            from e where event = 'disconnected'
              and (prev_event is null or prev_event = 'disconnected')
        ), days as (
            select *, unnest(generate_series(cast(to_timestamp(s) as date),
                             cast(to_timestamp(e - 1e-6) as date), interval 1 day)) as d
            from spans where e > s
        ), sliced as (
            select *, cast(d as date) as event_date, epoch(cast(d as timestamp)) as d0
            from days
        )
        select event_date, site, gw, device, to_timestamp(s) as session_start,
               to_timestamp(greatest(s, d0)) as start, to_timestamp(least(e, d0 + 86400)) as end,
               least(e, d0 + 86400) - greatest(s, d0) as duration_s, start_inferred,
               s < d0 as clipped_start,
               e > d0 + 86400 or (open and e >= d0 + 86400) as clipped_end
        from sliced where {rng} and least(e, d0 + 86400) - greatest(s, d0) > 0"""
    )
    tables["device_sessions"] = "select * from sessions"
    con.execute(
        f"""create table daily as
        with t as (
            select event_date, device, max(site) as t_site, max(gw) as t_gw,
                   count(*) as messages, sum(duplicates) as duplicates,
                   sum(is_late::int) as late, sum(is_out_of_order::int) as out_of_order,
                   sum(seq_gap) as seq_holes, sum(seq_reset::int) as seq_resets,
                   sum(cardinality(metrics)) as metric_values, sum(bad_values) as bad_values,
                   min(ts) as first_ts, max(ts) as last_ts
            from clean group by all
        ), se as (
            select event_date, device, max(site) as s_site, max(gw) as s_gw,
                   count(*) as sessions, sum(duration_s) as uptime_s
            from sessions group by all
        ), ed as (
            select event_date, device, max(site) as ev_site, max(gw) as ev_gw,
                   sum((event = 'connected')::int) as connects,
                   sum((event = 'disconnected')::int) as disconnects,
                   max(recent) >= {s.flap_count} as flapping
            from (select *, (event = 'disconnected')::int * sum((event = 'disconnected')::int)
                     over (partition by device, event_date order by ts
                           range between {int(s.flap_window)} preceding and current row)
                     as recent
                  from events where {rng})
            group by all
        )
        select event_date, coalesce(t_site, s_site, ev_site) as site,
               coalesce(t_gw, s_gw, ev_gw) as gw, device,
               coalesce(messages, 0) as messages, coalesce(duplicates, 0) as duplicates,
               coalesce(late, 0) as late, coalesce(out_of_order, 0) as out_of_order,
               coalesce(seq_holes, 0) as seq_holes, coalesce(seq_resets, 0) as seq_resets,
               coalesce(metric_values, 0) as metric_values,
               coalesce(bad_values, 0) as bad_values, coalesce(sessions, 0) as sessions,
               coalesce(connects, 0) as connects, coalesce(disconnects, 0) as disconnects,
               coalesce(uptime_s, 0) as uptime_s, coalesce(uptime_s, 0) * 100 / 86400
               as uptime_pct, coalesce(flapping, false) as flapping, first_ts, last_ts
        from t full join se using (event_date, device) full join ed using (event_date, device)"""
    )
    tables["device_daily"] = "select * from daily"
    tables["gaps"] = f"""
        with m as (
            select event_date, site, gw, device, ts, lag(ts) over w as prev,
                   lead(ts) over w is null as is_last
            from clean window w as (partition by device, event_date order by ts)
        ), g as (
            select event_date, site, gw, device,
                   coalesce(prev, cast(event_date as timestamptz)) as gap_start, ts as gap_end,
                   case when prev is null then 'leading' else 'inner' end as kind from m
            union all
            select event_date, site, gw, device, ts, cast(event_date as timestamptz)
                   + interval 1 day, 'trailing' from m where is_last
            union all
            select event_date, site, gw, device, cast(event_date as timestamptz),
                   cast(event_date as timestamptz) + interval 1 day, 'no_data'
            from daily where messages = 0
        )
        select *, epoch(gap_end) - epoch(gap_start) as duration_s from g
        where epoch(gap_end) - epoch(gap_start) > {s.gap_threshold}"""
    rows: dict[str, int] = {}
    out.mkdir(parents=True, exist_ok=True)
    for name, sql in tables.items():
        started = time.monotonic()
        target = out / name
        con.execute(f"create or replace table out_{name} as {sql}")
        con.execute(
            f"copy out_{name} to '{target.as_posix()}' "
            "(format parquet, partition_by (event_date), overwrite_or_ignore true)"
        )
        rows[name] = con.execute(f"select count(*) from out_{name}").fetchall()[0][0]
        say(f"duckdb: wrote {name} ({time.monotonic() - started:.1f}s)")
    return {"start": start, "end": end, "lines": counts, "rows": rows}
