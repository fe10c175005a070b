"""Readiness and memory helpers shared by the unit drivers."""

from __future__ import annotations

import json
import socket
import time
import urllib.request

from hil.unit import Endpoints


def api_get(ep: Endpoints, path: str, timeout: float = 2.0) -> object:
    req = urllib.request.Request(f"http://{ep.control_host}:{ep.ports['api']}{path}")
    if ep.api_token:
        req.add_header("Authorization", f"Bearer {ep.api_token}")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_ready(ep: Endpoints, timeout: float, alive: object = None) -> float:
    """Poll (bounded, 0.1 s) until ``/status`` answers and the MQTT port accepts."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    while time.monotonic() < deadline:
        try:
            status = api_get(ep, "/status", timeout=1.0)
            if isinstance(status, dict) and status.get("status") == "running":
                socket.create_connection((ep.device_host, ep.ports["mqtt"]), timeout=1.0).close()
                return time.monotonic() - t0
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"unit not ready within {timeout:g} s")
