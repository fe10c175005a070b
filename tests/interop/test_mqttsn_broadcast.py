"""ADVERTISE and SEARCHGW/GWINFO by broadcast, inside a network namespace this test makes
(``unshare -n``): nothing is broadcast on the machine's real interfaces. Skipped when
namespaces cannot be created (not root, no CAP_SYS_ADMIN, no unshare)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.interop, pytest.mark.slow]

SCRIPT = Path(__file__).resolve().parent / "netns_broadcast.py"


def _netns_reason() -> str | None:
    if not shutil.which("unshare") or not shutil.which("ip"):
        return "unshare or ip (iproute2) not installed"
    probe = subprocess.run(
        ["unshare", "-n", "ip", "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
        capture_output=True, text=True, timeout=30, check=False,
    )
    if probe.returncode != 0:
        return f"cannot make a network namespace with a veth pair: {probe.stderr.strip()}"
    return None


def test_advertise_and_searchgw_by_broadcast() -> None:
    reason = _netns_reason()
    if reason is not None:
        pytest.skip(reason)
    r = subprocess.run(
        ["unshare", "-n", sys.executable, str(SCRIPT)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    assert seen["advertise"] == [42, 1]  # gateway id, seconds to the next ADVERTISE
    assert seen["gwinfo"] == 42
    assert seen["from"] == ["10.77.0.1"]
