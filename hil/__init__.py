"""The hardware-in-the-loop rig: simulated devices against a unit, faults at set times,
expectations checked from the records, and a report (``gateway-hil``; docs/hil.md).

Layout: ``scenario`` (the YAML data model), ``envfile`` and ``drivers/`` (labgrid
environments, resources, drivers and the strategy), ``simulators/`` (device fleets per
protocol on one asyncio loop), ``faults/`` (network namespace, upstream mosquitto, the
fault schedule), ``records`` (the append-only evidence), ``expectations`` (verdicts from the
records), ``report/`` (junit.xml, results.json, report.html), ``runner`` and ``cli``.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SCENARIO_DIR = PACKAGE_DIR / "scenarios"
ENV_DIR = PACKAGE_DIR / "envs"
