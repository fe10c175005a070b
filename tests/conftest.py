"""Settings for the whole suite.

Hypothesis runs without per-example deadlines and without the too-slow health check: CI
machines have 2 cores shared with brokers the tests start, and the figures of interest are
in bench/, never in tests.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

from tests.image_build import Built, build

settings.register_profile(
    "gateway", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("gateway")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that used a gatewayd fixture shows that gatewayd's log."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        from tests.gateway.admin.gatewayd import Gatewayd

        for value in getattr(item, "funcargs", {}).values():
            if isinstance(value, Gatewayd):
                report.sections.append(("gatewayd log", value.log()[-20000:]))
@pytest.fixture(scope="session")
def built() -> Built:
    """``image/build`` once per run, for tests/image and tests/hil alike (the outputs and
    every stage live in ``$EDGE_GATEWAY_CACHE/image``, not the work tree)."""
    return build()


@pytest.fixture(scope="session")
def built_arm64() -> Built:
    """The arm64 image, once per run (tests/image/test_arm64.py; see its module doc for
    when it is built cold and when the test is skipped instead)."""
    from tests.image_build import arm64_buildable

    arm64_buildable()
    return build("arm64")
