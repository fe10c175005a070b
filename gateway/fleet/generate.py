"""A synthetic fleet in the archiver's layout, for tests, demos and the benchmark.

Each device is simulated on its own (seeded) random stream: it connects at the start,
reads every ``interval`` seconds, and now and then disconnects for a while. Readings
taken while offline are either lost (a gap) or buffered and sent on reconnect (late
rows, some out of order). Some devices flap, some go silent while connected, a few
values spike. Sequence numbers are assigned in receive order, as the archiver does.
Then the delivery path misbehaves: a few lines are cut short (corrupt), lose their
device (null key), carry a string value or an unknown field, or are duplicated; a few
segments are delivered twice and a few lines are lost (sequence holes).

Invariant: the output depends only on the :class:`FleetSpec` (same spec, same bytes),
and ``_generator.json`` at the root records the spec and what was injected.
"""

from __future__ import annotations

import bisect
import datetime as dt
import gzip
import json
import math
import random
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gateway.fleet.records import Kind, partition_dir, segment_name, utc_date

DAY = 86400.0
MANIFEST = "_generator.json"
_FIRST_VALUE = re.compile(r'("metrics":\{"[^"]+":)[^,}]+')


@dataclass(frozen=True, slots=True)
class FleetSpec:
    devices: int = 100
    days: int = 2
    start: dt.date = dt.date(2024, 1, 1)
    interval: float = 60.0
    seed: int = 1
    devices_per_gw: int = 50
    segment_seconds: float = 3600.0  # one segment per gateway, kind and this much time
    gws_per_site: int = 2
    disconnects_per_day: float = 1.0
    buffered_share: float = 0.5  # offline periods whose readings arrive late
    flapping_share: float = 0.03  # devices with one flapping burst
    silent_share: float = 0.04  # devices silent (but connected) for hours one day
    delayed_share: float = 0.002  # readings delayed 1-15 min in the network
    spike_share: float = 0.0002  # values far off their curve
    truncated_share: float = 0.00005
    null_device_share: float = 0.00002
    string_value_share: float = 0.00002
    unknown_field_share: float = 0.00005
    duplicate_line_share: float = 0.0005
    duplicate_segment_share: float = 0.005
    lost_line_share: float = 0.0002


_PROFILES = {
    "env": (("temp", 20.0, 4.0, 0.3), ("hum", 50.0, 10.0, 1.0)),
    "power": (("power_w", 500.0, 200.0, 20.0), ("voltage", 230.0, 2.0, 1.0)),
}


@dataclass(slots=True)
class _Line:
    rx: float
    text: str


def _offline_periods(
    rng: random.Random, spec: FleetSpec, t0: float, t1: float
) -> list[tuple[float, float, bool]]:
    """Non-overlapping ``(start, end, buffered)`` periods offline, in time order."""
    periods: list[tuple[float, float, bool]] = []
    expected = spec.disconnects_per_day * (t1 - t0) / DAY
    for _ in range(_poisson(rng, expected)):
        a = rng.uniform(t0 + 60, t1 - 60)
        length = rng.expovariate(1 / 1200) if rng.random() < 0.9 else rng.uniform(3600, 4 * 3600)
        periods.append((a, min(a + max(length, 30.0), t1 - 1), rng.random() < spec.buffered_share))
    if rng.random() < spec.flapping_share:
        a = rng.uniform(t0 + 3600, t1 - 3600)
        for i in range(5):
            periods.append((a + i * 90, a + i * 90 + 20, False))
    periods.sort()
    merged: list[tuple[float, float, bool]] = []
    for a, b, buffered in periods:
        if merged and a <= merged[-1][1] + 5:
            continue
        merged.append((a, b, buffered))
    return merged


def _poisson(rng: random.Random, lam: float) -> int:
    limit, k, p = math.exp(-lam), 0, 1.0
    while True:
        p *= rng.random()
        if p <= limit:
            return k
        k += 1


