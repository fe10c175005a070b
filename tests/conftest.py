"""Settings for the whole suite.

Hypothesis runs without per-example deadlines and without the too-slow health check: CI
machines have 2 cores shared with brokers the tests start, and the figures of interest are
in bench/, never in tests.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

settings.register_profile(
    "gateway", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("gateway")
