"""The consolidation job's transformations: DataFrames in, DataFrames out, no I/O.

Rules that make a run's tables depend only on the rows, not on the range it covers (so
re-running a range is idempotent and a full-range run equals per-day runs):

- A row belongs to the UTC date of its ``ts`` (``event_date``) and is accepted only when
  its ``ingest_date`` lies in ``[event_date - 1, event_date + lookback_days]``.
- Every per-row window is partitioned by ``(device, event_date)``: duplicates, sequence
  holes, out-of-order rows, gaps, flapping and z-scores are judged within one device-day.
- Sessions are the one exception: a session is the time from a ``connected`` event to the
  device's next event (or, with no next event, to the end of the run), read from the
  whole event history, then clipped to each day it covers. A ``disconnected`` event with
  no ``connected`` before it starts a session at the later of the previous event and its
  own midnight (``start_inferred``).

Duplicates: rows with the same ``(device, event_date, seq)``; the first by ``(rx_ts,
ingest_date, gw, site, ts, topic)`` is kept and ``duplicates`` counts the others.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pyspark.sql import Column, DataFrame, Observation, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gateway.fleet.records import SUPPORTED_VERSIONS
from gateway.fleet.settings import JobSettings

DAY = 86400
# Epoch seconds accepted as a time: 2000-01-01 .. 2100-01-01 (guards timestamp overflow).
MIN_EPOCH = 946_684_800.0
MAX_EPOCH = 4_102_444_800.0

CORRUPT = "_corrupt"

_COMMON = [
    T.StructField("v", T.IntegerType()),
    T.StructField("device", T.StringType()),
    T.StructField("seq", T.LongType()),
    T.StructField("ts", T.DoubleType()),
    T.StructField("rx_ts", T.DoubleType()),
]
# site and gw come from the folder names (site=S/gw=G), ingest_date too.
TELEMETRY_SCHEMA = T.StructType(
    [
        *_COMMON,
        T.StructField("topic", T.StringType()),
        # Strings, cast afterwards: a non-numeric value spoils one value, not the line.
        T.StructField("metrics", T.MapType(T.StringType(), T.StringType())),
        T.StructField(CORRUPT, T.StringType()),
    ]
)
EVENTS_SCHEMA = T.StructType(
    [
        *_COMMON,
        T.StructField("event", T.StringType()),
        T.StructField(CORRUPT, T.StringType()),
    ]
)

PATH_FIELDS = [
    T.StructField("ingest_date", T.DateType()),
    T.StructField("site", T.StringType()),
    T.StructField("gw", T.StringType()),
]
"""Columns that partition discovery adds from ``ingest_date=D/site=S/gw=G``."""

# the columns a telemetry row keeps from classification to the table
_ROW_KEYS = ("event_date", "site", "gw", "device", "seq", "ts", "rx_ts", "topic", "ingest_date")

STATUSES = ("ok", "corrupt", "version", "null_key", "bad_time", "outside_window", "bad_event")


def _epoch_ok(col: Column) -> Column:
    return col.isNotNull() & (col >= MIN_EPOCH) & (col < MAX_EPOCH)


def classify(raw: DataFrame, s: JobSettings, *, events: bool = False) -> DataFrame:
    """``raw`` plus ``status`` (one of :data:`STATUSES`), ``event_date`` and ``dq_date``
    (the date a row counts under in the data-quality report: its event date, or its
    ingest date when it has none)."""
    ts_ok = _epoch_ok(F.col("ts")) & _epoch_ok(F.col("rx_ts"))
    event_date = F.when(ts_ok, F.to_date(F.timestamp_seconds(F.col("ts"))))
    lag_days = F.date_diff(F.col("ingest_date"), F.col("event_date"))
    status = (
        F.when(F.col(CORRUPT).isNotNull(), "corrupt")
        .when(~F.col("v").isin(*SUPPORTED_VERSIONS) | F.col("v").isNull(), "version")
        .when(F.col("device").isNull() | F.col("seq").isNull(), "null_key")
        .when(~ts_ok, "bad_time")
        .when((lag_days < -1) | (lag_days > s.lookback_days), "outside_window")
    )
    if events:
        status = status.when(~F.col("event").isin("connected", "disconnected"), "bad_event")
    return (
        raw.withColumn("event_date", event_date)
        .withColumn("status", status.otherwise("ok"))
        .withColumn("dq_date", F.coalesce(F.col("event_date"), F.col("ingest_date")))
    )


def in_range(col: Column, start: dt.date, end: dt.date) -> Column:
    return (col >= F.lit(start)) & (col <= F.lit(end))


# ------------------------------------------------------------------ clean telemetry


def dq_metrics(start: dt.date, end: dt.date) -> list[Column]:
    """Aggregates counting a classified DataFrame's lines per status within the range
    (``status_<name>``), for :meth:`DataFrame.observe` or a plain ``agg``."""
    inside = in_range(F.col("dq_date"), start, end)
    return [
        F.count(F.when(inside & (F.col("status") == status), 1)).alias(f"status_{status}")
        for status in STATUSES
    ]


def dq_from_metrics(row: dict[str, Any]) -> dict[str, int]:
    """The ``{status: lines}`` dict from :func:`dq_metrics`' values."""
    return {status: int(row.get(f"status_{status}") or 0) for status in STATUSES}


