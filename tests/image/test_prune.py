"""``image/build --prune``: stale cache entries go, the latest per stage and arch stay,
and the space freed is reported; keys, the test outputs of existing checkouts and unknown
names are never touched; mounts left below a killed build's temporary entry are
unmounted first. Fast: a fake cache in a temporary directory (root only to mount, in a
private mount namespace)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edge_image.prune import leftover_mounts
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


def test_prune_removes_test_outputs_of_gone_checkouts(tmp_path: Path) -> None:
    outs = tmp_path / "image/test-out"
    gone, here, other = outs / "wt-gone-1", outs / "wt-here-2", outs / "handmade"
    for d in (gone, here, other):
        d.mkdir(parents=True)
        (d / "edge-gateway-test-amd64.img").write_bytes(b"x" * (1 << 20))
    (gone / "checkout").write_text(f"{tmp_path / 'removed-checkout'}\n")
    (here / "checkout").write_text(f"{REPO}\n")
    r = prune(tmp_path)
    assert r.returncode == 0, r.stderr
    assert not gone.exists() and here.exists() and other.exists()
    assert "prune: 1 stale cache entry removed, 1 MiB freed" in r.stdout, r.stdout


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_leftover_mounts_only_of_dead_builds(tmp_path: Path) -> None:
    """Mounts below the ``.tmp<pid>`` entry of a build whose process is gone are
    leftovers, deepest first; a running build's, a finished entry's and anything outside
    the cache are not (the octal escapes of mountinfo are decoded)."""
    cache = tmp_path / "cache dir"
    dead, live = dead_pid(), subprocess.Popen(
        [sys.executable, "-c", "import sys, time; time.sleep(60)", "edge_image.build"])
    try:
        base = cache / f"arm64/base-{1:016x}.tmp{dead}"
        running = cache / f"arm64/base-{2:016x}.tmp{live.pid}"
        done = cache / f"arm64/base-{3:016x}"

        def line(point: Path) -> str:
            return f"36 35 0:5 / {str(point).replace(' ', chr(92) + '040')} rw - proc proc rw"

        info = "\n".join(line(p) for p in (
            base / "proc", base / "dev", base / "dev/pts", running / "proc", done / "proc",
            tmp_path / "elsewhere/base.tmp1/proc", cache))
        got = leftover_mounts(cache, info)
        assert got[0] == base / "dev/pts" and set(got) == {base / "proc", base / "dev",
                                                           base / "dev/pts"}
    finally:
        live.kill()
        live.wait()
    # With that process gone, its mounts are leftovers too.
    assert running / "proc" in leftover_mounts(cache, info)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root")
def test_build_start_unmounts_what_a_killed_mmdebstrap_left(tmp_path: Path) -> None:
    """In a private mount namespace: a proc mount below a dead build's temporary base
    directory (what a killed mmdebstrap leaves) is gone after ``image/build --prune``
    (which, like every build, unmounts leftovers first), and the entry can be pruned."""
    cache = tmp_path / "image/arm64"
    stale = cache / f"base-{1:016x}.tmp{dead_pid()}"
    (stale / "proc").mkdir(parents=True)
    script = (f'mount -t proc proc "{stale}/proc" && grep -c "{stale}" /proc/self/mountinfo '
              f'&& EDGE_GATEWAY_CACHE="{tmp_path}" "{REPO}/image/build" --prune && '
              f'! grep "{stale}" /proc/self/mountinfo')
    r = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"cache: unmounted {stale}/proc" in r.stdout, r.stdout


def test_two_prunes_at_once_both_succeed(tmp_path: Path) -> None:
    """Every build prunes at its end, so two checkouts building at once prune the same
    cache together: an entry the other prune removed first is skipped, and between
    them every stale entry goes (a CI image build once failed on the FileNotFoundError
    after building its image)."""
    amd = tmp_path / "image/amd64"
    amd.mkdir(parents=True)
    stale_n = 150
    entries = [entry(amd / f"rootfs-{i:016x}", 100 + i, 0) for i in range(stale_n + 1)]
    runs = [subprocess.Popen([str(REPO / "image/build"), "--prune", "--keep", "1"],
                             env={**os.environ, "EDGE_GATEWAY_CACHE": str(tmp_path)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outs = [r.communicate(timeout=120) for r in runs]
    for r, (_, err) in zip(runs, outs, strict=True):
        assert r.returncode == 0, err[-2000:]
    removed = [int(m.group(1)) for out, _ in outs
               for m in [re.search(r"prune: (\d+) stale cache entr", out)] if m]
    assert len(removed) == 2 and sum(removed) == stale_n, (removed, [o for o, _ in outs])
    assert [p for p in entries if p.exists()] == [entries[0]]  # the newest stays
