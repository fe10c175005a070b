"""A minimal ``/api/v5/status`` view of a running single node, for tests of what
``gatewayctl status`` renders from it (override the parts a test is about)."""

from __future__ import annotations

from typing import Any


def status_view(**parts: Any) -> dict[str, Any]:
    view: dict[str, Any] = {
        "node": "n@h", "status": "running", "role": "core", "version": "0.1.0", "uptime": 5,
        "cluster": {"enabled": False, "status": "not configured", "members": []},
        "connections": {"count": 0, "by_protocol": {}}, "sessions": 0, "subscriptions": 0,
        "topics": 0, "retained": 0, "rates": {},
        "bridges": {"enabled": False, "status": "not configured", "bridges": []},
        "alarms": [], "listeners": [], "image": None,
    }
    view.update(parts)
    return view
