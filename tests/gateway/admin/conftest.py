from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.gateway.admin.gatewayd import Gatewayd


@pytest.fixture(scope="module")
def gatewayd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gatewayd]:
    """One gatewayd per test module, with fast $SYS intervals."""
    workdir: Path = tmp_path_factory.mktemp("gatewayd")
    gw = Gatewayd(workdir, {"GATEWAY_SYS_TOPICS__SYS_MSG_INTERVAL": "300ms",
                            "GATEWAY_SYS_TOPICS__SYS_HEARTBEAT_INTERVAL": "300ms",
                            "GATEWAY_SYS_TOPICS__SYS_EVENT_MESSAGES__CLIENT_SUBSCRIBED": "true"})
    gw.start()
    yield gw
    gw.stop()
