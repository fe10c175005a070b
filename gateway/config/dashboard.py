"""``[dashboard]``: the web console served by ``gatewayd`` on the API port (``/dashboard/``).

There are no default credentials: the first administrator is made with a one-time setup
token (logged at start while there is none, or printed by ``gatewayctl admin setup``).
Sessions end after ``session_idle`` without a request and ``session_max`` after the
login whatever happens; ``login_attempts`` failed logins within ``login_window`` from
one address (or for one user name) lock that address (or name) out until the window
has passed. ``sample_interval``: how often the overview's one-hour history is sampled.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from gateway.config.values import Duration, _Section


class DashboardConfig(_Section):
    enable: bool = True
    session_idle: Annotated[Duration, Field(gt=0)] = 1800.0
    session_max: Annotated[Duration, Field(gt=0)] = 43200.0
    login_attempts: int = Field(default=5, ge=1)
    login_window: Annotated[Duration, Field(gt=0)] = 300.0
    setup_token_ttl: Annotated[Duration, Field(gt=0)] = 86400.0
    sample_interval: Annotated[Duration, Field(gt=0, le=600)] = 10.0