def clean_telemetry(
    classified: DataFrame,
    s: JobSettings,
    start: dt.date,
    end: dt.date,
    observation: Observation | None = None,
) -> DataFrame:
    """One row per message of the range: duplicates dropped, values cast, rows flagged.

    Columns: event_date, site, gw, device, seq, ts, rx_ts (timestamps), topic,
    metrics (map<string,double>, only finite numbers), bad_values (values dropped),
    duplicates, seq_gap (seq numbers missing just before), seq_reset, is_late,
    is_out_of_order.

    With ``observation``, every classified line (rejected ones too) goes through the
    shuffle and :func:`dq_metrics` is observed on the far side of it: the line counts
    come with the write, in the result stage, whose tasks' metrics Spark merges once per
    partition (a map stage re-run after a lost executor would count its lines twice).
    """
    rows = classified.select(*_ROW_KEYS, "metrics", "status", "dq_date")
    keep = (F.col("status") == "ok") & in_range(F.col("event_date"), start, end)
    # One shuffle by device-day and one sort by (event_date, device, seq, tie-breakers)
    # serve every window below and the writer (which wants rows sorted by event_date):
    # each window's partition and order keys are a prefix of that sort.
    day = ["event_date", "device"]
    if observation is None:
        rows = rows.where(keep).repartition(*day)
    else:
        rows = rows.repartition(*day).observe(observation, *dq_metrics(start, end)).where(keep)
    # A plain cast (compiled code; a value that is no number becomes null) and the
    # finiteness test on the values' array; only a map holding a null, NaN or infinity
    # goes through the lambda (evaluated row by row, outside the generated code).
    cast = F.coalesce(F.col("metrics"), F.create_map().cast("map<string,string>")).try_cast(
        "map<string,double>"
    )
    vals = F.map_values(F.col("cast"))
    all_finite = (
        (F.size(F.array_compact(vals)) == F.size(vals))
        & F.coalesce(F.array_max(vals) < float("inf"), F.lit(True))  # NaN sorts above inf
        & F.coalesce(F.array_min(vals) > float("-inf"), F.lit(True))
    )
    finite = F.when(all_finite, F.col("cast")).otherwise(
        F.map_filter(
            F.col("cast"), lambda _k, v: v.isNotNull() & ~F.isnan(v) & (F.abs(v) < float("inf"))
        )
    )
    rows = (
        rows.select(*_ROW_KEYS, cast.alias("cast"))
        .withColumn("values", finite)
        .withColumn("bad_values", F.size("cast") - F.size("values"))
    )
    # Two windows (one sort): over the copies in (seq, tie-breakers) order, the first of
    # each seq is kept; a kept row's copies are the rows up to the next kept one.
    copy_order = Window.partitionBy(*day).orderBy(
        "seq", "rx_ts", "ingest_date", "gw", "site", "ts", "topic"
    )
    whole = copy_order.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
    rows = (
        rows.withColumn("prev_seq", F.lag("seq").over(copy_order))
        .withColumn("rn", F.row_number().over(copy_order))
        .withColumn("n", F.count(F.lit(1)).over(whole))
    )
    rows = rows.where(F.col("prev_seq").isNull() | (F.col("prev_seq") != F.col("seq")))
    ordered = Window.partitionBy(*day).orderBy("seq")
    rows = rows.withColumn(
        "copies", F.coalesce(F.lead("rn").over(ordered), F.col("n") + 1) - F.col("rn")
    )
    step = F.col("seq") - F.lag("seq").over(ordered) - 1
    return rows.select(
        "event_date",
        "site",
        "gw",
        "device",
        "seq",
        F.timestamp_seconds("ts").alias("ts"),
        F.timestamp_seconds("rx_ts").alias("rx_ts"),
        "topic",
        F.col("values").alias("metrics"),
        F.col("bad_values").cast("int").alias("bad_values"),
        (F.col("copies") - 1).cast("int").alias("duplicates"),
        F.when(step.between(1, s.seq_reset_cap), step).otherwise(0).cast("int").alias("seq_gap"),
        F.coalesce(step > s.seq_reset_cap, F.lit(False)).alias("seq_reset"),
        ((F.col("rx_ts") - F.col("ts")) > s.late_tolerance).alias("is_late"),
        F.coalesce(F.col("ts") < F.lag("ts").over(ordered) - s.ooo_tolerance, F.lit(False)).alias(
            "is_out_of_order"
        ),
    )