def _device(
    rng: random.Random, spec: FleetSpec, site: str, gw: str, device: str, profile: str
) -> tuple[list[_Line], list[_Line], dict[str, int]]:
    t0 = dt.datetime.combine(spec.start, dt.time(), dt.UTC).timestamp()
    t1 = t0 + spec.days * DAY
    stats: dict[str, int] = defaultdict(int)
    offline = _offline_periods(rng, spec, t0, t1)
    starts = [p[0] for p in offline]
    silent: tuple[float, float] | None = None
    if rng.random() < spec.silent_share:
        a = t0 + rng.randrange(spec.days) * DAY + rng.uniform(0, DAY / 2)
        silent = (a, a + rng.uniform(3, 10) * 3600)
    metrics = _PROFILES[profile]
    readings: list[tuple[float, float, str]] = []  # (rx, ts, metrics json)
    backlog_at: dict[int, float] = {}
    t = t0 + rng.uniform(0, spec.interval)
    while t < t1:
        ts = max(t0, t + rng.uniform(-2, 2))
        t += spec.interval
        if silent and silent[0] <= ts < silent[1]:
            continue
        hour = (ts % DAY) / 3600
        parts = []
        for name, base, amp, noise in metrics:
            value = base + amp * math.sin(2 * math.pi * (hour - 9) / 24) + rng.gauss(0, noise)
            if rng.random() < spec.spike_share:
                value += rng.choice((-1, 1)) * noise * rng.uniform(20, 40)
                stats["spikes"] += 1
            parts.append(f'"{name}":{value:.2f}')
        body = "{" + ",".join(parts) + "}"
        i = bisect.bisect_right(starts, ts) - 1
        if i >= 0 and ts < offline[i][1]:
            a, b, buffered = offline[i]
            if not buffered:
                stats["offline_lost"] += 1
                continue
            if i not in backlog_at:  # half the backlogs arrive after the first live reading
                backlog_at[i] = b + (
                    rng.uniform(0.5, 1) * spec.interval if rng.random() < 0.5 else 0.5
                )
            backlog_at[i] += 0.01
            readings.append((backlog_at[i], ts, body))
            stats["buffered"] += 1
            continue
        delay = rng.uniform(0.05, 0.5)
        if rng.random() < spec.delayed_share:
            delay = rng.uniform(60, 900)
            stats["delayed"] += 1
        readings.append((ts + delay, ts, body))
    readings.sort()
    topic = f"sensors/{device}/{profile}"
    head = f'{{"v":1,"site":"{site}","gw":"{gw}","device":"{device}","seq":'
    tel = [
        _Line(
            rx,
            f'{head}{n},"ts":{ts:.3f},"rx_ts":{rx:.3f},"topic":"{topic}","qos":1,"metrics":{body}}}',
        )
        for n, (rx, ts, body) in enumerate(readings, 1)
    ]
    events = [(t0 + rng.uniform(0, 5), "connected")]
    for a, b, _ in offline:
        events += [(a, "disconnected"), (b, "connected")]
    ev = [
        _Line(
            ts,
            f'{head}{n},"ts":{ts:.3f},"rx_ts":{ts:.3f},"event":"{kind}","protocol":"mqtt","peer":null}}',
        )
        for n, (ts, kind) in enumerate(events, 1)
    ]
    return tel, ev, stats


