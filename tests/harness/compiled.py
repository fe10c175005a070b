"""A compiled copy of the source tree (scripts/compile), built once per source state.

The copy lives in the build cache outside the work tree (tests.harness.cache), under
``compiled/`` and a key that hashes gateway/, protocols/, setup.py, mypyc.ini and the
mypy version: a second run, or a second process, reuses it. ``bench.brokers``'
gatewayd-compiled and ``tests/test_compiled.py`` run from it (``PYTHONPATH``).

Invariants:
- A directory under its final name is complete: it is built under a temporary name and
  renamed, with a lock held, so concurrent callers build it once.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.harness.cache import cache_dir

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("setup.py", "mypyc.ini", "pyproject.toml", "gateway", "protocols")


def source_key(src: Path) -> str:
    h = hashlib.sha256()
    for name in SOURCES:
        top = src / name
        files = [top] if top.is_file() else sorted(top.rglob("*.py"))
        for f in files:
            h.update(str(f.relative_to(src)).encode() + b"\0" + f.read_bytes())
    import mypy.version

    h.update(mypy.version.__version__.encode())
    return h.hexdigest()[:16]


def compiled_tree(src: Path = REPO) -> Path:
    """The compiled copy of ``src`` (built now if the cache has none); its path goes on
    ``PYTHONPATH``."""
    root = cache_dir() / "compiled"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"tree-{source_key(src)}"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if final.is_dir():
            return final
        tmp = root / f".tmp-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        for name in SOURCES:
            if (src / name).is_dir():
                shutil.copytree(src / name, tmp / name,
                                ignore=shutil.ignore_patterns("__pycache__", "*.so"))
            else:
                shutil.copy2(src / name, tmp / name)
        r = subprocess.run([str(REPO / "scripts/compile"), str(tmp)], capture_output=True,
                           text=True, env=dict(os.environ, PYTHON=sys.executable))
        if r.returncode:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(f"scripts/compile failed:\n{r.stderr[-3000:]}")
        tmp.rename(final)
        return final
