"""The synthetic fleet generator and the data-quality arithmetic (no Spark)."""

from __future__ import annotations

import datetime as dt
import gzip
import json
from pathlib import Path

from click.testing import CliRunner

from gateway.fleet.cli import main
from gateway.fleet.dq import Totals, build_report, summary
from gateway.fleet.generate import MANIFEST, FleetSpec, generate_fleet
from gateway.fleet.settings import DqThresholds

SMALL = FleetSpec(devices=5, days=1, interval=120.0, devices_per_gw=3, truncated_share=0.01)


def lines(root: Path, kind: str) -> list[str]:
    out: list[str] = []
    for path in sorted((root / kind).rglob("*.jsonl.gz")):
        out.extend(gzip.decompress(path.read_bytes()).decode().splitlines())
    return out


def test_same_spec_same_bytes(tmp_path):
    generate_fleet(tmp_path / "a", SMALL)
    generate_fleet(tmp_path / "b", SMALL)
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.gz"))
    files_b = sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*.gz"))
    assert files_a == files_b
    for rel in files_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()


def test_layout_and_manifest(tmp_path):
    manifest = generate_fleet(tmp_path, SMALL)
    assert json.loads((tmp_path / MANIFEST).read_text()) == manifest
    tel, ev = lines(tmp_path, "telemetry"), lines(tmp_path, "events")
    assert len(tel) == manifest["telemetry_lines"] and len(ev) == manifest["event_lines"]
    sites = {p.name for p in (tmp_path / "telemetry").glob("*/site=*")}
    assert sites == {"site=site-01"}  # two gateways, two per site
    parsed = []
    for line in tel:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            continue
    assert len(tel) - len(parsed) == manifest["corrupt_lines"] >= manifest["truncated_lines"] > 0
    assert {r["v"] for r in parsed} == {1}
    day = dt.datetime(2024, 1, 1, tzinfo=dt.UTC).timestamp()
    assert all(day <= r["ts"] < day + 86400 for r in parsed)
    assert {json.loads(x)["event"] for x in ev} <= {"connected", "disconnected"}


def test_generate_command(tmp_path):
    args = ["generate", "--out", str(tmp_path), "--devices", "2", "--days", "1"]
    outcome = CliRunner().invoke(main, [*args, "--interval", "600"])
    assert outcome.exit_code == 0, outcome.output
    assert "telemetry" in outcome.output and (tmp_path / MANIFEST).exists()


def test_report_ratios_and_breaches():
    d = dt.date(2024, 1, 1)
    totals = Totals(messages=900, duplicates=100, late=90, seq_holes=100, metric_values=1000)
    report = build_report(
        d,
        d,
        2,
        {"ok": 990, "corrupt": 10},
        {"ok": 10},
        totals,
        DqThresholds(duplicates=0.05, late=0.2),
    )
    ratios = report["ratios"]
    assert ratios["corrupt_lines"] == 10 / 1010
    assert ratios["duplicates"] == 0.1
    assert ratios["late"] == 0.1
    assert ratios["seq_holes"] == 0.1
    assert ratios["bad_values"] == 0.0
    assert [b["check"] for b in report["breaches"]] == ["duplicates", "seq_holes"]
    assert report["ok"] is False
    text = summary(report)
    assert "FAILED" in text and "BREACH    duplicates" in text


def test_report_of_nothing_is_ok():
    d = dt.date(2024, 1, 1)
    report = build_report(d, d, 2, {}, {}, Totals(), DqThresholds())
    assert report["ok"] and all(v == 0.0 for v in report["ratios"].values())


def test_dq_threshold_option_is_checked():
    outcome = CliRunner().invoke(
        main, ["run", "--raw", "x", "--out", "y", "--dq-threshold", "nonsense=1"]
    )
    assert outcome.exit_code == 2
    assert "NAME=RATIO" in outcome.output