def _epoch(col: str) -> Column:
    return F.unix_micros(F.col(col)) / 1e6


def values(telemetry: DataFrame) -> DataFrame:
    """The clean telemetry in long form: one row per (message, metric)."""
    return telemetry.select(
        "event_date",
        "site",
        "gw",
        "device",
        "seq",
        "ts",
        F.explode("metrics").alias("metric", "value"),
    )


def _stats(value: str = "value") -> list[Column]:
    v = F.col(value)
    return [
        F.count(v).alias("count"),
        F.min(v).alias("min"),
        F.max(v).alias("max"),
        F.avg(v).alias("avg"),
        F.stddev_samp(v).alias("stddev"),
    ]


def rollup_5m(long: DataFrame) -> DataFrame:
    """Per device, metric and 5-minute window: count, min, max, avg, stddev.

    No p95 here: a device's 5-minute window holds a handful of readings (p95 would be
    about the max), and an exact percentile over a million small groups costs more than
    the rest of the rollup.
    """
    window = F.timestamp_seconds(F.floor(_epoch("ts") / 300) * 300)
    # site and gw are grouping keys, not max(site): a string aggregate buffer rules out
    # the hash aggregate, and Spark sorted all the values twice (partial and final) for
    # it. A device is archived by one gateway at a time (docs/fleet.md, Limits); one
    # that moved inside a window would get a row per gateway.
    return long.groupBy(
        "event_date", "device", "metric", window.alias("window_start"), "site", "gw"
    ).agg(*_stats())


def rollup_site_1h(long: DataFrame) -> DataFrame:
    """Per site, metric and hour: count, min, max, avg, stddev, p95 (exact, linear
    interpolation) and devices."""
    keys = ["event_date", "site", "metric", "hour"]
    hourly = long.withColumn("hour", F.date_trunc("hour", F.col("ts")))
    stats = hourly.groupBy(*keys).agg(*_stats(), F.percentile("value", 0.95).alias("p95"))
    # counted apart: a distinct count beside other aggregates would copy every row (Expand)
    devices = (
        hourly.select(*keys, "device")
        .distinct()
        .groupBy(*keys)
        .agg(F.count(F.lit(1)).alias("devices"))
    )
    return stats.join(devices, keys)


def anomalies(long: DataFrame, s: JobSettings) -> DataFrame:
    """Values whose z-score within their device, metric and day is at least
    ``z_threshold`` in size, for device-days with at least ``z_min_count`` values.

    The per-group statistics are one small aggregate (a row per device, day and metric)
    joined back by broadcast: no shuffle and sort of every value, as a window would."""
    keys = ["device", "event_date", "metric"]
    stats = (
        long.groupBy(*keys)
        .agg(
            F.avg("value").alias("mean"),
            F.stddev_samp("value").alias("stddev"),
            F.count("value").alias("n"),
        )
        .where((F.col("n") >= s.z_min_count) & (F.col("stddev") > 0))
    )
    scored = long.join(F.broadcast(stats), keys).withColumn(
        "z", (F.col("value") - F.col("mean")) / F.col("stddev")
    )
    return scored.where(F.abs("z") >= s.z_threshold).select(
        "event_date", "site", "gw", "device", "metric", "ts", "seq", "value", "mean", "stddev", "z"
    )


# ------------------------------------------------------------------ events and sessions


def clean_events(classified: DataFrame, end: dt.date) -> DataFrame:
    """Accepted events up to ``end`` (the whole history: sessions need it), deduplicated."""
    rows = classified.where((F.col("status") == "ok") & (F.col("event_date") <= F.lit(end)))
    first = Window.partitionBy("device", "event_date", "seq").orderBy(
        "rx_ts", "ingest_date", "gw", "site", "ts", "event"
    )
    return (
        rows.withColumn("rank", F.row_number().over(first))
        .where(F.col("rank") == 1)
        .select("event_date", "site", "gw", "device", "seq", "ts", "event")
    )


def sessions(events: DataFrame, start: dt.date, end: dt.date) -> DataFrame:
    """Connected intervals clipped to each day of ``[start, end]`` (see module doc).

    Columns: event_date, site, gw, device, session_start (unclipped), start, end,
    duration_s, start_inferred, clipped_start, clipped_end.
    """
    w = Window.partitionBy("device").orderBy("ts", "seq")
    e = (
        events.withColumn("next_ts", F.lead("ts").over(w))
        .withColumn("prev_ts", F.lag("ts").over(w))
        .withColumn("prev_event", F.lag("event").over(w))
    )
    run_end = float(
        (dt.datetime.combine(end, dt.time(), dt.UTC) + dt.timedelta(days=1)).timestamp()
    )
    midnight = F.unix_seconds(F.col("event_date").cast("timestamp")).cast("double")
    from_connect = e.where(F.col("event") == "connected").select(
        "site",
        "gw",
        "device",
        F.col("ts").alias("s"),
        F.coalesce(F.col("next_ts"), F.lit(run_end)).alias("e"),
        F.lit(False).alias("start_inferred"),
        F.col("next_ts").isNull().alias("open"),
    )
    inferred = e.where(
        (F.col("event") == "disconnected")
        & (F.col("prev_event").isNull() | (F.col("prev_event") == "disconnected"))
    ).select(
        "site",
        "gw",
        "device",
        F.greatest(F.coalesce(F.col("prev_ts"), midnight), midnight).alias("s"),
        F.col("ts").alias("e"),
        F.lit(True).alias("start_inferred"),
        F.lit(False).alias("open"),
    )
    spans = from_connect.unionByName(inferred).where(F.col("e") > F.col("s"))
    day = F.explode(
        F.sequence(
            F.to_date(F.timestamp_seconds("s")),
            F.to_date(F.timestamp_seconds(F.col("e") - 1e-6)),
        )
    )
    sliced = spans.select("*", day.alias("event_date")).where(
        in_range(F.col("event_date"), start, end)
    )
    d0 = F.unix_seconds(F.col("event_date").cast("timestamp")).cast("double")
    lo = F.greatest(F.col("s"), d0)
    hi = F.least(F.col("e"), d0 + DAY)
    return sliced.select(
        "event_date",
        "site",
        "gw",
        "device",
        F.timestamp_seconds("s").alias("session_start"),
        F.timestamp_seconds(lo).alias("start"),
        F.timestamp_seconds(hi).alias("end"),
        (hi - lo).alias("duration_s"),
        "start_inferred",
        (F.col("s") < d0).alias("clipped_start"),
        # an open session runs to the end of the run: it goes on past that day too
        ((F.col("e") > d0 + DAY) | (F.col("open") & (F.col("e") >= d0 + DAY))).alias("clipped_end"),
    ).where(F.col("duration_s") > 0)


def event_daily(events: DataFrame, s: JobSettings, start: dt.date, end: dt.date) -> DataFrame:
    """Per device-day: connects, disconnects and flapping (``flap_count`` disconnects
    within ``flap_window`` seconds)."""
    day = events.where(in_range(F.col("event_date"), start, end))
    is_disc = (F.col("event") == "disconnected").cast("int")
    w = (
        Window.partitionBy("device", "event_date")
        .orderBy("ts")
        .rangeBetween(-int(s.flap_window), Window.currentRow)
    )
    day = day.withColumn("recent", F.sum(is_disc).over(w) * is_disc)
    return day.groupBy("event_date", "device").agg(
        F.max("site").alias("ev_site"),
        F.max("gw").alias("ev_gw"),
        F.sum((F.col("event") == "connected").cast("int")).alias("connects"),
        F.sum(is_disc).alias("disconnects"),
        (F.max("recent") >= s.flap_count).alias("flapping"),
    )


