"""The archive's record schema and directory layout, shared by the edge and the job.

A segment is a gzipped JSON-lines file (one or more concatenated gzip members) at::

    {raw}/{telemetry|events}/ingest_date=YYYY-MM-DD/site=S/gw=G/{name}.jsonl.gz

where ``{raw}`` is ``{archiver dir}/raw`` on a gateway and the central store's raw root.

Invariants:

- Every record carries ``v`` (:data:`SCHEMA_VERSION`). Adding an optional field does not
  change ``v``: readers ignore fields they do not know. Removing or re-typing a field
  bumps ``v``, and the job reads only the versions in :data:`SUPPORTED_VERSIONS`.
- ``(device, seq)`` identifies a record within its kind: ``seq`` counts 1, 2, 3, ... per
  device and kind at the gateway that archived it, and survives restarts of that gateway
  (a gap in it means records lost on the way; a step back means the counter was reset).
- ``ts`` is the event time (the device's own ``ts`` when the payload has one, else the
  receive time) and ``rx_ts`` the receive time at the gateway, both epoch seconds (UTC).
  ``ingest_date`` in the path is the UTC date of ``rx_ts`` when the segment was opened.
- A segment is written under a hidden temporary name (``.{name}.tmp``, which readers
  skip) and renamed into place when complete, so a visible segment is never partial.

Telemetry record::

    {"v": 1, "site": "s1", "gw": "gw1", "device": "dev-7", "seq": 42, "ts": 1.7e9,
     "rx_ts": 1.7e9, "topic": "sensors/dev-7/env", "qos": 1,
     "metrics": {"temp": 21.5, "hum": 40.0}}

(plus ``"payload"``, a text excerpt, when the payload held no numbers). Event record::

    {"v": 1, "site": "s1", "gw": "gw1", "device": "dev-7", "seq": 3, "ts": 1.7e9,
     "rx_ts": 1.7e9, "event": "connected", "protocol": "mqtt", "peer": "10.0.0.7"}
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Final, Literal

SCHEMA_VERSION: Final = 1
SUPPORTED_VERSIONS: Final = frozenset({1})

Kind = Literal["telemetry", "events"]
KINDS: Final[tuple[Kind, ...]] = ("telemetry", "events")
EVENTS: Final = ("connected", "disconnected")

SEGMENT_SUFFIX: Final = ".jsonl.gz"
TMP_SUFFIX: Final = ".tmp"

_UNSAFE = re.compile(r"[^A-Za-z0-9._@-]")


def safe_name(value: str) -> str:
    """``value`` usable as a ``site=``/``gw=`` directory value (others become ``_``)."""
    return _UNSAFE.sub("_", value) or "_"


def utc_date(epoch: float) -> dt.date:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).date()


def partition_dir(kind: Kind, ingest_date: dt.date, site: str, gw: str) -> str:
    """A segment's folder relative to the raw root: ``{kind}/ingest_date=D/site=S/gw=G``.

    The archiver's raw root is ``{dir}/raw``; the central raw root is the union of every
    gateway's (the paths never collide, since they name the site and the gateway).
    """
    return f"{kind}/ingest_date={ingest_date.isoformat()}/site={site}/gw={gw}"


def segment_name(gw: str, opened_at: float, boot: str, number: int) -> str:
    """A segment file name, unique per gateway: open time, boot token and a counter."""
    stamp = dt.datetime.fromtimestamp(opened_at, dt.UTC).strftime("%Y%m%dT%H%M%S")
    millis = int((opened_at % 1) * 1000)
    return f"{gw}-{stamp}.{millis:03d}Z-{boot}-{number:06d}{SEGMENT_SUFFIX}"


def tmp_name(name: str) -> str:
    """The hidden name a segment has while it is written (Spark and Hadoop skip dotfiles)."""
    return f".{name}{TMP_SUFFIX}"


def final_name(tmp: str) -> str:
    """Inverse of :func:`tmp_name`."""
    if not (tmp.startswith(".") and tmp.endswith(TMP_SUFFIX)):
        raise ValueError(f"not a temporary segment name: {tmp!r}")
    return tmp[1 : -len(TMP_SUFFIX)]
