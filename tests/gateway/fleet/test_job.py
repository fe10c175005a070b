"""The consolidation job on a small hand-made fleet whose every figure is computed here.

One job run (module fixture) over two days; each test checks one table or rule.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from gateway.fleet.settings import JobSettings
from tests.gateway.fleet.conftest import D1, T1, T2, ev, tel, write_segment

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

D2 = D1 + dt.timedelta(days=1)


def read_table(out: Path, table: str, where: str = "true") -> list[dict[str, Any]]:
    import duckdb

    files = list((out / table).glob("event_date=*/*.parquet"))
    if not files:
        return []
    con = duckdb.connect()
    cur = con.execute(
        f"select * from read_parquet('{out}/{table}/*/*.parquet', hive_partitioning=true) "
        f"where {where}"
    )
    columns = [d[0] for d in cur.description or []]
    return [dict(zip(columns, row, strict=True)) for row in cur.fetchall()]


def build_raw(raw: Path) -> None:
    day1: list[dict[str, Any] | str] = [
        # duplicates: seq 2 twice
        tel("dev-a", 1, T1 + 60),
        tel("dev-a", 2, T1 + 120),
        tel("dev-a", 2, T1 + 120),
        tel("dev-a", 3, T1 + 180),
        # 5-minute window edges
        tel("dev-w", 1, T1 + 299.9, metrics={"t": 10}),
        tel("dev-w", 2, T1 + 300.0, metrics={"t": 20}),
        tel("dev-w", 3, T1 + 301.0, metrics={"t": 30}),
        tel("dev-w", 4, T1 + 599.0, metrics={"t": 40}),
        # a gap of 3000 s, then silence to midnight
        tel("dev-g", 1, T1 + 10),
        tel("dev-g", 2, T1 + 600),
        tel("dev-g", 3, T1 + 3600),
        # sequence holes, and a reset
        tel("dev-h", 1, T1 + 100),
        tel("dev-h", 2, T1 + 160),
        tel("dev-h", 5, T1 + 340),
        tel("dev-h", 6, T1 + 400),
        tel("dev-r", 1, T1 + 100),
        tel("dev-r", 2, T1 + 160),
        tel("dev-r", 50_000, T1 + 220),
        # late and out of order
        tel("dev-l", 1, T1 + 1000, T1 + 1000.5),
        tel("dev-l", 2, T1 + 1060, T1 + 1060.2),
        tel("dev-l", 3, T1 + 500, T1 + 1100),
        tel("dev-l", 4, T1 + 1120, T1 + 1120.1),
        # bad data
        '{"v":1,"site":"s1","gw":"g1","device":"dev-x","seq":1,"ts":17',  # truncated
        tel(None, 9, T1 + 100),  # null key
        tel("dev-s", 1, T1 + 100, metrics={"t": "n/a", "u": 5}),  # string value
        tel("dev-u", 1, T1 + 100, fw="1.2", nested={"a": [1, 2]}),  # unknown fields
        {**tel("dev-v", 1, T1 + 100), "v": 2},  # a version we do not read
        tel("dev-z", 1, 1e300),  # a time that is no time
    ]
    # one value far from the others (an anomaly), under its own metric name
    spiky = [10.0] * 30 + [10.5] * 30 + [100.0]
    day1 += [tel("dev-k", i + 1, T1 + 60 * i, metrics={"k": v}) for i, v in enumerate(spiky)]
    write_segment(raw, "telemetry", D1, day1)
    # arrives the next day, within the lookback: accepted, and late
    write_segment(raw, "telemetry", D2, [tel("dev-a", 4, T1 + 86000, T2 + 100)], "late")
    # arrives three days after its event date: outside the lookback of 2
    write_segment(raw, "telemetry", D1 + dt.timedelta(days=3), [tel("dev-o", 1, T1 + 50)], "old")
    write_segment(
        raw,
        "events",
        D1,
        [
            ev("dev-m", 1, T1 + 23 * 3600, "connected"),
            ev("dev-f", 1, T1 + 8 * 3600, "connected"),
            ev("dev-f", 2, T1 + 9 * 3600, "disconnected"),
            ev("dev-f", 3, T1 + 9 * 3600 + 60, "connected"),
            ev("dev-f", 4, T1 + 9 * 3600 + 180, "disconnected"),
            ev("dev-f", 5, T1 + 9 * 3600 + 240, "connected"),
            ev("dev-f", 6, T1 + 9 * 3600 + 360, "disconnected"),
            ev("dev-f", 7, T1 + 9 * 3600 + 420, "connected"),
            ev("dev-n", 1, T1 + 8 * 3600, "connected"),
            ev("dev-n", 2, T1 + 9 * 3600, "disconnected"),
            ev("dev-n", 3, T1 + 9 * 3600 + 60, "connected"),
            ev("dev-n", 4, T1 + 9 * 3600 + 300, "disconnected"),
            ev("dev-q", 1, T1 + 3600, "disconnected"),  # no connect before it
        ],
    )
    write_segment(raw, "events", D2, [ev("dev-m", 2, T2 + 3600, "disconnected")])
    # a torn segment: its gzip cut in the middle (a card failing mid-write)
    torn = write_segment(raw, "telemetry", D1,
                         [tel("dev-t", i + 1, T1 + 60 * i, metrics={"torn": 1.0}, site="st")
                          for i in range(400)],
                         "torn", site="st")
    data = torn.read_bytes()
    torn.write_bytes(data[: len(data) // 2])


@pytest.fixture(scope="module")
def hand(spark, tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    from gateway.fleet import job

    base = tmp_path_factory.mktemp("hand")
    build_raw(base / "raw")
    settings = JobSettings(raw=str(base / "raw"), out=str(base / "out"), start=D1, end=D2)
    result = job.run(spark, settings)
    return base / "out", result.report


def daily(out: Path, device: str, day: dt.date = D1) -> dict[str, Any]:
    [row] = read_table(out, "device_daily", f"device = '{device}' and event_date = '{day}'")
    return row


def test_duplicates_are_dropped_and_counted(hand):
    out, _ = hand
    rows = read_table(out, "telemetry", "device = 'dev-a'")
    assert sorted((r["event_date"], r["seq"], r["duplicates"]) for r in rows) == [
        (D1, 1, 0),
        (D1, 2, 1),
        (D1, 3, 0),
        (D1, 4, 0),
    ]
    row = daily(out, "dev-a")
    assert (row["messages"], row["duplicates"], row["late"]) == (4, 1, 1)


def test_five_minute_windows_split_at_the_edge(hand):
    out, _ = hand
    rows = read_table(out, "rollup_5m", "device = 'dev-w'")
    got = {(r["window_start"].minute, r["count"]): r for r in rows}
    assert set(got) == {(0, 1), (5, 3)}
    first, second = got[(0, 1)], got[(5, 3)]
    assert (first["min"], first["max"], first["avg"], first["stddev"]) == (10, 10, 10, None)
    assert (second["min"], second["max"], second["avg"]) == (20, 40, 30)
    assert second["stddev"] == pytest.approx(10.0)


def test_hourly_site_rollup(hand):
    out, _ = hand
    [row] = read_table(out, "rollup_site_1h", "metric = 't' and hour = '2024-03-01 00:00:00'")
    # t values of accepted messages in hour 0 of day 1 (dev-s's t was "n/a")
    # ones: a 3, g 2 (its third is in hour 1), h 4, r 3, l 4, u 1
    values = [1.0] * 17 + [10, 20, 30, 40]
    assert row["count"] == len(values)
    assert row["devices"] == 7  # a, w, g, h, r, l (t=1 at 500 s), u
    assert row["min"] == 1.0 and row["max"] == 40.0
    assert row["avg"] == pytest.approx(sum(values) / len(values))
    # p95 with linear interpolation: position 0.95 * 20 = 19 of the sorted 21 values
    assert row["p95"] == pytest.approx(sorted(values)[19])


def test_gaps_inside_the_day_and_after_the_last_message(hand):
    out, _ = hand
    rows = read_table(out, "gaps", "device = 'dev-g'")
    got = sorted((r["event_date"], r["kind"], r["duration_s"]) for r in rows)
    assert got == [(D1, "inner", 3000.0), (D1, "trailing", 86400.0 - 3600)]


def test_sequence_holes_and_resets(hand):
    out, _ = hand
    assert (daily(out, "dev-h")["seq_holes"], daily(out, "dev-h")["seq_resets"]) == (2, 0)
    assert (daily(out, "dev-r")["seq_holes"], daily(out, "dev-r")["seq_resets"]) == (0, 1)


def test_late_and_out_of_order_rows(hand):
    out, _ = hand
    rows = read_table(out, "telemetry", "device = 'dev-l'")
    flags = {r["seq"]: (r["is_late"], r["is_out_of_order"]) for r in rows}
    assert flags == {
        1: (False, False),
        2: (False, False),
        3: (True, True),
        4: (False, False),
    }


def test_a_session_across_midnight_is_clipped_to_each_day(hand):
    out, _ = hand
    rows = read_table(out, "device_sessions", "device = 'dev-m'")
    got = sorted(
        (r["event_date"], r["duration_s"], r["clipped_start"], r["clipped_end"]) for r in rows
    )
    assert got == [(D1, 3600.0, False, True), (D2, 3600.0, True, False)]
    assert daily(out, "dev-m")["uptime_pct"] == pytest.approx(100 / 24)
    assert daily(out, "dev-m", D2)["uptime_pct"] == pytest.approx(100 / 24)
    assert daily(out, "dev-m")["messages"] == 0


def test_flapping_and_sessions(hand):
    out, _ = hand
    f = daily(out, "dev-f")
    assert (f["disconnects"], f["connects"], f["flapping"]) == (3, 4, True)
    assert f["uptime_s"] == pytest.approx(3600 + 120 + 120 + (15 * 3600 - 420))
    assert daily(out, "dev-f", D2)["uptime_pct"] == pytest.approx(100.0)  # still connected
    n = daily(out, "dev-n")
    assert (n["disconnects"], n["flapping"]) == (2, False)
    # a disconnect with no connect before it: connected since its midnight
    [q] = read_table(out, "device_sessions", "device = 'dev-q'")
    assert (q["duration_s"], q["start_inferred"]) == (3600.0, True)


def test_torn_segment_is_read_up_to_the_damage_not_fatal(hand):
    out, _ = hand
    rows = read_table(out, "telemetry", "device = 'dev-t'")
    assert len(rows) < 400  # the job ran; what the torn file held before the cut may count


def test_bad_data_is_counted_not_fatal(hand):
    out, report = hand
    lines = report["lines"]["telemetry"]
    assert lines["corrupt"] == 1
    assert lines["null_key"] == 1
    assert lines["version"] == 1
    assert lines["bad_time"] == 1
    assert lines["outside_window"] == 1
    s = daily(out, "dev-s")
    assert (s["messages"], s["bad_values"], s["metric_values"]) == (1, 1, 1)
    assert daily(out, "dev-u")["messages"] == 1
    devices = {r["device"] for r in read_table(out, "telemetry")}
    assert not devices & {"dev-x", "dev-v", "dev-z", "dev-o", None}
    assert report["totals"]["bad_values"] == 1
    assert json.loads((out / "_dq" / f"{D1}_{D2}.json").read_text()) == report


def test_anomalies_by_z_score(hand):
    out, _ = hand
    [row] = read_table(out, "anomalies")
    assert (row["device"], row["metric"], row["value"], row["seq"]) == ("dev-k", "k", 100.0, 61)
    assert row["z"] == pytest.approx((100 - row["mean"]) / row["stddev"])
    assert row["z"] > 4


def test_an_embedded_local_jvm_gets_our_logging_and_jit_options(spark: Any) -> None:
    """A local master's JVM (the one that runs the tasks) starts with our log4j file and
    the raised C2 thresholds; options the caller adds come after them (the tests' own
    C1-only JIT here), so a caller can still override any of them."""
    from gateway.fleet import job

    jvm = spark.sparkContext._jvm
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    ours = [f"-Dlog4j2.configurationFile={job.LOG4J_CONFIG}", *job.LOCAL_JIT_OPTIONS.split()]
    assert all(a in args for a in ours), args
    assert args.index("-XX:TieredStopAtLevel=1") > max(args.index(a) for a in ours), args
