"""The data-quality report: counts in, a JSON document and a human summary out.

Pure Python (no Spark), so the arithmetic is tested on its own. A ratio whose
denominator is zero is 0.0. A breach is a ratio strictly above its threshold; the report
is ``ok`` when there is none.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from gateway.fleet.settings import DqThresholds

REJECTED = ("version", "null_key", "bad_time", "outside_window", "bad_event")


@dataclass(frozen=True, slots=True)
class Totals:
    """Sums over the range's device-days and tables."""

    messages: int = 0
    duplicates: int = 0
    late: int = 0
    out_of_order: int = 0
    seq_holes: int = 0
    seq_resets: int = 0
    metric_values: int = 0
    bad_values: int = 0
    devices: int = 0
    device_days: int = 0
    flapping_device_days: int = 0
    sessions: int = 0
    gaps: int = 0
    anomalies: int = 0


def _ratio(n: int, d: int) -> float:
    return n / d if d else 0.0


def build_report(
    start: dt.date,
    end: dt.date,
    lookback_days: int,
    telemetry_lines: dict[str, int],
    event_lines: dict[str, int],
    totals: Totals,
    thresholds: DqThresholds,
) -> dict[str, Any]:
    """The report as a JSON-ready dict (see docs/fleet.md for its fields)."""
    lines = sum(telemetry_lines.values()) + sum(event_lines.values())
    corrupt = telemetry_lines.get("corrupt", 0) + event_lines.get("corrupt", 0)
    rejected = sum(telemetry_lines.get(k, 0) + event_lines.get(k, 0) for k in REJECTED)
    t = totals
    ratios = {
        "corrupt_lines": _ratio(corrupt, lines),
        "rejected_rows": _ratio(rejected, lines),
        "bad_values": _ratio(t.bad_values, t.metric_values + t.bad_values),
        "duplicates": _ratio(t.duplicates, t.messages + t.duplicates),
        "late": _ratio(t.late, t.messages),
        "out_of_order": _ratio(t.out_of_order, t.messages),
        "seq_holes": _ratio(t.seq_holes, t.messages + t.seq_holes),
    }
    limits = thresholds.as_dict()
    breaches = [
        {"check": name, "ratio": ratios[name], "threshold": limits[name]}
        for name in ratios
        if ratios[name] > limits[name]
    ]
    return {
        "range": {"start": start.isoformat(), "end": end.isoformat()},
        "lookback_days": lookback_days,
        "lines": {"telemetry": dict(telemetry_lines), "events": dict(event_lines)},
        "totals": {name: getattr(t, name) for name in t.__slots__},
        "ratios": ratios,
        "thresholds": limits,
        "breaches": breaches,
        "ok": not breaches,
    }


def summary(report: dict[str, Any]) -> str:
    """A few lines for a person reading the job's output."""
    r, t, lines = report["range"], report["totals"], report["lines"]
    tl, el = lines["telemetry"], lines["events"]
    out = [
        f"data quality {r['start']} .. {r['end']}: {'OK' if report['ok'] else 'FAILED'}",
        f"  lines     telemetry {sum(tl.values()):,} (ok {tl.get('ok', 0):,}, corrupt "
        f"{tl.get('corrupt', 0):,}, rejected {sum(tl.get(k, 0) for k in REJECTED):,}); "
        f"events {sum(el.values()):,} (corrupt {el.get('corrupt', 0):,})",
        f"  messages  {t['messages']:,} from {t['devices']:,} devices "
        f"({t['device_days']:,} device-days); duplicates {t['duplicates']:,}, "
        f"late {t['late']:,}, out of order {t['out_of_order']:,}",
        f"  sequence  holes {t['seq_holes']:,}, resets {t['seq_resets']:,}; "
        f"bad values {t['bad_values']:,} of {t['metric_values'] + t['bad_values']:,}",
        f"  sessions  {t['sessions']:,}; flapping device-days {t['flapping_device_days']:,}; "
        f"gaps {t['gaps']:,}; anomalies {t['anomalies']:,}",
    ]
    for b in report["breaches"]:
        out.append(f"  BREACH    {b['check']}: {b['ratio']:.4f} > {b['threshold']:.4f}")
    return "\n".join(out)
