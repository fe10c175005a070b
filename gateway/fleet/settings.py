"""The consolidation job's knobs, with the defaults documented in docs/fleet.md.

Plain data with no Spark import, so the CLI can build it and tests can read it cheaply.

Invariants: every tolerance and window is in seconds; ``start <= end`` once resolved;
``lookback_days >= 0``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

TABLES = (
    "telemetry",
    "rollup_5m",
    "rollup_site_1h",
    "device_daily",
    "device_sessions",
    "gaps",
    "anomalies",
)
"""The output tables, one folder each under the output, partitioned by ``event_date``."""


@dataclass(frozen=True, slots=True)
class DqThresholds:
    """Highest acceptable ratios; ``--fail-on-dq`` fails the run when one is exceeded.

    Line ratios are over all lines read for the range; message ratios over the clean
    messages; ``seq_holes`` over clean messages plus holes (the share that went missing).
    """

    corrupt_lines: float = 0.01
    rejected_rows: float = 0.01
    bad_values: float = 0.01
    duplicates: float = 0.05
    late: float = 0.10
    out_of_order: float = 0.05
    seq_holes: float = 0.02

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class JobSettings:
    raw: str
    out: str
    start: dt.date | None = None  # None: the first ingest date present
    end: dt.date | None = None  # None: the last ingest date present
    lookback_days: int = 2  # rows may arrive this many days after their event date
    late_tolerance: float = 300.0  # rx_ts - ts above this: the row is late
    ooo_tolerance: float = 5.0  # ts this far behind the previous message: out of order
    seq_reset_cap: int = 10_000  # a seq jump above this is a counter reset, not holes
    gap_threshold: float = 900.0  # silence longer than this is a gap
    flap_window: float = 600.0  # flapping: flap_count disconnects within this window
    flap_count: int = 3
    z_threshold: float = 4.0  # |z| at or above this is an anomaly
    z_min_count: int = 10  # values a device/metric/day needs before z-scores count
    dq: DqThresholds = field(default_factory=DqThresholds)
