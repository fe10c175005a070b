"""image/build, image/provision, image/flash without booting: outputs, signatures, and
the one-line, exit-2 refusals (unknown arch, no release key, mounted or system disk)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.image.conftest import Built
from tests.image.vm import REPO

# The first test pays for the session fixture: a cold image build (minutes).
pytestmark = [pytest.mark.image, pytest.mark.slow, pytest.mark.timeout(3600)]


def tool(name: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(REPO / "image" / name), *map(str, args)],
                          capture_output=True, text=True, timeout=600)


def test_outputs_and_layout(built: Built) -> None:
    assert built.img.exists() and built.bmap.exists() and built.bundle.exists()
    table = json.loads(subprocess.run(["sfdisk", "--json", str(built.img)], check=True,
                                      capture_output=True, text=True).stdout)
    names = [p["name"] for p in table["partitiontable"]["partitions"]]
    assert names == ["esp", "rootA", "rootB", "data"]
    apparent = built.img.stat().st_size
    allocated = built.img.stat().st_blocks * 512
    print(f"\nimage {apparent >> 20} MiB apparent, {allocated >> 20} MiB allocated; "
          f"bundle {built.bundle.stat().st_size >> 20} MiB; build {built.build_seconds:.0f} s")
    assert allocated < apparent / 2, "the image should be sparse"


def rauc_info(bundle: Path, keyring: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    """``rauc info`` with the unit's keyring settings (check-purpose=codesign)."""
    conf = tmp / "system.conf"
    conf.write_text(f"[system]\ncompatible=edge-gateway-amd64\nbootloader=noop\n\n"
                    f"[keyring]\npath={keyring}\ncheck-purpose=codesign\n")
    return subprocess.run(["rauc", f"--conf={conf}", "info", "--output-format=json",
                           str(bundle)], capture_output=True, text=True, timeout=300)


def test_bundle_verifies_against_the_image_keyring(built: Built, tmp_path: Path) -> None:
    r = rauc_info(built.bundle, built.cache / "keys/dev/ca.cert.pem", tmp_path)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout.strip().splitlines()[-1])
    assert info["compatible"] == "edge-gateway-amd64"
    assert info["version"] == "test"
    # The checker fails on a foreign keyring.
    foreign = tmp_path / "foreign"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(tmp_path / "k.pem"),
                    "-out", str(foreign), "-days", "1", "-subj", "/CN=other"],
                   check=True, capture_output=True)
    r = rauc_info(built.bundle, foreign, tmp_path)
    assert r.returncode != 0 and "signature verification failed" in r.stderr, r.stderr


def test_unchanged_rebuild_is_cached(built: Built) -> None:
    r = tool("build", "--out", built.out, "--version", "test", "--boot-tries", "2")
    assert r.returncode == 0, r.stderr
    stages = [line for line in r.stdout.splitlines() if line.strip().startswith("cached")]
    assert len(stages) >= 7, r.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--arch", "sparc"], "unknown arch 'sparc'"),
    (["--release"], "no signing key"),
    (["--version", "1 2"], "invalid --version"),
    (["--kernel", "rt"], "unknown --kernel 'rt' for amd64"),
    (["--arch", "arm64", "--kernel", "rt"], "unknown --kernel 'rt' for arm64"),
])
def test_build_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str],
                                            message: str) -> None:
    r = tool("build", "--out", tmp_path, *args)
    assert r.returncode == 2
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_flash_refuses_the_running_systems_disk(built: Built) -> None:
    src = subprocess.run(["findmnt", "-n", "-o", "SOURCE", "/"], capture_output=True,
                         text=True).stdout.strip().split("[")[0]
    if not src.startswith("/dev/"):
        pytest.skip(f"/ is not on a block device here ({src})")
    r = tool("flash", built.img, src, "--yes")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "refusing to flash" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_provision_refuses_bad_input(built: Built, tmp_path: Path) -> None:
    img = tmp_path / "x.img"
    subprocess.run(["cp", "--sparse=always", str(built.img), str(img)], check=True)
    bad = tmp_path / "bad.toml"
    bad.write_text("[node\n")
    r = tool("provision", img, "--config", bad)
    assert r.returncode == 2 and "not valid TOML" in r.stderr
    good = tmp_path / "gateway.toml"
    good.write_text('[node]\nname = "x@127.0.0.1"\n')
    r = tool("provision", img, "--config", good, "--hostname", "bad_name!")
    assert r.returncode == 2 and "invalid hostname" in r.stderr


def test_root_has_dns_resolver_and_ntp(built: Built, tmp_path: Path) -> None:
    """systemd-resolved and systemd-timesyncd are installed and enabled, and
    /etc/resolv.conf on the read-only root already points at resolved's stub."""
    def debugfs(cmd: str) -> str:
        return subprocess.run(["debugfs", "-R", cmd, str(built.slot)], capture_output=True,
                              text=True, check=True).stdout
    assert "Fast link dest: \"../run/systemd/resolve/stub-resolv.conf\"" in \
        debugfs("stat /etc/resolv.conf")
    wants = debugfs("ls -l /etc/systemd/system/sysinit.target.wants") + \
        debugfs("ls -l /etc/systemd/system/multi-user.target.wants")
    assert "systemd-resolved.service" in wants and "systemd-timesyncd.service" in wants, wants
