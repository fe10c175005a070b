"""Settings for the whole suite.

Hypothesis runs without per-example deadlines and without the too-slow health check: CI
machines have 2 cores shared with brokers the tests start, and the figures of interest are
in bench/, never in tests.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from tests.image_build import Built, build

settings.register_profile(
    "gateway", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("gateway")


@pytest.fixture(scope="session")
def built() -> Built:
    """``image/build`` once per run, for tests/image and tests/hil alike (the outputs and
    every stage live in ``$EDGE_GATEWAY_CACHE/image``, not the work tree)."""
    return build()
