"""Real file-system faults for tests and the HIL rig: a size-limited mount, a read-only
flip under a running process, and byte-level corruption of a file.

Everything here acts on the real kernel (mount(8), statvfs), never a mock. The
mechanisms need root (``CAP_SYS_ADMIN``); :func:`can_mount` says whether they are
available, so callers skip cleanly where they are not.

- :func:`sized_tmpfs` mounts a tmpfs of a fixed size (``mount -t tmpfs -o size=N``) on
  a directory: writes past the size fail with ENOSPC, as on a full SD card.
- :func:`read_only_flip` makes a directory read-only *while files in it are open for
  writing*: a ``mount -o remount,ro`` of the tmpfs itself fails with EBUSY then, so the
  directory is bind-mounted onto itself first and that bind mount is remounted
  ``ro,bind`` (a per-mount flag, which the kernel allows with writers open). Writes
  through descriptors opened before the flip keep working on some kernels (the flag is
  checked at open and at write on the mount); new opens for writing and writes through
  the mount fail with EROFS. That is the same thing an ext4 ``errors=remount-ro`` does
  to SQLite, which reopens the WAL index and journal.
- :func:`corrupt` overwrites bytes of a file at an offset with a pattern.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path


def can_mount() -> bool:
    """True when this process may mount file systems (root with mount(8) present)."""
    return os.geteuid() == 0 and shutil.which("mount") is not None


def _run(*args: str) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True)


@contextlib.contextmanager
def sized_tmpfs(path: Path, size: int) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` bytes on ``path`` (created if needed) for the block;
    unmounted (lazily, if something still holds it) afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    _run("mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path))
    try:
        yield path
    finally:
        unmount(path)


def unmount(path: Path) -> None:
    """Unmount ``path`` (every mount stacked on it), lazily if busy."""
    for _ in range(4):
        r = subprocess.run(["umount", str(path)], capture_output=True, text=True)
        if r.returncode != 0:
            r = subprocess.run(["umount", "-l", str(path)], capture_output=True, text=True)
        if r.returncode != 0 or not os.path.ismount(path):
            return


@contextlib.contextmanager
def read_only_flip(path: Path) -> Iterator[None]:
    """Bind-mount ``path`` onto itself for the block; :func:`set_read_only` then flips
    it. Unmounting the bind mount at the end gives the writable file system back."""
    _run("mount", "--bind", str(path), str(path))
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def set_read_only(path: Path, read_only: bool = True) -> None:
    """Remount the bind mount on ``path`` read-only (or writable again)."""
    _run("mount", "-o", f"remount,{'ro' if read_only else 'rw'},bind", str(path))


def fill(path: Path, leave: int = 0) -> Path:
    """Create ``path`` filling its file system until only ``leave`` bytes are free
    (ENOSPC ends the filling early: the file system is then full)."""
    chunk = b"\0" * (64 * 1024)
    with open(path, "wb") as f:
        while True:
            st = os.statvfs(path)
            free = st.f_bavail * st.f_frsize
            if free <= leave:
                break
            try:
                f.write(chunk[: max(1, min(len(chunk), free - leave))])
                f.flush()
            except OSError:
                break
    return path


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def corrupt(path: Path, offset: int, length: int, pattern: bytes = b"\xa5") -> None:
    """Overwrite ``length`` bytes of ``path`` at ``offset`` with ``pattern`` repeated
    (what a torn write or a worn-out flash page leaves)."""
    data = (pattern * (length // len(pattern) + 1))[:length]
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
