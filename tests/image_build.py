"""The appliance image built once per pytest run, shared by tests/image and tests/hil.

``image/build`` caches every stage under ``$EDGE_GATEWAY_CACHE/image`` (default
``/var/cache/edge-gateway/image``) by a hash of its inputs, so with a warm cache the build
takes seconds; its outputs also go there (``test-out/``), never into the work tree. The
session fixture ``built`` (tests/conftest.py) calls :func:`build` at most once per run,
whichever group asks first; every test that needs the image takes it from there and
copies it (or boots it with ``--snapshot``), never writes to it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.cache import cache_dir

REPO = Path(__file__).resolve().parents[1]
VERSION = "test"
#: Two tries for a new slot (the default is 3): the rollback test then needs two bad
#: boots, not three, which keeps the group inside its time budget.
BOOT_TRIES = 2


@dataclass(frozen=True)
class Built:
    out: Path
    img: Path
    bmap: Path
    bundle: Path
    cache: Path
    build_seconds: float
    build_log: str


def image_cache() -> Path:
    return cache_dir() / "image"  # where image/build keeps its stages (as root)


def skip_unless_possible() -> None:
    if os.geteuid() != 0:
        pytest.skip("building and booting the image needs root")
    for tool, package in (("mmdebstrap", "mmdebstrap"), ("qemu-system-x86_64", "qemu-system-x86"),
                          ("rauc", "rauc"), ("bmaptool", "bmap-tools"), ("mcopy", "mtools"),
                          ("ssh", "openssh-client")):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (Debian package {package})")
    if not Path("/usr/share/OVMF/OVMF_CODE_4M.fd").exists():
        pytest.skip("OVMF not installed (Debian package ovmf)")


def build() -> Built:
    """Run ``image/build`` into the cache; skip when the host cannot, fail when it breaks."""
    skip_unless_possible()
    out = image_cache() / "test-out"
    t0 = time.monotonic()
    r = subprocess.run([str(REPO / "image/build"), "--out", str(out), "--version", VERSION,
                        "--boot-tries", str(BOOT_TRIES)],
                       capture_output=True, text=True, timeout=3600)
    took = time.monotonic() - t0
    if r.returncode != 0 and "mmdebstrap" in r.stderr and "failed" in r.stderr:
        pytest.skip(f"mmdebstrap failed (no Debian mirror?): {r.stderr[-300:]}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    name = f"edge-gateway-{VERSION}-amd64"
    return Built(out, out / f"{name}.img", out / f"{name}.bmap", out / f"{name}.raucb",
                 image_cache(), took, r.stdout)
