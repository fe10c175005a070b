"""``image/build --prune``: stale cache entries go, the latest per stage and arch stay,
and the space freed is reported; keys, test outputs and unknown names are never touched.
Fast: a fake cache in a temporary directory, no root."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

from tests.image.vm import REPO


def prune(cache: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "EDGE_GATEWAY_CACHE": str(cache)}
    return subprocess.run([str(REPO / "image/build"), "--prune", *args], env=env,
                          capture_output=True, text=True, timeout=60)


def entry(path: Path, age_s: float, mib: int = 1) -> Path:
    if path.suffix:
        path.write_bytes(b"x" * (mib << 20))
    else:
        path.mkdir()
        (path / "f").write_bytes(b"x" * (mib << 20))
    t = time.time() - age_s
    os.utime(path, (t, t))
    return path


def test_prune_keeps_the_latest_per_stage_and_arch(tmp_path: Path) -> None:
    image = tmp_path / "image"
    arm, amd = image / "arm64", image / "amd64"
    arm.mkdir(parents=True)
    amd.mkdir()
    (image / "keys/dev").mkdir(parents=True)
    (image / "keys/dev/signing.key.pem").write_text("k")
    (image / "test-out").mkdir()
    entry(image / "data-empty.ext4", 9000)
    # arm64: three rootfs, three slot images; amd64: one of each; legacy flat entries.
    rootfs = [entry(arm / f"rootfs-{i:016x}", 1000 * i) for i in (1, 2, 3)]
    slots = [entry(arm / f"slotfs-{i:016x}.ext4", 1000 * i, 2) for i in (1, 2, 3)]
    amd_root = entry(amd / f"rootfs-{9:016x}", 99999)
    legacy = [entry(image / f"rootfs-amd64-{i:016x}", 1000 * i) for i in (1, 2, 3)]
    leftover = entry(arm / f"base-{7:016x}.tmp123", 13 * 3600)
    fresh_tmp = entry(arm / f"base-{8:016x}.tmp456", 60)
    unknown = entry(arm / "notes.txt", 99999)

    r = prune(tmp_path, "--keep", "2")
    assert r.returncode == 0, r.stderr
    gone = {rootfs[2], slots[2], legacy[2], leftover}
    for p in gone:
        assert not p.exists(), p
    for p in [*rootfs[:2], *slots[:2], amd_root, *legacy[:2], fresh_tmp, unknown,
              image / "keys/dev/signing.key.pem", image / "test-out",
              image / "data-empty.ext4"]:
        assert p.exists(), p
    m = re.search(r"prune: (\d+) stale cache entries removed, (\d+) MiB freed", r.stdout)
    assert m, r.stdout
    assert int(m.group(1)) == 4 and int(m.group(2)) == 1 + 2 + 1 + 1, r.stdout

    r = prune(tmp_path, "--keep", "2")  # nothing left to prune
    assert "0 stale cache entries removed, 0 MiB freed" in r.stdout, r.stdout


def test_prune_bad_keep_is_one_line_exit_2(tmp_path: Path) -> None:
    r = prune(tmp_path, "--keep", "0")
    assert r.returncode == 2 and "--keep must be 1 or more" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
