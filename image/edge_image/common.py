"""Shared helpers: one-line errors, progress per stage, running commands, the cache.

Invariants:
- Bad input (not root, a missing tool, an unknown option value, no signing key) raises
  :class:`BadInput`; :func:`main_guard` prints it as ``<tool>: <message>`` and exits 2.
- A stage's output lives in the cache under ``<stage>-<key>`` where the key is a hash of
  everything the stage reads; it is written to a temporary name and renamed into place
  only when complete, so an interrupted build never leaves a half stage that looks done.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGE_DIR = REPO / "image"
SUITE = "bookworm"
MIRROR = os.environ.get("EDGE_GATEWAY_MIRROR", "http://deb.debian.org/debian")


class BadInput(Exception):
    """Invalid input from the user: reported as one line, exit status 2."""


class CommandFailed(Exception):
    """An external command failed: reported with the tail of its output, exit status 1."""


def main_guard(tool: str, main: Callable[[list[str]], int]) -> None:
    path = os.environ.get("PATH", "").split(":")
    os.environ["PATH"] = ":".join(path + [d for d in ("/usr/sbin", "/sbin") if d not in path])
    try:
        sys.exit(main(sys.argv[1:]))
    except BadInput as e:
        print(f"{tool}: {e}", file=sys.stderr)
        sys.exit(2)
    except CommandFailed as e:
        print(f"{tool}: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print(f"{tool}: interrupted", file=sys.stderr)
        sys.exit(130)


def require_root(tool: str) -> None:
    if os.geteuid() != 0:
        raise BadInput(f"must run as root (try: sudo image/{tool} ...)")


def require_tools(tools: dict[str, str]) -> None:
    """``tools`` maps a command to the Debian package that provides it."""
    for tool, package in tools.items():
        if shutil.which(tool) is None:
            raise BadInput(f"{tool} not found (Debian package {package})")


def run(cmd: Sequence[str | Path], *, input: bytes | None = None, cwd: Path | None = None,
        env: dict[str, str] | None = None, capture: bool = True,
        timeout: float | None = None, check: bool = True) -> str:
    """Run ``cmd``; return its stdout; raise :class:`CommandFailed` on a non-zero exit
    (unless ``check`` is false)."""
    args = [str(c) for c in cmd]
    full_env = None if env is None else {**os.environ, **env}
    try:
        r = subprocess.run(args, input=input, cwd=cwd, env=full_env, timeout=timeout,
                           stdout=subprocess.PIPE if capture else None,
                           stderr=subprocess.PIPE if capture else None)
    except FileNotFoundError:
        raise BadInput(f"{args[0]} not found (is it installed?)") from None
    if r.returncode != 0 and check:
        tail = b"" if not capture else (r.stdout or b"")[-1500:] + (r.stderr or b"")[-2500:]
        raise CommandFailed(f"{' '.join(args[:6])} failed (exit {r.returncode}):\n"
                            + tail.decode(errors="replace"))
    return (r.stdout or b"").decode(errors="replace") if capture else ""


def cache_root() -> Path:
    """``$EDGE_GATEWAY_CACHE/image``, else /var/cache/edge-gateway/image (root's)."""
    base = os.environ.get("EDGE_GATEWAY_CACHE")
    root = Path(base) if base else Path("/var/cache/edge-gateway")
    return root / "image"


def hash_files(h: hashlib._Hash, paths: Iterable[Path], base: Path) -> None:
    """Feed every file under ``paths`` (names, modes, contents) into ``h``, sorted."""
    files: list[Path] = []
    for p in paths:
        if p.is_dir():
            files.extend(f for f in p.rglob("*") if f.is_file() or f.is_symlink())
        elif p.exists():
            files.append(p)
    for f in sorted(set(files)):
        if "__pycache__" in f.parts or f.suffix == ".pyc":
            continue
        h.update(str(f.relative_to(base)).encode() + b"\0")
        if f.is_symlink():
            h.update(b"L" + os.readlink(f).encode())
        else:
            h.update(oct(f.stat().st_mode & 0o777).encode())
            h.update(f.read_bytes())
        h.update(b"\0")


def key_of(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else p.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


class Progress:
    """One line per stage: ``[3/8] rootfs ... cached`` / ``... done in 42.1 s``."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.n = 0
        self.started = time.monotonic()

    def stage(self, name: str, detail: str = "") -> float:
        self.n += 1
        print(f"[{self.n}/{self.total}] {name}{': ' + detail if detail else ''}",
              flush=True)
        return time.monotonic()

    def done(self, t0: float, cached: bool) -> None:
        how = "cached" if cached else "done"
        print(f"      {how} in {time.monotonic() - t0:.1f} s", flush=True)


def fresh_dir(path: Path) -> Path:
    """An empty temporary sibling of ``path`` to build into (see :func:`commit`)."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    remove(tmp)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    return tmp


def commit(tmp: Path, final: Path) -> Path:
    remove(final)
    tmp.rename(final)
    return final


def remove(path: Path) -> None:
    """Delete a file or a tree; never crosses into a file system mounted below it (a
    chroot's /proc, /sys, /dev left by a killed build)."""
    if path.is_dir() and not path.is_symlink():
        run(["rm", "-rf", "--one-file-system", path])
    elif path.exists() or path.is_symlink():
        path.unlink()
