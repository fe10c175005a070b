"""Fixtures for the fleet job tests: one local Spark session for the whole test session,
and helpers that write raw segments by hand."""

from __future__ import annotations

import datetime as dt
import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.fleet.records import Kind, partition_dir

D1 = dt.date(2024, 3, 1)
T1 = dt.datetime.combine(D1, dt.time(), dt.UTC).timestamp()  # 2024-03-01T00:00:00Z
T2 = T1 + 86400


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark")
    import os

    from gateway.fleet import job

    os.environ.setdefault("FLEET_DRIVER_MEMORY", "1g")
    # Tiny inputs: a quick-starting JIT and no code generation beat peak throughput.
    fast_start = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"}
    session = job.spark_session("local[2]", "gateway-fleet-tests", fast_start)
    session.conf.set("spark.sql.codegen.wholeStage", "false")
    session.conf.set("spark.sql.shuffle.partitions", "1")
    yield session
    session.stop()


def tel(
    device: str | None,
    seq: int,
    ts: float,
    rx: float | None = None,
    metrics: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    rec: dict[str, Any] = {"v": 1, "site": "s1", "gw": "g1", "device": device, "seq": seq}
    rec.update(ts=ts, rx_ts=ts + 0.5 if rx is None else rx, topic=f"t/{device}")
    rec["metrics"] = {"t": 1.0} if metrics is None else metrics
    rec.update(extra)
    return rec


def ev(device: str, seq: int, ts: float, event: str) -> dict[str, Any]:
    return {
        "v": 1,
        "site": "s1",
        "gw": "g1",
        "device": device,
        "seq": seq,
        "ts": ts,
        "rx_ts": ts,
        "event": event,
    }


def write_segment(
    raw: Path,
    kind: Kind,
    ingest: dt.date,
    lines: list[dict[str, Any] | str],
    name: str = "seg",
    site: str = "s1",
    gw: str = "g1",
) -> Path:
    folder = raw / partition_dir(kind, ingest, site, gw)
    folder.mkdir(parents=True, exist_ok=True)
    text = "".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines)
    path = folder / f"{name}.jsonl.gz"
    path.write_bytes(gzip.compress(text.encode()))
    return path
