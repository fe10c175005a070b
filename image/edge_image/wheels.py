"""The wheelhouse stage: our wheel and every runtime dependency, for the target's Python.

- Native (the host runs the target's binaries natively): ``scripts/wheelhouse`` with
  Debian's ``/usr/bin/python3``, keyed by gateway/, protocols/, pyproject.toml.
- Foreign (arm64 on amd64): the *dependencies* are built by the target's Python in an
  emulated chroot (qemu-user through binfmt_misc): a throw-away copy of the base stage
  plus compilers, running ``scripts/wheelhouse``; keyed by pyproject.toml, the wheelhouse
  script and the base, so it runs again only when a dependency changes (minutes under
  emulation). Our own wheel is pure Python (``py3-none-any``): it is built natively and
  replaces the one of the emulated run, so a change under gateway/ costs seconds.

Invariant: ``requirements.txt`` pins exactly the wheels in the directory by sha256.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from edge_image.arch import build_packages
from edge_image.common import (
    REPO,
    CommandFailed,
    commit,
    fresh_dir,
    hash_files,
    key_of,
    remove,
    run,
)

SOURCES = ["pyproject.toml", "README.md", "gateway", "protocols"]
#: The foreign wheelhouse leaves out the dtls extra: python-mbedtls has no aarch64 wheel
#: and compiling it (Cython + mbedTLS) under emulation takes too long for CI.
FOREIGN_EXTRAS = "systemd"


def source_key() -> str:
    h = hashlib.sha256()
    hash_files(h, [REPO / "gateway", REPO / "protocols", REPO / "pyproject.toml",
                   REPO / "scripts/wheelhouse"], REPO)
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


def foreign(cache: Path, base: Path, base_key: str,
            chroot: Callable[[Path, str], None]) -> tuple[Path, str, bool]:
    """(directory, key, cached?) -- the emulated dependency build, then our wheel."""
    h = hashlib.sha256()
    hash_files(h, [REPO / "pyproject.toml", REPO / "scripts/wheelhouse"], REPO)
    deps_key = key_of(base_key, h.hexdigest(), FOREIGN_EXTRAS)
    key = key_of(deps_key, source_key())
    final = cache / f"wheelhouse-{key}"
    if (final / "requirements.txt").exists():
        return final, key, True
    deps = cache / f"wheeldeps-{deps_key}"
    if not (deps / "requirements.txt").exists():
        _emulated_deps(deps, base, chroot)
    tmp = fresh_dir(final)
    tmp.mkdir()
    ours = _our_wheel(tmp)
    lines = [ln for ln in (deps / "requirements.txt").read_text().splitlines()
             if ln and not ln.startswith("edge-gateway==")]
    for whl in deps.glob("*.whl"):
        if not whl.name.startswith("edge_gateway-"):
            shutil.copy2(whl, tmp / whl.name)
    digest = hashlib.sha256(ours.read_bytes()).hexdigest()
    version = ours.name.split("-")[1]
    lines.append(f"edge-gateway=={version} --hash=sha256:{digest}")
    (tmp / "requirements.txt").write_text("\n".join(sorted(lines)) + "\n")
    sums = [f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.name}"
            for w in sorted(tmp.glob("*.whl"))]
    (tmp / "SHA256SUMS").write_text("\n".join(sums) + "\n")
    commit(tmp, final)
    return final, key, False


def _our_wheel(dest: Path) -> Path:
    src = Path(run(["mktemp", "-d"]).strip())
    try:
        for name in SOURCES:
            run(["cp", "-a", REPO / name, src / name])
        run(["find", src, "-name", "__pycache__", "-prune", "-exec", "rm", "-rf", "{}", "+"])
        run(["/usr/bin/python3", "-m", "pip", "wheel", "--quiet", "--no-deps",
             "--disable-pip-version-check", "--wheel-dir", dest, src], timeout=600)
    finally:
        shutil.rmtree(src, ignore_errors=True)
    wheels = list(dest.glob("edge_gateway-*.whl"))
    if len(wheels) != 1 or not re.search(r"-py3-none-any\.whl$", wheels[0].name):
        raise CommandFailed(f"expected one pure-Python edge_gateway wheel, got {wheels}")
    return wheels[0]


def _emulated_deps(final: Path, base: Path, chroot: Callable[[Path, str], None]) -> None:
    """``scripts/wheelhouse`` run by the target's python3 in a copy of the base stage."""
    root = fresh_dir(final.with_name(final.name.replace("wheeldeps", "wheelroot")))
    try:
        run(["cp", "-a", "--reflink=auto", base, root])
        # The throw-away root resolves names and trusts CAs as this host does (apt and
        # pip fetch from the same mirrors).
        for rel in ("etc/resolv.conf", "etc/ssl/certs/ca-certificates.crt"):
            remove(root / rel)
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(Path("/") / rel, root / rel)
        src = root / "tmp/src"
        src.mkdir(parents=True)
        for name in SOURCES:
            run(["cp", "-a", REPO / name, src / name])
        (src / "scripts").mkdir()
        shutil.copy(REPO / "scripts/wheelhouse", src / "scripts/wheelhouse")
        chroot(root, f"""set -e
apt-get update -q
apt-get install -y -q --no-install-recommends {' '.join(build_packages())}
export PIP_CERT=/etc/ssl/certs/ca-certificates.crt PIP_FIND_LINKS= PIP_CONSTRAINT=
bash /tmp/src/scripts/wheelhouse /tmp/out --python /usr/bin/python3 --extras {FOREIGN_EXTRAS}
""")
        tmp = fresh_dir(final)
        shutil.copytree(root / "tmp/out", tmp)
        commit(tmp, final)
    finally:
        remove(root)
