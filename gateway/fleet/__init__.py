"""Fleet telemetry: the edge archiver and the central consolidation job.

- Edge side (no Spark needed): :class:`~gateway.fleet.archiver.Archiver` spools selected
  topics and connect/disconnect events to gzipped JSON-lines segments in the layout of
  :mod:`gateway.fleet.records`.
- Central side: :mod:`gateway.fleet.job` (PySpark, the ``fleet`` extra) consolidates the
  segments of the whole fleet into Parquet tables; :mod:`gateway.fleet.cli` is the
  ``gateway-fleet`` command (``generate`` a synthetic fleet, ``run`` the job).

This package's ``__init__`` imports nothing from PySpark, so a gateway never loads it.
See docs/fleet.md.
"""

from gateway.fleet.archiver import Archiver, ArchiverSettings, settings_from_config
from gateway.fleet.records import SCHEMA_VERSION

__all__ = ["Archiver", "ArchiverSettings", "SCHEMA_VERSION", "settings_from_config"]
