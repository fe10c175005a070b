"""Shared helpers of the HIL tests.

Screenshots of reports go to ``$EDGE_GATEWAY_CACHE/hil`` (default
``/var/cache/edge-gateway/hil`` as root, ``~/.cache/edge-gateway/hil`` otherwise), outside
the work tree, so a person can look at them after the run; each test prints the path.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.harness.cache import cache_dir


def screenshot_dir() -> Path:
    d = cache_dir() / "hil"
    d.mkdir(parents=True, exist_ok=True)
    return d


def have_chromium() -> bool:
    try:
        import playwright  # noqa: F401
    except ImportError:
        return False
    return shutil.which("chromium") is not None or Path("/usr/bin/chromium").exists()


needs_chromium = pytest.mark.skipif(not have_chromium(),
                                    reason="needs Debian's chromium and playwright")
