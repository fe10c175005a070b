from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.admin.gatewayd import Gatewayd


@pytest.fixture(scope="module")
def gatewayd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gatewayd]:
    """One gatewayd per module with no dashboard administrator yet; three failed logins
    lock an address or a name out; the overview's history sampled every second."""
    workdir: Path = tmp_path_factory.mktemp("dashboard")
    gw = Gatewayd(workdir, {"GATEWAY_DASHBOARD__LOGIN_ATTEMPTS": "3",
                            "GATEWAY_DASHBOARD__SAMPLE_INTERVAL": "1s"})
    gw.start()
    yield gw
    gw.stop()
