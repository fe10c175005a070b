"""Where heavy test groups keep what they build (root file systems, wheelhouses, images,
screenshots): outside the work tree, so a fresh clone reuses them and `git clean` does not
throw them away.

``$EDGE_GATEWAY_CACHE`` if set, else ``/var/cache/edge-gateway`` as root and
``~/.cache/edge-gateway`` otherwise.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("EDGE_GATEWAY_CACHE")
    if base:
        return Path(base)
    if os.geteuid() == 0:
        return Path("/var/cache/edge-gateway")
    return Path.home() / ".cache/edge-gateway"
