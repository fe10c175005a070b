"""The central consolidation job: raw segments of the fleet in, Parquet tables out.

Steps (each prints a progress line):

1. list the ``ingest_date=`` folders of ``{raw}/telemetry`` and ``{raw}/events`` through
   Hadoop's FileSystem (so ``hdfs://``, ``s3a://`` and local paths all work) and resolve
   the range: by default the first to the last ingest date present;
2. read telemetry of ingest dates ``[start - 1, end + lookback]`` and events of every
   ingest date up to ``end + lookback`` with an explicit schema (PERMISSIVE: a corrupt
   line becomes a counted row, never a failure); the events (a few per device and day)
   are cached, the raw telemetry is not: it is read once, by the job that writes
   ``telemetry``, which also counts its lines per status (an observed metric);
3. write ``telemetry`` (clean messages), then read it back for ``rollup_5m``,
   ``rollup_site_1h`` and ``anomalies``; write ``device_sessions``, ``device_daily``,
   ``gaps``; the report's totals and row counts are observed by the jobs that write
   those tables (no pass reads a table back only to count it);
4. write the data-quality report to ``{out}/_dq/{start}_{end}.json``.

Invariants: every table is partitioned by ``event_date``; before a table is written, its
partitions for every date of the range are removed, and the write uses dynamic partition
overwrite, so dates outside the range are never touched and a date of the range holds
exactly this run's rows. Which rows a table holds follows :mod:`gateway.fleet.tables`.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from gateway.fleet import dq, tables
from gateway.fleet.settings import TABLES, JobSettings

Progress = Callable[[str], None]


def stderr_progress() -> Progress:
    started = time.monotonic()

    def say(message: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {message}", file=sys.stderr, flush=True)

    return say


def active_session() -> SparkSession | None:
    return SparkSession.getActiveSession()


LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")

# HotSpot compiles a method with C2 (its optimising JIT) after 5,000 calls by default. A
# job run is one JVM's whole life, and Spark generates new classes for every query: on
# the bench data C2 took 31 of a run's ~120 CPU-s on 2 cores. Thresholds 16 times higher
# (the minimum, 600 calls, 33 times) still compile the per-row loops (millions of calls):
# C2 took 17 CPU-s, the task threads 1-2 CPU-s more (less compiled code), and
# in the bench a run took 11 % less wall time and 14 % less CPU; small runs did not get
# slower (bench/README.md, "Round 7"). Only for a local master: this JVM runs the tasks.
# The caller's extraJavaOptions come after these and win.
LOCAL_JIT_OPTIONS = (
    "-XX:Tier4InvocationThreshold=80000 -XX:Tier4MinInvocationThreshold=20000 "
    "-XX:Tier4CompileThreshold=120000 -XX:Tier4BackEdgeThreshold=640000"
)


def spark_session(
    master: str | None = None,
    app_name: str = "gateway-fleet",
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """A session for the job. ``master`` is applied only when given; without it a plain
    ``python`` process gets ``local[*]`` while ``spark-submit`` keeps its own master.
    ``conf`` is applied to the builder (so JVM options still count)."""
    builder = SparkSession.builder.appName(app_name)
    under_submit = "PYSPARK_GATEWAY_PORT" in os.environ  # set by spark-submit
    if master:
        builder = builder.master(master)
    elif not under_submit:
        builder = builder.master("local[*]")
        master = "local[*]"
    if not under_submit:
        # An embedded JVM: room for the cached raw rows, no web UI, our log4j settings
        # (no start-up chatter on stderr; Spark's warnings still show).
        builder = builder.config("spark.driver.memory", os.environ.get("FLEET_DRIVER_MEMORY", "4g"))
        local = bool(master and master.startswith("local"))
        java_options = f"-Dlog4j2.configurationFile={LOG4J_CONFIG}"
        if local:
            java_options += f" {LOCAL_JIT_OPTIONS}"
            # One JVM on this host: bind to loopback, instead of warning that the host
            # name resolves to it (Debian's /etc/hosts does) and picking an interface.
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.defaultJavaOptions", java_options)
        builder = builder.config("spark.ui.enabled", "false")
        builder = builder.config("spark.ui.showConsoleProgress", "false")  # ours instead
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    configure(spark)
    return spark


def configure(spark: SparkSession) -> None:
    """Session settings the job relies on (dates in UTC, dynamic partition overwrite)."""
    conf = spark.conf
    conf.set("spark.sql.session.timeZone", "UTC")
    conf.set("spark.sql.sources.partitionOverwriteMode", "dynamic")
    conf.set("spark.sql.adaptive.enabled", "true")
    # Keep the hourly percentile in a hash map (one entry per site, metric and hour)
    # instead of sorting every value once a task has seen 128 groups.
    conf.set("spark.sql.objectHashAggregate.sortBased.fallbackThreshold", "65536")
    # site=001 must stay the string "001": partition values are typed by the schemas.
    conf.set("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
    sc = spark.sparkContext
    if not _is_set(spark, "spark.sql.shuffle.partitions"):
        # A few shuffle partitions per core, for every master (Spark's default of 200 made
        # a one-worker standalone cluster run 200 tiny tasks per shuffle); AQE coalesces
        # no further. A value given to spark-submit (--conf), the builder or the session
        # before this call is left alone, and so is coalescing then.
        conf.set("spark.sql.shuffle.partitions", str(max(4, 2 * sc.defaultParallelism)))
        if not _is_set(spark, "spark.sql.adaptive.coalescePartitions.enabled"):
            # Two partitions per core already are few; AQE merged the telemetry shuffle's
            # 4 into 3 on local[2] (one core idle for the last third of the job's biggest
            # stage). Uncoalesced: 4 even tasks, 4-9 s less wall on the bench data.
            conf.set("spark.sql.adaptive.coalescePartitions.enabled", "false")
    spark.sparkContext.setLogLevel("ERROR")


WRITE_OPTIONS: dict[str, dict[str, str]] = {
    # Every ts and rx_ts of the telemetry is distinct: Parquet's writer would build a
    # dictionary of them page after page before falling back to plain encoding (about
    # 3.5 of the ~8 CPU-s the table's write took on the bench data); without it the files
    # are smaller too. The other columns keep their dictionaries.
    "telemetry": {f"parquet.enable.dictionary#{c}": "false" for c in ("ts", "rx_ts")},
}
"""Parquet writer options per table (``parquet.*#column`` applies to one column)."""


def _is_set(spark: SparkSession, key: str) -> bool:
    """Whether the session's SQL conf holds an explicit ``key`` (spark-submit's ``--conf``
    values are copied into it when the session is made)."""
    return bool(spark._jsparkSession.sessionState().conf().contains(key))


@dataclass(frozen=True, slots=True)
class JobResult:
    start: dt.date
    end: dt.date
    report: dict[str, Any]
    seconds: float


class NoInput(Exception):
    """There is nothing to read (no ingest_date folder in range)."""


# ------------------------------------------------------------------ file system


def _fs(spark: SparkSession, path: str) -> tuple[Any, Any]:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    return hpath.getFileSystem(conf), jvm


def ingest_dates(spark: SparkSession, root: str) -> list[dt.date]:
    """The dates of the ``ingest_date=YYYY-MM-DD`` folders directly under ``root``."""
    fs, jvm = _fs(spark, root)
    statuses = fs.globStatus(jvm.org.apache.hadoop.fs.Path(root.rstrip("/") + "/ingest_date=*"))
    dates = []
    for status in statuses or []:
        name = status.getPath().getName()
        try:
            dates.append(dt.date.fromisoformat(name.split("=", 1)[1]))
        except ValueError:
            continue
    return sorted(dates)


def remove_partitions(spark: SparkSession, table: str, dates: list[dt.date]) -> None:
    fs, jvm = _fs(spark, table)
    for date in dates:
        path = jvm.org.apache.hadoop.fs.Path(f"{table}/event_date={date.isoformat()}")
        if fs.exists(path):
            fs.delete(path, True)


def write_text(spark: SparkSession, path: str, text: str) -> None:
    fs, jvm = _fs(spark, path)
    stream = fs.create(jvm.org.apache.hadoop.fs.Path(path), True)
    try:
        stream.write(bytearray(text.encode()))
    finally:
        stream.close()


def _days(start: dt.date, end: dt.date) -> list[dt.date]:
    return [start + dt.timedelta(days=i) for i in range((end - start).days + 1)]


# ------------------------------------------------------------------ the job


def read_raw(spark: SparkSession, root: str, dates: list[dt.date], *, events: bool) -> DataFrame:
    """The raw rows of ``dates`` with ``ingest_date``, ``site`` and ``gw`` from the paths."""
    schema = tables.EVENTS_SCHEMA if events else tables.TELEMETRY_SCHEMA
    if not dates:
        fields = [*schema.fields, *tables.PATH_FIELDS]
        return spark.createDataFrame([], T.StructType(fields))
    paths = [f"{root}/ingest_date={d.isoformat()}" for d in dates]
    return (
        spark.read.schema(schema)
        .option("mode", "PERMISSIVE")
        .option("columnNameOfCorruptRecord", tables.CORRUPT)
        # a torn segment (a card that failed mid-write: the gzip ends early) is read up
        # to the damage and the rest skipped with a warning, not fatal to the job;
        # gatewayctl store check lists such segments on the unit
        .option("ignoreCorruptFiles", "true")
        .option("basePath", root)
        .option("pathGlobFilter", "*.jsonl.gz")
        .option("recursiveFileLookup", "false")
        .json(paths)
        .withColumn("ingest_date", F.to_date("ingest_date"))
    )


def run(spark: SparkSession, settings: JobSettings, progress: Progress | None = None) -> JobResult:
    """Run the job for ``settings`` (see module docstring); returns the DQ report."""
    say = progress or (lambda _m: None)
    began = time.monotonic()
    s = settings
    raw_t, raw_e = f"{s.raw.rstrip('/')}/telemetry", f"{s.raw.rstrip('/')}/events"
    t_dates, e_dates = ingest_dates(spark, raw_t), ingest_dates(spark, raw_e)
    present = sorted(set(t_dates) | set(e_dates))
    if not present:
        raise NoInput(f"no ingest_date=... folders under {raw_t} or {raw_e}")
    start = s.start or present[0]
    end = s.end or present[-1]
    if start > end:
        raise ValueError(f"start {start} is after end {end}")
    s = replace(s, start=start, end=end)
    last_ingest = end + dt.timedelta(days=s.lookback_days)
    t_read = [d for d in t_dates if start - dt.timedelta(days=1) <= d <= last_ingest]
    e_read = [d for d in e_dates if d <= last_ingest]
    say(
        f"range {start} .. {end} ({(end - start).days + 1} days, lookback {s.lookback_days}); "
        f"reading {len(t_read)} telemetry and {len(e_read)} event ingest dates"
    )

    raw_tel = read_raw(spark, raw_t, t_read, events=False)
    raw_ev = read_raw(spark, raw_e, e_read, events=True)
    ev = tables.classify(raw_ev, s, events=True).persist(StorageLevel.MEMORY_AND_DISK)

    out = s.out.rstrip("/")
    days = _days(start, end)
    schemas: dict[str, T.StructType] = {}

    def write(name: str, df: DataFrame, *metrics: Column) -> dict[str, Any]:
        """Write ``df`` as table ``name``; ``metrics`` (aggregates) are computed over the
        written rows by the same job (observed), not by another pass."""
        path = f"{out}/{name}"
        remove_partitions(spark, path, days)
        schemas[name] = df.schema
        seen = Observation(name)
        writer = df.observe(seen, F.count(F.lit(1)).alias("rows"), *metrics).write
        for key, value in WRITE_OPTIONS.get(name, {}).items():
            writer = writer.option(key, value)
        writer.mode("overwrite").partitionBy("event_date").parquet(path)
        say(f"wrote {name}")
        return dict(seen.get)

    def table(name: str) -> DataFrame:
        df = spark.read.schema(schemas[name]).parquet(f"{out}/{name}")
        return df.where(tables.in_range(F.col("event_date"), start, end))

    # The raw telemetry is read once: its line counts per status are observed by the
    # job that writes the telemetry table (no cache of the raw rows, no counting pass).
    lines = Observation("telemetry_lines")
    write("telemetry", tables.clean_telemetry(tables.classify(raw_tel, s), s, start, end, lines))
    t_lines = tables.dq_from_metrics(lines.get)
    e_lines = tables.dq_counts(ev, start, end)
    say(f"read {sum(t_lines.values()):,} telemetry lines, {sum(e_lines.values()):,} event lines")
    clean = table("telemetry")
    long = tables.values(clean).persist(StorageLevel.MEMORY_AND_DISK)
    write("rollup_5m", tables.rollup_5m(long))
    write("rollup_site_1h", tables.rollup_site_1h(long))
    anomalies = write("anomalies", tables.anomalies(long, s))["rows"]
    long.unpersist()

    events = tables.clean_events(ev, end).persist(StorageLevel.MEMORY_AND_DISK)
    write("device_sessions", tables.sessions(events, start, end))
    ev.unpersist()  # not before: events is built from it by the write above
    daily = tables.device_daily(
        clean, table("device_sessions"), tables.event_daily(events, s, start, end)
    )
    sums = write("device_daily", daily, *_totals())
    events.unpersist()
    gaps = write("gaps", tables.gaps(clean, table("device_daily"), s))["rows"]

    totals = dq.Totals(
        **{k: int(v or 0) for k, v in sums.items() if k != "rows"}, gaps=gaps, anomalies=anomalies
    )
    report = dq.build_report(start, end, s.lookback_days, t_lines, e_lines, totals, s.dq)
    write_text(spark, f"{out}/_dq/{start}_{end}.json", json.dumps(report, indent=2, sort_keys=True))
    say(f"wrote _dq/{start}_{end}.json")
    return JobResult(start, end, report, time.monotonic() - began)


def _totals() -> list[Column]:
    """The report's sums over the written device_daily rows (observed: no read-back)."""
    return [
        *[
            F.coalesce(F.sum(c), F.lit(0)).alias(c)
            for c in (
                "messages",
                "duplicates",
                "late",
                "out_of_order",
                "seq_holes",
                "seq_resets",
                "metric_values",
                "bad_values",
                "sessions",
            )
        ],
        # observed metrics allow no distinct aggregate: the set of devices instead
        F.size(F.collect_set("device")).alias("devices"),
        F.count(F.lit(1)).alias("device_days"),
        F.coalesce(F.sum(F.col("flapping").cast("int")), F.lit(0)).alias("flapping_device_days"),
    ]


__all__ = ["TABLES", "JobResult", "NoInput", "configure", "run", "spark_session"]
