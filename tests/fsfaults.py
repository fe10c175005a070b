"""Real file-system faults for tests and the HIL rig: a size-limited mount, a read-only
flip under a running process, and byte-level corruption of a file.

Everything here acts on the real kernel (mount(8), statvfs), never a mock. The
mechanisms need root (``CAP_SYS_ADMIN``); :func:`can_mount` says whether they are
available, so callers skip cleanly where they are not.

- :func:`sized_tmpfs` mounts a tmpfs of a fixed size (``mount -t tmpfs -o size=N``) on
  a directory: writes past the size fail with ENOSPC, as on a full SD card.
- :func:`ext4_image` makes a file-backed ext4 (``mkfs.ext4`` on a file, mounted through a
  loop device with ``errors=remount-ro``) and :func:`trigger_ext4_error` makes the kernel
  record a file-system error on it (``/sys/fs/ext4/<dev>/trigger_fs_error``): ext4 then
  remounts itself read-only *with files open for writing*, and every write, through old
  descriptors too, fails with EROFS, exactly what a failing SD card does. (A plain
  ``mount -o remount,ro`` of a tmpfs, or of a bind mount of it, fails with EBUSY while
  SQLite holds its files open for writing, so it cannot make this fault.) It needs a
  loop device: :func:`can_loop` says whether one is available (CI may have none).
  Recovery is what a person does: stop the writer, unmount, ``e2fsck -fy``, mount.
- :func:`fill` fills a file system to a given free space; :func:`corrupt` overwrites
  bytes of a file at an offset with a pattern.
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


def can_loop() -> bool:
    """True when a loop device can be had (for :func:`ext4_image`)."""
    if not can_mount() or shutil.which("losetup") is None or shutil.which("mkfs.ext4") is None:
        return False
    r = subprocess.run(["losetup", "-f"], capture_output=True, text=True)
    return r.returncode == 0 and r.stdout.startswith("/dev/loop")


def make_ext4(image: Path, size: int) -> None:
    """An empty ext4 file system in the file ``image`` of ``size`` bytes."""
    with open(image, "wb") as f:
        f.truncate(size)
    _run("mkfs.ext4", "-q", "-F", "-m", "0", str(image))


def mount_ext4(image: Path, path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    _run("mount", "-o", "loop,errors=remount-ro", str(image), str(path))


@contextlib.contextmanager
def ext4_image(image: Path, path: Path, size: int) -> Iterator[Path]:
    """A fresh ext4 of ``size`` bytes in ``image``, mounted on ``path`` for the block."""
    make_ext4(image, size)
    mount_ext4(image, path)
    try:
        yield path
    finally:
        unmount(path)


def trigger_ext4_error(path: Path) -> None:
    """Record an error on the ext4 mounted on ``path``: with ``errors=remount-ro`` the
    kernel makes it read-only at once, open files included."""
    r = subprocess.run(["findmnt", "-no", "SOURCE", str(path)], capture_output=True,
                       text=True, check=True)
    dev = os.path.basename(r.stdout.strip())
    Path(f"/sys/fs/ext4/{dev}/trigger_fs_error").write_text("fsfaults\n")


def repair_ext4(image: Path, path: Path) -> None:
    """After :func:`trigger_ext4_error` (its writers stopped): unmount, ``e2fsck -fy``,
    mount again (read-write)."""
    unmount(path)
    subprocess.run(["e2fsck", "-fy", str(image)], capture_output=True)  # 1: fixed
    mount_ext4(image, path)


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
