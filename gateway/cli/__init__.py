"""Command-line entry points: ``gatewayd`` (the server) and ``gatewayctl`` (control)."""

from __future__ import annotations

from gateway.version import DISTRIBUTION, build, version

__all__ = ["DISTRIBUTION", "build", "version"]
