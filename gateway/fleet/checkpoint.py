"""The incremental run's checkpoint: which raw segments the tables already hold.

``{out}/_checkpoint/{kind}/{ingest_date}.json`` lists, per kind and ingest date, the
segments (path under the raw root, size) that the last successful run had read. A run
without ``--start``/``--end`` compares the raw root with it:

- nothing new (every segment listed with the same size): the run does nothing at all;
- otherwise it rebuilds the event dates from ``min(new ingest dates) - lookback`` (the
  earliest event date a new record can be accepted under) to the last ingest date
  present, clamped to the first ingest date present, which is exactly what a full run
  would write for those dates (the job's rows depend only on the rows, not the range;
  sessions are judged on the whole event history, and a new event can only change the
  day it falls on and later ones). A late segment is thereby merged into its days.

Invariants: the checkpoint is written only after every table and the DQ report of the
run were written, one file per ingest date that changed (a crash before leaves the old
checkpoint, and the next run redoes the same dates: idempotent). Segments are named by
their path; one re-delivered with another size counts as new.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from typing import Any

from pyspark.sql import SparkSession

from gateway.fleet.records import KINDS

Listing = dict[str, dict[str, int]]
"""``{"{kind}/{ingest_date}": {path under the raw root: size}}``."""

FOLDER = "_checkpoint"


@dataclass(frozen=True, slots=True)
class Plan:
    start: dt.date
    end: dt.date
    new_segments: int
    changed: list[str]  # "{kind}/{ingest_date}" keys whose listing changed


def _fs(spark: SparkSession, path: str) -> tuple[Any, Any]:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    hpath = jvm.org.apache.hadoop.fs.Path(path)
    return hpath.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration()), jvm


def list_raw(spark: SparkSession, raw: str) -> Listing:
    """Every visible ``*.jsonl.gz`` under ``{raw}/{kind}/ingest_date=*/`` (names starting
    with ``.`` or ``_`` are in-flight or metadata, as for Spark)."""
    raw = raw.rstrip("/")
    fs, jvm = _fs(spark, raw)
    listing: Listing = {}
    for kind in KINDS:
        base = jvm.org.apache.hadoop.fs.Path(f"{raw}/{kind}")
        if not fs.exists(base):
            continue
        for status in fs.listStatus(base):
            name = status.getPath().getName()
            if not status.isDirectory() or not name.startswith("ingest_date="):
                continue
            files: dict[str, int] = {}
            it = fs.listFiles(status.getPath(), True)
            while it.hasNext():
                f = it.next()
                path = f.getPath()
                rel = path.toUri().getPath().split(f"/{kind}/{name}/", 1)[-1]
                if any(p.startswith((".", "_")) for p in rel.split("/")):
                    continue
                if rel.endswith(".jsonl.gz"):
                    files[f"{kind}/{name}/{rel}"] = int(f.getLen())
            listing[f"{kind}/{name.split('=', 1)[1]}"] = files
    return listing


def load(spark: SparkSession, out: str) -> Listing | None:
    """The checkpoint, or None when there is none (the first run)."""
    root = f"{out.rstrip('/')}/{FOLDER}"
    fs, jvm = _fs(spark, root)
    if not fs.exists(jvm.org.apache.hadoop.fs.Path(root)):
        return None
    listing: Listing = {}
    for kind in KINDS:
        folder = jvm.org.apache.hadoop.fs.Path(f"{root}/{kind}")
        if not fs.exists(folder):
            continue
        for status in fs.listStatus(folder):
            name = status.getPath().getName()
            if not name.endswith(".json"):
                continue
            stream = fs.open(status.getPath())
            try:
                data = jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
            finally:
                stream.close()
            listing[f"{kind}/{name[:-5]}"] = json.loads(data)
    return listing


def save(spark: SparkSession, out: str, listing: Listing, keys: list[str]) -> None:
    """Write the checkpoint files of ``keys`` (each replaced whole)."""
    from gateway.fleet.job import write_text

    root = f"{out.rstrip('/')}/{FOLDER}"
    for key in keys:
        write_text(spark, f"{root}/{key}.json", json.dumps(listing.get(key, {}), sort_keys=True))


def plan(listing: Listing, seen: Listing | None, lookback_days: int) -> Plan | None:
    """The dates to rebuild for what is new in ``listing`` (see the module docstring);
    None when nothing is new."""
    dates = sorted({dt.date.fromisoformat(k.split("/", 1)[1]) for k, v in listing.items() if v})
    if not dates:
        return None
    if seen is None:
        return Plan(dates[0], dates[-1], sum(len(v) for v in listing.values()), sorted(listing))
    changed: list[str] = []
    new = 0
    for key, files in listing.items():
        before = seen.get(key, {})
        fresh = sum(1 for path, size in files.items() if before.get(path) != size)
        if fresh:
            changed.append(key)
            new += fresh
    if not changed:
        return None
    first_new = min(dt.date.fromisoformat(k.split("/", 1)[1]) for k in changed)
    start = max(first_new - dt.timedelta(days=lookback_days), dates[0])
    return Plan(start, dates[-1], new, sorted(changed))
