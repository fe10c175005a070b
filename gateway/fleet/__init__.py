"""Fleet telemetry: the edge archiver and the central consolidation job.

- Edge side (no Spark needed): :class:`gateway.fleet.archiver.Archiver` spools selected
  topics and connect/disconnect events to gzipped JSON-lines segments in the layout of
  :mod:`gateway.fleet.records`.
- Central side: :mod:`gateway.fleet.job` (PySpark, the ``fleet`` extra) consolidates the
  segments of the whole fleet into Parquet tables; :mod:`gateway.fleet.cli` is the
  ``gateway-fleet`` command (``generate`` a synthetic fleet, ``run`` the job).

This ``__init__`` imports neither side: a gateway never loads PySpark, and the central job
never loads the broker core. See docs/fleet.md.
"""

from gateway.fleet.records import SCHEMA_VERSION

__all__ = ["SCHEMA_VERSION"]