# ------------------------------------------------------------------ device-day tables


def device_daily(telemetry: DataFrame, sessions_: DataFrame, events_daily: DataFrame) -> DataFrame:
    """One row per device-day with telemetry, a session or an event."""
    t = telemetry.groupBy("event_date", "device").agg(
        F.max("site").alias("t_site"),
        F.max("gw").alias("t_gw"),
        F.count(F.lit(1)).alias("messages"),
        F.sum("duplicates").alias("duplicates"),
        F.sum(F.col("is_late").cast("int")).alias("late"),
        F.sum(F.col("is_out_of_order").cast("int")).alias("out_of_order"),
        F.sum("seq_gap").alias("seq_holes"),
        F.sum(F.col("seq_reset").cast("int")).alias("seq_resets"),
        F.sum(F.size("metrics")).alias("metric_values"),
        F.sum("bad_values").alias("bad_values"),
        F.min("ts").alias("first_ts"),
        F.max("ts").alias("last_ts"),
    )
    se = sessions_.groupBy("event_date", "device").agg(
        F.max("site").alias("s_site"),
        F.max("gw").alias("s_gw"),
        F.count(F.lit(1)).alias("sessions"),
        F.sum("duration_s").alias("uptime_s"),
    )
    keys = ["event_date", "device"]
    joined = t.join(se, keys, "full_outer").join(events_daily, keys, "full_outer")
    zero = F.lit(0)
    counts = [
        "messages",
        "duplicates",
        "late",
        "out_of_order",
        "seq_holes",
        "seq_resets",
        "metric_values",
        "bad_values",
        "sessions",
        "connects",
        "disconnects",
    ]
    return joined.select(
        "event_date",
        F.coalesce("t_site", "s_site", "ev_site").alias("site"),
        F.coalesce("t_gw", "s_gw", "ev_gw").alias("gw"),
        "device",
        *[F.coalesce(F.col(c), zero).cast("long").alias(c) for c in counts],
        F.coalesce(F.col("uptime_s"), F.lit(0.0)).alias("uptime_s"),
        (F.coalesce(F.col("uptime_s"), F.lit(0.0)) * (100.0 / DAY)).alias("uptime_pct"),
        F.coalesce(F.col("flapping"), F.lit(False)).alias("flapping"),
        "first_ts",
        "last_ts",
    )


def gaps(telemetry: DataFrame, daily: DataFrame, s: JobSettings) -> DataFrame:
    """Silences longer than ``gap_threshold`` within each device-day: before the first
    message (``leading``), between messages (``inner``), after the last (``trailing``),
    and whole days of device-days with no message (``no_data``)."""
    d0 = F.col("event_date").cast("timestamp")
    d1 = F.timestamp_add("DAY", F.lit(1), d0)
    w = Window.partitionBy("device", "event_date").orderBy("ts")
    t = telemetry.select("event_date", "site", "gw", "device", "ts")
    marked = t.withColumn("prev", F.lag("ts").over(w)).withColumn(
        "is_last", F.lead("ts").over(w).isNull()
    )
    inner = marked.select(
        "event_date",
        "site",
        "gw",
        "device",
        F.coalesce(F.col("prev"), d0).alias("gap_start"),
        F.col("ts").alias("gap_end"),
        F.when(F.col("prev").isNull(), "leading").otherwise("inner").alias("kind"),
    )
    trailing = marked.where("is_last").select(
        "event_date",
        "site",
        "gw",
        "device",
        F.col("ts").alias("gap_start"),
        d1.alias("gap_end"),
        F.lit("trailing").alias("kind"),
    )
    empty = daily.where(F.col("messages") == 0).select(
        "event_date",
        "site",
        "gw",
        "device",
        d0.alias("gap_start"),
        d1.alias("gap_end"),
        F.lit("no_data").alias("kind"),
    )
    out = inner.unionByName(trailing).unionByName(empty)
    seconds = _epoch("gap_end") - _epoch("gap_start")
    return out.withColumn("duration_s", seconds).where(F.col("duration_s") > s.gap_threshold)


def dq_counts(classified: DataFrame, start: dt.date, end: dt.date) -> dict[str, int]:
    """Lines per status within the range, from a classified raw DataFrame (one job)."""
    return dq_from_metrics(classified.agg(*dq_metrics(start, end)).collect()[0].asDict())
