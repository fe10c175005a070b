"""The version this gateway reports (``gatewayd --version``, the API, ``$SYS``, the cluster
handshake): the installed distribution's, or the source tree's when not installed."""

from __future__ import annotations

from importlib import metadata

DISTRIBUTION = "edge-gateway"


def version() -> str:
    """The installed distribution's version, or the source tree's when not installed."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        from gateway import __version__

        return __version__
