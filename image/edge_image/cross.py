"""Our compiled wheel for a foreign arch, cross-compiled: nothing runs under emulation.

mypyc turns the hot path (``setup.py``'s ``HOT_PATH``) into C on the build host, and the
target's cross compiler (Debian's ``gcc-<triplet>``, e.g. ``gcc-aarch64-linux-gnu``)
compiles that C against the target's Python headers and links it against the target's
C library. Both come from a *sysroot*: Debian's packages for the target, extracted but
not installed (``mmdebstrap --variant=extract``: no maintainer script runs, so nothing
needs qemu-user; about 5 s). ``setup.py`` runs on the host's Python 3.11 with the
target's build configuration (``_PYTHON_SYSCONFIGDATA_NAME``: its compiler, flags and
extension suffix) and platform (``_PYTHON_HOST_PLATFORM``: the wheel's tag), in a build
virtualenv holding pyproject.toml's build requirements (``pip wheel
--no-build-isolation``: an isolated build would fetch the build tools for the target).

Invariants:
- The target runs Debian 12's Python 3.11, like the host's ``/usr/bin/python3``: the
  wheel is ``cp311-cp311-linux_<uname>``, and mypyc's C is for 3.11.
- The sysroot is keyed by its package list, suite, mirror and arch; the build venv by
  the build requirements; the wheel by the sources (``wheels.source_key``), the arch and
  the sysroot's key. A cache entry is renamed into place only when complete.
- Every module of ``HOT_PATH`` is in the wheel as an extension of the target
  (:func:`check_wheel`), else the build fails: a wheel that silently fell back to pure
  Python would ship as "compiled".
"""

from __future__ import annotations

import ast
import shutil
import tomllib
import zipfile
from pathlib import Path

from edge_image.arch import Arch
from edge_image.common import (
    MIRROR,
    REPO,
    SUITE,
    BadInput,
    commit,
    fresh_dir,
    key_of,
    run,
)

#: What the sysroot holds: the headers and the C library to compile and link against,
#: and the target's Python itself (its build configuration, and an interpreter that
#: tests run under qemu-user).
SYSROOT_PACKAGES = ["libpython3.11-dev", "libc6-dev", "python3.11-minimal",
                    "libpython3.11-stdlib"]
#: what our wheel is built from (copied: a build in the checkout would leave build/ there)
SOURCES = ["pyproject.toml", "setup.py", "mypyc.ini", "README.md", "gateway", "protocols"]


def compiler(arch: Arch) -> tuple[str, str]:
    """(the cross compiler's command, the Debian package that has it)."""
    return f"{arch.gnu_type}-gcc", "gcc-" + arch.gnu_type.replace("_", "-")


def require_compiler(arch: Arch) -> None:
    cc, package = compiler(arch)
    if shutil.which(cc) is None:
        raise BadInput(f"{cc} not found: compiling the hot path for {arch.name} needs "
                       f"the cross compiler (apt-get install {package})")


def sysroot(cache: Path, arch: Arch) -> Path:
    """The target's Python headers, C library and interpreter, extracted (cached)."""
    args = ["--variant=extract", f"--architectures={arch.name}",
            f"--include={','.join(SYSROOT_PACKAGES)}", "--aptopt=Acquire::Retries \"3\""]
    final = cache / f"sysroot-{key_of(repr(args), SUITE, MIRROR)}"
    if (final / "usr/bin/python3.11").exists():
        return final
    tmp = fresh_dir(final)
    run(["unshare", "--mount", "--propagation", "private", "mmdebstrap", *args, SUITE, tmp,
         MIRROR], timeout=1800)
    commit(tmp, final)
    return final


