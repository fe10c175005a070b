"""gateway-fleet run without a range is incremental: only what is new is processed, a
late segment is merged into its days, and a re-run changes nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from gateway.fleet import checkpoint
from gateway.fleet.cli import main
from gateway.fleet.generate import FleetSpec, generate_fleet
from tests.gateway.fleet.test_consolidation import snapshot

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SPEC = FleetSpec(devices=8, days=4, interval=600.0, seed=11, devices_per_gw=4,
                 segment_seconds=6 * 3600, duplicate_segment_share=0.05)


def files(out: Path) -> dict[str, int]:
    """Every output file and its modification time (ns): what a run touched."""
    return {p.relative_to(out).as_posix(): p.stat().st_mtime_ns
            for p in out.rglob("*") if p.is_file()}


def run(raw: Path, out: Path, *extra: str) -> str:
    result = CliRunner().invoke(
        main, ["run", "--raw", str(raw), "--out", str(out), "--lookback-days", "1", *extra])
    assert result.exit_code == 0, result.output
    return result.output


def test_incremental_runs_equal_a_full_run(spark, tmp_path: Path) -> None:
    everything, raw, held = tmp_path / "all", tmp_path / "raw", tmp_path / "held"
    generate_fleet(everything, SPEC)
    shutil.copytree(everything, raw)
    # held back: the last day, and one gateway's segments of the day before (a unit
    # offline for a day delivers them late)
    for kind in ("telemetry", "events"):
        last = raw / kind / "ingest_date=2024-01-04"
        (held / kind / "late").mkdir(parents=True)
        shutil.move(last, held / kind / last.name)
        late = next((raw / kind / "ingest_date=2024-01-03").glob("site=*/gw=*"))
        dest = held / kind / "late" / late.relative_to(raw / kind)
        dest.parent.mkdir(parents=True)
        shutil.move(late, dest)
    out = tmp_path / "out"
    first = run(raw, out)
    assert "done in" in first
    seen = checkpoint.plan({}, None, 1)
    assert seen is None  # an empty raw root plans nothing
    before = files(out)
    assert "nothing new since the last run" in run(raw, out)
    assert files(out) == before  # a re-run changes nothing, not even a timestamp

    for kind in ("telemetry", "events"):
        shutil.move(held / kind / "ingest_date=2024-01-04", raw / kind / "ingest_date=2024-01-04")
        for gw in (held / kind / "late").glob("ingest_date=*/site=*/gw=*"):
            dest = raw / kind / gw.relative_to(held / kind / "late")
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(gw, dest)
    third = run(raw, out)
    assert "rebuilding 2024-01-02 .. 2024-01-04" in third  # the late day's lookback on
    after = files(out)
    day1 = [k for k in before if "event_date=2024-01-01/" in k]
    assert day1 and all(after.get(k) == before[k] for k in day1)  # day 1 untouched

    full = tmp_path / "full"
    run(everything, full, "--full")
    assert snapshot(out) == snapshot(full)
    assert "nothing new" in run(raw, out)
