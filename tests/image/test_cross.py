"""Our compiled wheel for arm64, cross-compiled (edge_image/cross.py), checked without
booting anything: tagged ``linux_aarch64``, every hot-path module an aarch64 extension,
and the core's tests passing against it on Debian's arm64 Python 3.11 (the build's
sysroot) under qemu-user. tests/image/test_arm64.py boots the image that installs it,
when its Debian stage is cached; the checker's failures are in tests/image/test_arch.py.

Budget: the sysroot (``mmdebstrap --variant=extract``, about 5 s) and the wheel (about a
minute of mypyc and the cross compiler) are cached under the image build's keys, so after
an arm64 image build, or in a second run, only the emulated tests run (about 15 s).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
import zipfile
from pathlib import Path

import pytest

from edge_image import arch, cross, wheels
from tests.image.conftest import image_cache
from tests.image.vm import REPO

pytestmark = [pytest.mark.image, pytest.mark.slow, pytest.mark.timeout(1800)]

ARM64 = arch.get("arm64")

#: Test files that import only the standard library and pytest, so Debian's bare arm64
#: Python runs them (the others need arm64 builds of uvloop, cryptography, hypothesis...):
#: the MQTT channel, the core, the store and the stream and datagram shells.
CORE_TESTS = [
    "tests/protocols/mqtt/test_channel.py",
    "tests/protocols/mqtt/test_channel_protection.py",
    "tests/protocols/mqtt/test_channel_store_refusal.py",
    "tests/gateway/core/test_node.py",
    "tests/gateway/core/test_hooks.py",
    "tests/gateway/net/test_stream.py",
    "tests/gateway/net/test_datagram.py",
    "tests/gateway/net/test_protection.py",
    "tests/gateway/net/test_websocket.py",
    *(f"tests/gateway/store/test_{name}.py" for name in (
        "banned", "corruption", "journal", "queue", "salvage", "sessions", "size_cap",
        "space", "storage_faults", "writer_faults", "writer_scheduling",
        "writer_shutdown")),
]
#: it runs sys.executable in a child: an arm64 binary, which needs binfmt_misc
DESELECT = ["tests/gateway/store/test_queue.py::test_committed_items_survive_sigkill"]


@pytest.fixture(scope="module")
def cache() -> Path:
    if os.geteuid() != 0:
        pytest.skip("the sysroot (mmdebstrap) needs root, as image/build does")
    for tool, package in (cross.compiler(ARM64), ("qemu-aarch64-static", "qemu-user-static"),
                          ("mmdebstrap", "mmdebstrap")):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} not installed (Debian package {package})")
    return image_cache() / "arm64"


@pytest.fixture(scope="module")
def wheel(cache: Path) -> Path:
    return cross.compiled_wheel(cache, ARM64, wheels.source_key())


def test_the_wheel_is_aarch64_with_every_hot_path_module(wheel: Path) -> None:
    assert wheel.name == "edge_gateway-0.1.0-cp311-cp311-linux_aarch64.whl"
    assert cross.check_wheel(wheel.parent, ARM64) == wheel
    with zipfile.ZipFile(wheel) as z:
        so = [n for n in z.namelist() if n.endswith(".so")]
    # one shim per module and mypyc's shared library
    assert len(so) == len(cross.hot_path()) + 1, so


def test_the_core_tests_pass_on_arm64_python_under_qemu_user(
        cache: Path, wheel: Path, tmp_path: Path) -> None:
    root = cross.sysroot(cache, ARM64)
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    python = ["qemu-aarch64-static", "-L", str(root), str(root / "usr/bin/python3.11")]
    # pytest and its pure-Python dependencies from this interpreter's site-packages; no
    # plugin is loaded (their native parts are amd64)
    env = dict(os.environ, PYTHONSAFEPATH="1", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1",
               PYTHONPATH=os.pathsep.join([str(site), str(REPO),
                                           sysconfig.get_paths()["purelib"]]))
    modules = [p.removesuffix(".py").replace("/", ".") for p in cross.hot_path()]
    code = ("import importlib.util, platform\nprint(platform.machine())\n"
            f"for m in {modules!r}: print(importlib.util.find_spec(m).origin)")
    r = subprocess.run([*python, "-c", code], capture_output=True, text=True, env=env,
                       cwd=REPO, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    machine, *origins = r.stdout.split()
    assert machine == "aarch64"
    assert len(origins) == len(modules)
    assert all(o.startswith(str(site)) and o.endswith(".cpython-311-aarch64-linux-gnu.so")
               for o in origins), origins
    r = subprocess.run(
        [*python, "-m", "pytest", "--import-mode=append", "-p", "no:cacheprovider",
         "--noconftest", "-q", "-m", "not slow", *(f"--deselect={d}" for d in DESELECT),
         *CORE_TESTS],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=1500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    last = r.stdout.strip().splitlines()[-1]
    assert " passed" in last and "failed" not in last and "error" not in last, last
    print(f"\narm64, compiled, under qemu-user: {last}")
