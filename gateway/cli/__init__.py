"""Command-line entry points: ``gatewayd`` (the server) and ``gatewayctl`` (control)."""

from __future__ import annotations

from gateway.version import DISTRIBUTION, version

__all__ = ["DISTRIBUTION", "version"]
