"""The appliance image built once per pytest run, shared by tests/image and tests/hil.

``image/build`` caches every stage under ``$EDGE_GATEWAY_CACHE/image`` (default
``/var/cache/edge-gateway/image``) by a hash of its inputs, so with a warm cache the build
takes seconds; its outputs also go there, never into the work tree: to
``test-out/<checkout>-<hash of its path>/`` (:func:`test_out`), so checkouts testing at the
same time do not overwrite each other's image (``image/build --prune`` removes the
directory once its checkout is gone). The session fixture ``built`` (tests/conftest.py)
calls :func:`build` at most once per run, whichever group asks first; every test that
needs the image takes it from there and copies it (or boots it with ``--snapshot``),
never writes to it.
"""

from __future__ import annotations

import hashlib
import os
import re
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
    slot: Path  # the root slot image (ext4) of this build, in the cache
    build_seconds: float
    build_log: str


def image_cache() -> Path:
    return cache_dir() / "image"  # where image/build keeps its stages (as root)


def test_out() -> Path:
    """This checkout's output directory in the cache; its ``checkout`` file names the
    checkout, for pruning (edge_image/prune.py)."""
    tag = hashlib.sha256(str(REPO).encode()).hexdigest()[:8]
    out = image_cache() / "test-out" / f"{REPO.name}-{tag}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "checkout").write_text(f"{REPO}\n")
    return out


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


def build(arch: str = "amd64") -> Built:
    """Run ``image/build`` into the cache; skip when the host cannot, fail when it breaks."""
    skip_unless_possible()
    out = test_out()
    t0 = time.monotonic()
    r = subprocess.run([str(REPO / "image/build"), "--out", str(out), "--version", VERSION,
                        "--boot-tries", str(BOOT_TRIES), "--arch", arch],
                       capture_output=True, text=True, timeout=5400)
    took = time.monotonic() - t0
    if r.returncode != 0 and "mmdebstrap" in r.stderr and "failed" in r.stderr:
        pytest.skip(f"mmdebstrap failed (no Debian mirror?): {r.stderr[-300:]}")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    name = f"edge-gateway-{VERSION}-{arch}"
    slot = re.search(r"^slot image: (.+)$", r.stdout, re.M)
    assert slot, r.stdout
    return Built(out, out / f"{name}.img", out / f"{name}.bmap", out / f"{name}.raucb",
                 image_cache(), Path(slot.group(1)), took, r.stdout)


def arm64_buildable() -> None:
    """Skip unless the arm64 image can be built and booted here within the image group's
    budget: qemu-user binfmt, qemu-system-aarch64 and AAVMF present, and the emulated
    Debian stage (mmdebstrap under qemu-user, the longest part of a cold arm64 build) in
    the cache already, or ``EDGE_GATEWAY_ARM64_COLD=1`` to pay for it in this run."""
    from edge_image.arch import ARCHES, ensure_binfmt
    from edge_image.common import BadInput

    skip_unless_possible()
    try:  # mounts binfmt_misc and enables qemu-aarch64 where it can, as image/build does
        ensure_binfmt(ARCHES["arm64"])
    except BadInput as exc:
        pytest.skip(str(exc))
    if shutil.which("qemu-system-aarch64") is None:
        pytest.skip("qemu-system-aarch64 not installed (Debian package qemu-system-arm)")
    if not Path("/usr/share/AAVMF/AAVMF_CODE.fd").exists():
        pytest.skip("AAVMF not installed (Debian package qemu-efi-aarch64)")
    cached = any((image_cache() / "arm64").glob("base-*/usr/lib/os-release"))
    if not cached and os.environ.get("EDGE_GATEWAY_ARM64_COLD") != "1":
        pytest.skip("the arm64 Debian stage is not cached: a cold arm64 build (measured: "
                    "26 min on the 2-core CI machine at load 7-12, 17 of them mmdebstrap "
                    "under qemu-user) does not fit the image group's 25 min beside the "
                    "amd64 tests; build it once (sudo image/build --arch arm64 --out DIR) "
                    "or set EDGE_GATEWAY_ARM64_COLD=1")
