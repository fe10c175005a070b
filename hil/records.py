"""The evidence: one append-only JSON-lines file per run, flushed line by line.

Every line is one event ``{"t": <unix seconds>, "e": <kind>, ...}``; the file is only ever
appended to and each line is flushed to the OS before the call returns, so a crash of the
rig (or of the machine, up to the OS's own write-back) loses at most a partial last line,
which :func:`read` skips. Kinds and their fields:

- ``sent`` / ``acked``: ``m`` message id, ``g`` group, ``d`` device, ``q`` QoS, ``k``
  kind (``tele`` device -> collector, ``cmd`` rig -> device), ``p`` whether a lost copy
  counts (the receiving session is persistent or always connected).
- ``recv``: ``m``, ``by`` (``collector``, ``upstream`` or a device id), ``q``; duplicates are
  repeated ``recv`` lines.
- ``up`` / ``down``: a device connected (``n`` = how many times so far) or lost its link.
- ``fault`` / ``heal``: a fault starts / ends (``kind``, ``i`` index in the scenario).
- ``ready``: the unit answers again after a fault (``after`` seconds).
- ``sample``: periodic figures (``rss``, ``connected``, ``bridge_queue``...).
- ``phase``: ``name`` of the phase entered; ``note``: free text for the report.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


class Recorder:
    """Appends events; safe to call from the rig's loop thread only."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[str] = path.open("a", buffering=1)  # line buffered: one write per line
        self.counts: dict[str, int] = {}

    def __call__(self, event: str, /, **fields: Any) -> None:
        fields["t"] = round(time.time(), 6)
        fields["e"] = event
        self._f.write(json.dumps(fields, separators=(",", ":")) + "\n")
        self.counts[event] = self.counts.get(event, 0) + 1

    def close(self) -> None:
        self._f.close()


def read(path: Path) -> Iterator[dict[str, Any]]:
    """Every complete event in ``path`` in file order (a torn last line is skipped)."""
    with path.open() as f:
        for line in f:
            if not line.endswith("\n"):
                break
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue
