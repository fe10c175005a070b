"""The wheelhouse stage: our wheel and every runtime dependency, for the target's Python.

- Native (the host runs the target's binaries natively): ``scripts/wheelhouse`` with
  Debian's ``/usr/bin/python3``, keyed by gateway/, protocols/, pyproject.toml, setup.py,
  mypyc.ini. It holds our wheel twice, pure and with the hot path compiled (setup.py);
  pip installs the compiled one.
- Foreign (arm64 on amd64): no emulation. A native ``scripts/wheelhouse`` run resolves
  the dependency set; its pure-Python wheels (``*-none-any``, ours included) serve any
  arch, and each binary wheel is swapped for PyPI's manylinux wheel of the same version
  for the target (``pip download --platform ... --only-binary=:all:``). Extras whose
  packages have no such wheel are left out (:data:`FOREIGN_EXTRAS`). Ours is there
  twice, like natively: pure, and with the hot path cross-compiled for the target
  (edge_image/cross.py: the target's cross compiler and a sysroot of its Debian
  packages, extracted); pip installs the compiled one.

Invariant: ``requirements.txt`` pins exactly the wheels in the directory by sha256.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path

from edge_image import cross
from edge_image.arch import Arch
from edge_image.common import (
    REPO,
    BadInput,
    commit,
    fresh_dir,
    hash_files,
    key_of,
    remove,
    run,
)

#: Extras of a foreign-arch wheelhouse: none. systemd-python (sd_notify through
#: libsystemd; gatewayd writes to $NOTIFY_SOCKET itself without it) and python-mbedtls
#: (CoAP over DTLS) have no aarch64 wheel on PyPI; compiling them under emulation takes
#: too long for CI.
FOREIGN_EXTRAS = ""


def source_key() -> str:
    h = hashlib.sha256()
    hash_files(h, [REPO / "gateway", REPO / "protocols", REPO / "pyproject.toml",
                   REPO / "setup.py", REPO / "mypyc.ini", REPO / "scripts/wheelhouse"], REPO)
    return h.hexdigest()[:16]


def native(cache: Path) -> tuple[Path, str, bool]:
    """(directory, key, cached?)"""
    key = source_key()
    final = cache / f"wheelhouse-{key}"
    if (final / "requirements.txt").exists():
        return final, key, True
    tmp = fresh_dir(final)
    run([REPO / "scripts/wheelhouse", tmp, "--python", "/usr/bin/python3"], timeout=1800)
    commit(tmp, final)
    return final, key, False


def foreign(cache: Path, arch: Arch) -> tuple[Path, str, bool]:
    """(directory, key, cached?) -- the wheelhouse of a foreign arch, built natively.

    The dependency set is resolved by a native ``scripts/wheelhouse`` run (same
    pyproject.toml, same versions). Pure-Python wheels (``*-none-any``: ours, pysyncobj's
    sdist built here...) are arch-independent and taken as they are; every binary one is
    replaced by PyPI's manylinux wheel of the same version for ``arch``. A dependency
    with native code and no such wheel stops the build (one line naming it); the extras
    whose packages have none (systemd-python, python-mbedtls) are left out for a foreign
    arch (:data:`FOREIGN_EXTRAS`), so no compiler ever runs under emulation. Our compiled
    wheel for ``arch`` is cross-compiled (edge_image/cross.py) and joins the pure one."""
    key = key_of(source_key(), arch.name, FOREIGN_EXTRAS, *arch.wheel_platforms, "cross")
    final = cache / f"wheelhouse-{key}"
    if (final / "requirements.txt").exists():
        return final, key, True
    native_dir = fresh_dir(cache / f"wheelnative-{key}")
    tmp = fresh_dir(final)
    tmp.mkdir()
    try:
        run([REPO / "scripts/wheelhouse", native_dir, "--python", "/usr/bin/python3",
             "--extras", FOREIGN_EXTRAS, "--pure"], timeout=1800)
        for whl in sorted(native_dir.glob("*.whl")):
            name, version = whl.name.split("-")[:2]
            if whl.name.endswith("-none-any.whl"):
                shutil.copy2(whl, tmp / whl.name)
                continue
            platforms = [a for p in arch.wheel_platforms for a in ("--platform", p)]
            r = run(["/usr/bin/python3", "-m", "pip", "download", "--quiet", "--no-deps",
                     "--disable-pip-version-check", "--only-binary=:all:", *platforms,
                     "--python-version", "3.11", "--implementation", "cp",
                     "--dest", tmp, f"{name}=={version}"], timeout=600, check=False)
            if not list(tmp.glob(f"{name}-{version}-*.whl")):
                raise BadInput(f"{name} {version} has no {arch.name} wheel on the package "
                               f"index and cannot be built without emulation: {r[-200:]}")
        shutil.copy2(cross.compiled_wheel(cache, arch, source_key()), tmp)
        pins: dict[str, list[str]] = {}  # "name==version" -> hashes (ours: two wheels)
        for whl in sorted(tmp.glob("*.whl")):
            name, version = whl.name.split("-")[:2]
            digest = hashlib.sha256(whl.read_bytes()).hexdigest()
            pin = f"{re.sub(r'[-_.]+', '-', name).lower()}=={version}"
            pins.setdefault(pin, []).append(f"--hash=sha256:{digest}")
        lines = [f"{pin} {' '.join(hashes)}" for pin, hashes in pins.items()]
        (tmp / "requirements.txt").write_text("\n".join(lines) + "\n")
        sums = [f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.name}"
                for w in sorted(tmp.glob("*.whl"))]
        (tmp / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    finally:
        remove(native_dir)
    commit(tmp, final)
    return final, key, False
