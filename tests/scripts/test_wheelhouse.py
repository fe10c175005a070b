"""scripts/wheelhouse: the wheels it writes install the gateway into a fresh venv with no
package index, and bad input is one line and exit 2."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE = REPO / "scripts/wheelhouse"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(WHEELHOUSE), *args], capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_an_offline_install_from_the_wheelhouse_runs(tmp_path: Path) -> None:
    out = tmp_path / "wheels"
    r = run(str(out), "--python", sys.executable, "--extras", "")
    assert r.returncode == 0, r.stderr[-2000:]
    pins = (out / "requirements.txt").read_text().splitlines()
    names = {line.split("==")[0] for line in pins}
    assert {"edge-gateway", "pydantic", "aiohttp", "websockets", "aiocoap"} <= names
    assert all("--hash=sha256:" in line for line in pins)
    wheels = list(out.glob("*.whl"))
    assert len((out / "SHA256SUMS").read_text().splitlines()) == len(wheels)
    # ours twice: pure Python, and the hot path compiled for this platform (both pinned)
    ours = sorted(w.name for w in out.glob("edge_gateway-*.whl"))
    assert len(ours) == 2 and ours[1].endswith("-py3-none-any.whl"), ours
    assert "linux" in ours[0], ours
    (pin,) = [line for line in pins if line.startswith("edge-gateway==")]
    assert pin.count("--hash=sha256:") == 2

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin/python"
    r2 = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-index", "--find-links",
                         str(out), "-r", str(out / "requirements.txt")],
                        capture_output=True, text=True, timeout=600)
    assert r2.returncode == 0, r2.stderr[-2000:]
    r3 = subprocess.run([str(env_dir / "bin/gatewayd"), "--version"], capture_output=True,
                        text=True, timeout=60)
    assert r3.returncode == 0 and "0." in r3.stdout, r3.stdout + r3.stderr
    # the installed copy is the wheel, not this checkout, and pip took the compiled one
    r4 = subprocess.run([str(py), "-c", "import gateway, gateway.app, gateway.core.node as n; "
                         "print(gateway.__file__, n.__file__)"],
                        capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert str(env_dir) in r4.stdout, r4.stdout + r4.stderr
    assert r4.stdout.split()[1].endswith(".so"), r4.stdout


@pytest.mark.slow
@pytest.mark.image  # beside tests/image/test_cross.py, which builds the same cached wheel
def test_an_arm64_wheelhouse_has_aarch64_wheels_and_ours_compiled(tmp_path: Path) -> None:
    """--arch arm64 on this amd64 host: the arm64 image's wheelhouse stage, copied out."""
    if platform.machine() != "x86_64" or os.geteuid() != 0:
        pytest.skip("cross-builds arm64 from amd64, as root (mmdebstrap)")
    out = tmp_path / "arm64"
    r = run(str(out), "--arch", "arm64")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "wheels, requirements.txt and SHA256SUMS in" in r.stdout
    wheels = sorted(w.name for w in out.glob("*.whl"))
    assert all(w.endswith("-none-any.whl") or "aarch64" in w for w in wheels), wheels
    ours = [w for w in wheels if w.startswith("edge_gateway-")]
    assert ours == ["edge_gateway-0.1.0-cp311-cp311-linux_aarch64.whl",
                    "edge_gateway-0.1.0-py3-none-any.whl"], ours
    pins = (out / "requirements.txt").read_text().splitlines()
    (pin,) = [line for line in pins if line.startswith("edge-gateway==")]
    assert pin.count("--hash=sha256:") == 2
    assert {"uvloop", "pydantic-core", "cryptography"} <= {p.split("==")[0] for p in pins}


@pytest.mark.parametrize(("args", "says"), [
    ((), "usage: scripts/wheelhouse DIR"),
    (("a", "b"), "only one DIR"),
    (("out", "--bogus"), "unknown option --bogus"),
    (("out", "--python", "/nonexistent/python9"), "no such interpreter"),
    (("out", "--extras", "sys temd"), "comma-separated list"),
    (("out", "--arch", "arm64", "--pure"), "--pure does not apply with --arch arm64"),
    (("out", "--arch", "riscv64"), "unknown arch 'riscv64' (supported: amd64, arm64)"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...],
                                          says: str) -> None:
    r = subprocess.run([str(WHEELHOUSE), *args], capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode == 2
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not (tmp_path / "out").exists()
