"""The job on a generated fleet: DuckDB as the oracle for the rollups, re-runs and per-day
runs against a full-range run, the CLI, and segments written by the real archiver."""

from __future__ import annotations

import datetime as dt
import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from gateway.core.clock import VirtualScheduler
from gateway.core.node import CoreSettings, Node
from gateway.fleet import spool
from gateway.fleet.archiver import Archiver, ArchiverSettings
from gateway.fleet.cli import main
from gateway.fleet.generate import FleetSpec, generate_fleet
from gateway.fleet.settings import TABLES, JobSettings
from protocols.context import ClientInfo, Message
from tests.gateway.fleet import oracle
from tests.gateway.fleet.conftest import T2
from tests.gateway.fleet.test_archiver import Handle

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SPEC = FleetSpec(
    devices=12,
    days=2,
    interval=300.0,
    seed=7,
    devices_per_gw=6,
    segment_seconds=6 * 3600,
    truncated_share=0.002,
    null_device_share=0.001,
    string_value_share=0.001,
    duplicate_line_share=0.01,
    lost_line_share=0.002,
)


def snapshot(out: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every table's rows, sorted, with floats rounded (sums may differ in the last bits
    when rows are split differently among tasks)."""

    def norm(value: Any) -> Any:
        if isinstance(value, float):
            return None if math.isnan(value) else round(value, 6)
        if isinstance(value, dict):
            return tuple(sorted((k, norm(v)) for k, v in value.items()))
        return value

    tables: dict[str, list[tuple[Any, ...]]] = {}
    for table in TABLES:
        if not list((out / table).glob("*/*.parquet")):
            tables[table] = []
            continue
        rows = oracle.query(
            f"select * from read_parquet('{out}/{table}/*/*.parquet', hive_partitioning=true)"
        )
        tables[table] = sorted((tuple(norm(v) for v in row) for row in rows), key=repr)
    return tables


@pytest.fixture(scope="module")
def fleet(spark, tmp_path_factory) -> dict[str, Any]:
    from gateway.fleet import job

    base = tmp_path_factory.mktemp("fleet")
    manifest = generate_fleet(base / "raw", SPEC)
    result = job.run(spark, JobSettings(raw=str(base / "raw"), out=str(base / "full")))
    return {"base": base, "manifest": manifest, "result": result}


def test_rollups_match_duckdb(fleet):
    base = fleet["base"]
    expected = oracle.rollups(base / "raw")
    got = oracle.job_rollups(base / "full")
    for table in ("rollup_5m", "rollup_site_1h"):
        assert len(got[table]) == len(expected[table]) > 0
        for mine, theirs in zip(got[table], expected[table], strict=True):
            assert mine[:4] == theirs[:4]
            for a, b in zip(mine[4:], theirs[4:], strict=True):
                assert a == b or a == pytest.approx(b, rel=1e-9)


def test_report_counts_what_the_generator_injected(fleet):
    manifest, report = fleet["manifest"], fleet["result"].report
    lines = report["lines"]["telemetry"]
    assert sum(lines.values()) == manifest["telemetry_lines"]
    assert lines["corrupt"] == manifest["corrupt_lines"] > 0
    assert lines["null_key"] == manifest["null_key_lines"] > 0
    assert report["totals"]["bad_values"] == manifest["string_values"] > 0
    totals = report["totals"]
    assert totals["duplicates"] == manifest["duplicate_lines"] + manifest["duplicate_segment_lines"]
    # every reading lost on the way (cut, keyless or dropped) is a hole, barring the
    # ones that were a device-day's first or last message
    lost = manifest["lost_lines"] + manifest["truncated_lines"] + manifest["null_device_lines"]
    assert 0 < totals["seq_holes"] <= lost
    assert totals["late"] > 0 and totals["devices"] == SPEC.devices


def test_per_day_runs_and_reruns_equal_the_full_run(spark, fleet):
    from gateway.fleet import job

    base, result = fleet["base"], fleet["result"]
    full = snapshot(base / "full")
    assert all(full[t] for t in ("telemetry", "device_daily", "device_sessions", "gaps"))
    day = result.start
    while day <= result.end:
        job.run(
            spark, JobSettings(raw=str(base / "raw"), out=str(base / "daily"), start=day, end=day)
        )
        day += dt.timedelta(days=1)
    assert snapshot(base / "daily") == full
    # The full range again, over the per-day output, through the CLI: the same tables.
    # A zero threshold for corrupt lines makes --fail-on-dq fail the run (after writing).
    args = ["run", "--raw", str(base / "raw"), "--out", str(base / "daily")]
    outcome = CliRunner().invoke(main, [*args, "--fail-on-dq", "--dq-threshold", "corrupt_lines=0"])
    assert outcome.exit_code == 3, outcome.output
    assert "data quality" in outcome.output and "BREACH    corrupt_lines" in outcome.output
    assert snapshot(base / "daily") == full
    name = f"{result.start}_{result.end}.json"
    report = json.loads((base / "daily" / "_dq" / name).read_text())
    assert report["ok"] is False and report["thresholds"]["corrupt_lines"] == 0
    assert report["lines"] == result.report["lines"]


def test_the_job_reads_what_the_archiver_wrote(spark, tmp_path):
    from gateway.fleet import job

    clock = VirtualScheduler(T2 - 600)  # ten minutes before midnight
    node = Node(CoreSettings(), clock)
    settings = ArchiverSettings(
        root=tmp_path / "archive", site="plant", gw="edge-1", rotate_interval=120.0
    )
    archiver = Archiver(settings, clock, sink=spool.ThreadSink(), metrics=node.metrics)
    archiver.attach(node.hooks)
    clients = {}
    for cid in ("m1", "m2"):
        info = ClientInfo(client_id=cid)
        node.open_session(
            info,
            Handle(),
            clean_start=True,
            expiry_interval=0,
            receive_maximum=10,
            will=None,
            will_delay=0,
        )
        clients[cid] = info
    for minute in range(20):
        for cid, info in clients.items():
            payload = json.dumps({"temp": 20 + minute, "ts": clock.time()}).encode()
            node.publish(info, Message(f"s/{cid}", payload, publisher=cid, timestamp=clock.time()))
        clock.advance(60)
    m2 = clients["m2"]
    session = node.sessions["m2"]
    assert session.handle is not None
    node.close(m2, session.handle, send_will=False)
    archiver.close()

    out = tmp_path / "out"
    result = job.run(spark, JobSettings(raw=str(tmp_path / "archive" / "raw"), out=str(out)))
    assert (result.start, result.end) == (dt.date(2024, 3, 1), dt.date(2024, 3, 2))
    daily = {(r[0], r[1]): r for r in _daily(out)}
    assert daily[("m1", dt.date(2024, 3, 1))][2] == 10  # messages before midnight
    assert daily[("m1", dt.date(2024, 3, 2))][2] == 10
    assert daily[("m2", dt.date(2024, 3, 2))][3] == 1  # its disconnect
    assert daily[("m1", dt.date(2024, 3, 1))][4] == pytest.approx(600 / 864)  # uptime %
    assert result.report["ok"] and result.report["totals"]["seq_holes"] == 0


def _daily(out: Path) -> list[tuple[Any, ...]]:
    return oracle.query(
        f"""select device, event_date, messages, disconnects, uptime_pct
            from read_parquet('{out}/device_daily/*/*.parquet', hive_partitioning=true)"""
    )
