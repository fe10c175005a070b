"""Pruning the build cache: every stage keeps its latest ``keep`` entries per directory.

A cache entry is ``<stage>-<key>[.ext]`` (key: 16 hex digits) in ``<cache>/<arch>/`` or,
from builds before the per-arch layout, in ``<cache>/`` itself as ``<stage>[-<arch>]-
<key>``. Entries of one stage in one directory form a group; the newest ``keep`` of a
group by modification time stay (a cache hit does not touch an entry, so "newest" means
"most recently built": keep at least 2 when another checkout may still build the previous
inputs). Leftovers of interrupted builds (``*.tmp*``) go once they are 12 hours old.
Nothing else is touched: ``keys/`` (the development signing key),
``data-empty.ext4`` and unknown names stay. ``test-out/<dir>`` (one per checkout that ran
the image tests, tests/image_build.py) goes only when the checkout its ``checkout`` file
names no longer exists. Prunes may run at once (every build of every checkout prunes at
its end): an entry is renamed to ``<name>.tmp<pid>`` before it is removed, so exactly one
prune takes it (the other skips it) and a build never finds it half removed.

A build killed before its stage was renamed into place may have left mounts below its
``*.tmp<pid>`` directory (an mmdebstrap from before it ran in its own mount namespace,
or a chroot helper on a host without ``unshare``). :func:`unmount_leftovers`, run at the
start of every build and prune, unmounts those of builds whose process is gone, deepest
first, so the directory can be removed; a live build's mounts are never touched.
"""

from __future__ import annotations

import os
import re
import time
from collections import defaultdict
from pathlib import Path

from edge_image.common import remove, run

ENTRY = re.compile(r"^(?P<stage>[a-z]+(?:-(?:amd64|arm64))?)-(?P<key>[0-9a-f]{16})"
                   r"(?P<ext>\.[a-z0-9]+)?$")
TMP = re.compile(r"\.tmp\d*$")
TMP_AGE = 12 * 3600
TMP_PID = re.compile(r"\.tmp(\d+)$")


def mounts_below(root: Path, mountinfo: str) -> list[Path]:
    """Mount points under ``root`` listed in ``mountinfo`` (/proc/self/mountinfo's
    format: the fifth field, octal escapes for space, tab, newline, backslash)."""
    out = []
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) < 5:
            continue
        point = Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4]))
        if point != root and root in point.parents:
            out.append(point)
    return out


def build_alive(pid: int) -> bool:
    """Whether ``pid`` may be a running image/build: gone or a zombie is dead, and so is a
    process whose command line does not name edge_image (the pid reused by another
    program); an empty command line (a process between fork and exec) counts as alive,
    which errs towards leaving a mount in place."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X"):
        return False
    return not cmdline or b"edge_image" in cmdline


def leftover_mounts(cache: Path, mountinfo: str) -> list[Path]:
    """Mount points below a ``*.tmp<pid>`` entry of ``cache`` (or ``cache/<arch>``) whose
    build is gone, deepest first."""
    out = []
    for point in mounts_below(cache, mountinfo):
        for p in [point, *point.parents]:
            if (m := TMP_PID.search(p.name)) is not None:
                if not build_alive(int(m[1])):
                    out.append(point)
                break
    return sorted(out, key=lambda p: len(p.parts), reverse=True)


def unmount_leftovers(cache: Path) -> list[Path]:
    """Unmount what killed builds left mounted in ``cache``; return those mount points.
    Needs root (only root's builds mount anything)."""
    try:
        info = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return []
    points = leftover_mounts(cache.resolve(), info)
    for point in points:
        # A plain umount first; lazily if something (a stray process) still holds it.
        run(["umount", point], check=False)
        if point.is_mount():
            run(["umount", "--lazy", point], check=False)
        print(f"cache: unmounted {point} (left by a killed build)", flush=True)
    return points


def size_of(path: Path) -> int:
    """Bytes allocated under ``path`` (sparse files count what they use)."""
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_blocks * 512
    total = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames + filenames:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


def stale(directory: Path, keep: int) -> list[Path]:
    """The entries of ``directory`` that pruning removes."""
    groups: dict[str, list[Path]] = defaultdict(list)
    out: list[Path] = []
    now = time.time()
    mtime: dict[Path, float] = {}
    for p in directory.iterdir():
        try:
            mtime[p] = p.lstat().st_mtime
        except FileNotFoundError:
            continue  # removed meanwhile (a prune or a build of another checkout)
        if TMP.search(p.name):
            if now - mtime[p] > TMP_AGE:
                out.append(p)
            continue
        m = ENTRY.match(p.name)
        if m:
            groups[m["stage"] + (m["ext"] or "")].append(p)
    for entries in groups.values():
        entries.sort(key=mtime.__getitem__, reverse=True)
        out.extend(entries[keep:])
    return sorted(out)


def orphaned_test_outputs(cache: Path) -> list[Path]:
    """``cache/test-out/<dir>`` whose checkout (named in its ``checkout`` file) is gone."""
    outs = cache / "test-out"
    if not outs.is_dir():
        return []
    gone = []
    for d in sorted(outs.iterdir()):
        try:
            checkout = Path((d / "checkout").read_text().strip())
        except OSError:
            continue  # not a per-checkout directory: leave it
        if checkout.is_absolute() and not checkout.exists():
            gone.append(d)
    return gone


def prune(cache: Path, keep: int, *, only: Path | None = None) -> int:
    """Remove stale entries (in ``only``, else in ``cache`` and each ``cache/<arch>``);
    print what went and the space freed; return the bytes freed."""
    if not cache.is_dir():
        print(f"prune: no cache at {cache}", flush=True)
        return 0
    if os.geteuid() == 0:
        unmount_leftovers(cache)
    dirs = [only] if only is not None else \
        [cache, *sorted(d for d in cache.iterdir() if d.is_dir() and d.name in
                        ("amd64", "arm64"))]
    freed = count = 0
    for d in dirs:
        for p in stale(d, keep) + (orphaned_test_outputs(cache) if d == cache else []):
            # renamed first: a build never sees an entry half removed, and of two
            # prunes at once (two checkouts building) exactly one takes each entry
            doomed = p.with_name(f"{p.name}.tmp{os.getpid()}")
            try:
                os.rename(p, doomed)
            except FileNotFoundError:
                continue
            n = size_of(doomed)
            remove(doomed)
            freed += n
            count += 1
            print(f"prune: removed {p.relative_to(cache)} ({n >> 20} MiB)", flush=True)
    print(f"prune: {count} stale cache entr{'y' if count == 1 else 'ies'} removed, "
          f"{freed >> 20} MiB freed (kept the latest {keep} per stage in "
          f"{', '.join(str(d) for d in dirs)})", flush=True)
    return freed