def build_venv(cache: Path) -> Path:
    """A virtualenv of the host's Python 3.11 with pyproject.toml's build requirements."""
    requires = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
    final = cache / f"crossvenv-{key_of(*requires, 'wheel')}"
    if (final / "bin/python").exists():
        return final
    tmp = fresh_dir(final)
    run(["/usr/bin/python3", "-m", "venv", tmp], timeout=300)
    run([tmp / "bin/python", "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
         *requires, "wheel"], timeout=1200)
    commit(tmp, final)  # used as bin/python -m ..., so its scripts' paths do not matter
    return final


def target_env(root: Path, arch: Arch, config_dir: Path) -> dict[str, str]:
    """The variables that make setup.py build for the target: its build configuration
    (a copy of its ``_sysconfigdata`` module in ``config_dir``, on ``PYTHONPATH``), its
    platform tag, and the sysroot for the compiler and the linker."""
    name = f"_sysconfigdata__linux_{arch.gnu_type}"
    found = root / "usr/lib/python3.11" / f"{name}.py"
    if not found.exists():
        raise BadInput(f"the {arch.name} sysroot has no {found.name}")
    shutil.copy2(found, config_dir / found.name)
    flags = f"--sysroot={root}"
    return {
        "EDGE_GATEWAY_COMPILE": "1",
        "_PYTHON_SYSCONFIGDATA_NAME": name,
        "_PYTHON_HOST_PLATFORM": f"linux-{arch.uname}",
        "PYTHONPATH": str(config_dir),
        "CFLAGS": f"{flags} -I{root}/usr/include/python3.11",
        "LDFLAGS": flags,
    }


def compiled_wheel(cache: Path, arch: Arch, source_key: str) -> Path:
    """Our wheel with the hot path compiled for ``arch`` (cached)."""
    require_compiler(arch)
    root = sysroot(cache, arch)
    final = cache / f"crosswheel-{key_of(source_key, arch.name, root.name)}"
    found = sorted(final.glob("*.whl"))
    if found:
        return found[0]
    venv = build_venv(cache)
    tmp = fresh_dir(final)
    tmp.mkdir()
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, src / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        else:
            shutil.copy2(REPO / name, src / name)
    config = tmp / "sysconfig"
    config.mkdir()
    run([venv / "bin/python", "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--no-build-isolation", "--wheel-dir", tmp, src],
        env=target_env(root, arch, config), cwd=src, timeout=1800)
    shutil.rmtree(src)
    shutil.rmtree(config)
    wheel = check_wheel(tmp, arch)
    commit(tmp, final)
    return final / wheel.name


def hot_path() -> list[str]:
    """setup.py's ``HOT_PATH``."""
    for node in ast.parse((REPO / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "HOT_PATH":
            paths: list[str] = ast.literal_eval(node.value)
            return paths
    raise BadInput("setup.py has no HOT_PATH")


def check_wheel(directory: Path, arch: Arch) -> Path:
    """The one wheel in ``directory``, tagged for ``arch`` with every hot-path module
    compiled for it; else one line naming what is wrong."""
    wheels = sorted(directory.glob("*.whl"))
    if len(wheels) != 1 or not wheels[0].name.startswith("edge_gateway-"):
        raise BadInput(f"expected our one wheel in {directory}, found "
                       f"{[w.name for w in wheels]}")
    wheel = wheels[0]
    if not wheel.name.endswith(f"-cp311-cp311-linux_{arch.uname}.whl"):
        raise BadInput(f"{wheel.name} is not tagged for {arch.name} (linux_{arch.uname})")
    suffix = f".cpython-311-{arch.gnu_type}.so"
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        missing = [p for p in hot_path() if p.removesuffix(".py") + suffix not in names]
        if missing:
            raise BadInput(f"{wheel.name} lacks compiled modules: {', '.join(missing)}")
        machine = {"aarch64": 183, "x86_64": 62}.get(arch.uname)
        for so in (n for n in names if n.endswith(".so")):
            header = z.read(so)[:20]
            if machine is not None and int.from_bytes(header[18:20], "little") != machine:
                raise BadInput(f"{so} in {wheel.name} is not an {arch.uname} ELF file")
    return wheel