def _spoil(
    rng: random.Random, spec: FleetSpec, lines: list[_Line], stats: dict[str, int]
) -> list[str]:
    """The delivery path's damage to one segment's telemetry lines."""
    out: list[str] = []
    for line in lines:
        text = line.text
        r = rng.random()
        if r < spec.lost_line_share:
            stats["lost_lines"] += 1
            continue
        r -= spec.lost_line_share
        if r < spec.truncated_share:
            text = text[: len(text) // 2]
            stats["truncated_lines"] += 1
        elif (r := r - spec.truncated_share) < spec.null_device_share:
            text = text.replace(',"device":"', ',"device":null,"was":"', 1)
            stats["null_device_lines"] += 1
        elif (r := r - spec.null_device_share) < spec.string_value_share:
            text = _FIRST_VALUE.sub(r'\1"n/a"', text, count=1)
            stats["string_values"] += 1
        elif (r := r - spec.string_value_share) < spec.unknown_field_share:
            text = text[:-1] + ',"fw":"1.4.2","extra":{"a":[1,2]}}'
            stats["unknown_fields"] += 1
        out.append(text)
        if text is line.text and rng.random() < spec.duplicate_line_share:
            out.append(text)
            stats["duplicate_lines"] += 1
    return out


def generate_fleet(
    out: str | Path, spec: FleetSpec, progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """Write the fleet of ``spec`` under ``out`` (the raw root); returns the manifest."""
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(spec.seed)
    stats: dict[str, int] = defaultdict(int)
    gws = math.ceil(spec.devices / spec.devices_per_gw)
    number = 0
    for g in range(gws):
        gw = f"gw-{g + 1:03d}"
        site = f"site-{g // spec.gws_per_site + 1:02d}"
        segments: dict[tuple[Kind, float], list[_Line]] = defaultdict(list)
        first, last = g * spec.devices_per_gw, min(spec.devices, (g + 1) * spec.devices_per_gw)
        for d in range(first, last):
            dev_rng = random.Random(f"{spec.seed}/{d}")
            profile = "env" if d % 3 else "power"
            tel, ev, dev_stats = _device(dev_rng, spec, site, gw, f"dev-{d + 1:05d}", profile)
            for k, v in dev_stats.items():
                stats[k] += v
            for kind, lines in (("telemetry", tel), ("events", ev)):
                for line in lines:
                    span = spec.segment_seconds
                    segments[(kind, line.rx // span * span)].append(line)  # type: ignore[index]
        for (kind, hour), lines in sorted(segments.items()):
            lines.sort(key=lambda x: x.rx)
            seg_stats: dict[str, int] = defaultdict(int)
            texts = (
                _spoil(rng, spec, lines, seg_stats)
                if kind == "telemetry"
                else [x.text for x in lines]
            )
            folder = root / partition_dir(kind, utc_date(hour), site, gw)
            folder.mkdir(parents=True, exist_ok=True)
            data = gzip.compress(("\n".join(texts) + "\n").encode(), compresslevel=6, mtime=0)
            copies = 2 if kind == "telemetry" and rng.random() < spec.duplicate_segment_share else 1
            for _ in range(copies):
                number += 1
                (folder / segment_name(gw, hour, "gen000", number)).write_bytes(data)
            stats[f"{kind}_lines"] += len(texts) * copies
            stats["segments"] += copies
            stats["duplicate_segments"] += copies - 1
            for k, v in seg_stats.items():
                stats[k] += v
            bad = seg_stats["truncated_lines"], seg_stats["null_device_lines"]
            stats["corrupt_lines"] += bad[0] * copies
            stats["null_key_lines"] += bad[1] * copies
            if copies == 2:  # the second copy's messages are duplicates
                stats["duplicate_segment_lines"] += len(texts) - sum(bad)
        if progress is not None:
            progress(f"generated {gw} ({site}): devices {first + 1}..{last}")
    manifest: dict[str, Any] = {
        "spec": {
            k: (v.isoformat() if isinstance(v, dt.date) else v) for k, v in asdict(spec).items()
        },
        **{
            k: stats.get(k, 0)
            for k in (
                "telemetry_lines",
                "segments",
                "duplicate_segments",
                "duplicate_segment_lines",
                "duplicate_lines",
                "lost_lines",
                "truncated_lines",
                "corrupt_lines",
                "null_key_lines",
                "null_device_lines",
                "string_values",
                "unknown_fields",
                "buffered",
                "delayed",
                "offline_lost",
                "spikes",
            )
        },
        "event_lines": stats.get("events_lines", 0),
    }
    (root / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return manifest
