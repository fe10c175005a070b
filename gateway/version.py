"""The version this gateway reports (``gatewayd --version``, the API, ``$SYS``, the cluster
handshake): the installed distribution's, or the source tree's when not installed; and
its build (``gatewayd --version``, the start-up line): compiled hot path or pure Python."""

from __future__ import annotations

from importlib import metadata
from importlib.util import find_spec

DISTRIBUTION = "edge-gateway"


def version() -> str:
    """The installed distribution's version, or the source tree's when not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        from gateway import __version__

        return __version__


def build() -> str:
    """``compiled`` when the hot path (setup.py's HOT_PATH) runs as mypyc-compiled
    extensions, ``pure`` when it runs as Python (docs/performance.md). Looks at where
    ``gateway.core.node`` would load from, without importing it."""
    spec = find_spec("gateway.core.node")
    origin = spec.origin if spec is not None else None
    return "compiled" if origin is not None and origin.endswith(".so") else "pure"
