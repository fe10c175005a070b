"""What differs per arch, without building: kernel flavours (--kernel), the serial
console on the kernel command line, and the binfmt_misc check a foreign-arch build makes
first (against a fake binfmt_misc directory), and the arm64 Debian stage's mmdebstrap
hooks (run against a fake root). Fast, no root."""

from __future__ import annotations

import os
import platform
import subprocess
import zipfile
from pathlib import Path

import pytest

from edge_image import arch, cross, layout
from edge_image.common import BadInput


def test_kernel_flavours() -> None:
    amd64, arm64 = arch.get("amd64"), arch.get("arm64")
    assert arch.kernel_package(amd64, None) == "linux-image-cloud-amd64"  # what tests boot
    assert arch.kernel_package(amd64, "generic") == "linux-image-amd64"
    assert arch.kernel_package(arm64, None) == "linux-image-arm64"
    with pytest.raises(BadInput, match="unknown --kernel 'rt' for amd64"):
        arch.kernel_package(amd64, "rt")
    with pytest.raises(BadInput, match="unknown arch 'riscv64'"):
        arch.get("riscv64")


def test_serial_console_per_arch() -> None:
    assert "console=ttyS0,115200" in layout.kernel_cmdline("amd64")
    arm = layout.kernel_cmdline("arm64")
    assert "console=ttyAMA0,115200" in arm and "ttyS0" not in arm
    assert arm.startswith("ro ")
    assert "console=ttyAMA0" in layout.entry("B", 2, "arm64")


@pytest.mark.skipif(platform.machine() != "x86_64", reason="arm64 is native here")
def test_binfmt_check_names_what_is_missing(tmp_path: Path) -> None:
    arm64 = arch.get("arm64")
    with pytest.raises(BadInput, match=r"qemu-aarch64 is missing.*qemu-user-static"):
        arch.ensure_binfmt(arm64, tmp_path, fix=False)
    entry = tmp_path / "qemu-aarch64"
    entry.write_text("disabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\n"
                     "flags: PF\n")
    with pytest.raises(BadInput, match="is disabled"):
        arch.ensure_binfmt(arm64, tmp_path, fix=False)
    entry.write_text("enabled\ninterpreter /usr/bin/qemu-aarch64\nflags: P\n")
    with pytest.raises(BadInput, match="lacks the F flag"):
        arch.ensure_binfmt(arm64, tmp_path, fix=False)
    entry.write_text("enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\n"
                     "flags: PF\n")
    arch.ensure_binfmt(arm64, tmp_path, fix=False)
    arch.ensure_binfmt(arch.get("amd64"), tmp_path, fix=False)  # native: nothing to check


def run_hook(option: str, root: Path, tmp: Path, then: str = "") -> list[str]:
    """Run an mmdebstrap ``--*-hook=SCRIPT`` option as mmdebstrap does (``sh -c SCRIPT
    exec ROOT``), with ``chroot`` replaced by a recorder (which then runs ``then``);
    return the recorded calls."""
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp / "calls"
    fake = bin_dir / "chroot"
    fake.write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\n{then}')
    fake.chmod(0o755)
    script = option.split("=", 1)[1]
    subprocess.run(["sh", "-c", script, "exec", str(root)], check=True,
                   env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    return calls.read_text().splitlines() if calls.exists() else []


def test_arm64_base_configures_initramfs_before_the_kernel(tmp_path: Path) -> None:
    """The arm64 Debian stage's essential hook (after the Essential packages, before
    initramfs-tools and the kernel) selects MODULES=list with the fixed module list and
    parks update-initramfs as a no-op; the customize hook restores it. amd64 gets no
    options, so its Debian stage's cache key is what it was."""
    assert arch.base_options(arch.get("amd64")) == []
    opts = arch.base_options(arch.get("arm64"))
    essential = next(o for o in opts if o.startswith("--essential-hook="))
    customize = next(o for o in opts if o.startswith("--customize-hook="))
    assert "--dpkgopt=force-unsafe-io" in opts
    root = tmp_path / "root"
    (root / "usr/sbin").mkdir(parents=True)
    calls = run_hook(essential, root, tmp_path)
    assert (root / "etc/initramfs-tools/conf.d/gateway-modules").read_text() == "MODULES=list\n"
    listed = (root / "usr/share/initramfs-tools/modules.d/edge-gateway").read_text().split()
    assert listed == list(arch.ARM64_INITRAMFS_MODULES) and "sdhci-iproc" in listed
    stub = root / "usr/sbin/update-initramfs"
    assert stub.read_text() == "#!/bin/sh\nexit 0\n" and os.access(stub, os.X_OK)
    assert calls == [f"{root} dpkg-divert --quiet --local --rename --divert "
                     f"{arch.PARKED} --add /usr/sbin/update-initramfs"]
    # What dpkg-divert --remove --rename does, for the customize hook's final check.
    (tmp_path / "calls").unlink()
    calls = run_hook(customize, root, tmp_path,
                     then=f'printf "#!/bin/sh\\necho real\\n" > "{stub}"; chmod 755 "{stub}"\n')
    assert calls == [f"{root} dpkg-divert --quiet --local --rename --divert "
                     f"{arch.PARKED} --remove /usr/sbin/update-initramfs"]
    assert "real" in stub.read_text()


def test_the_cross_wheel_check_names_what_is_wrong(tmp_path: Path) -> None:
    """edge_image/cross.py:check_wheel, on wheels made here (the real one: test_cross.py)."""
    arm64 = arch.get("arm64")
    suffix = ".cpython-311-aarch64-linux-gnu.so"
    elf = {"aarch64": b"\x7fELF" + bytes(14) + (183).to_bytes(2, "little"),
           "x86_64": b"\x7fELF" + bytes(14) + (62).to_bytes(2, "little")}

    made = iter(range(100))

    def wheel(name: str, modules: list[str], machine: str) -> Path:
        d = tmp_path / str(next(made))
        d.mkdir()
        with zipfile.ZipFile(d / name, "w") as z:
            for m in modules:
                z.writestr(m.removesuffix(".py") + suffix, elf[machine])
        return d

    hot = cross.hot_path()
    good = wheel("edge_gateway-0.1.0-cp311-cp311-linux_aarch64.whl", hot, "aarch64")
    assert cross.check_wheel(good, arm64).parent == good
    for name, modules, machine, says in [
        ("edge_gateway-0.1.0-py3-none-any.whl", [], "aarch64", "is not tagged for arm64"),
        ("edge_gateway-0.1.0-cp311-cp311-linux_x86_64.whl", hot, "x86_64",
         "is not tagged for arm64"),
        ("edge_gateway-0.1.0-cp311-cp311-linux_aarch64.whl", hot[1:], "aarch64",
         f"lacks compiled modules: {hot[0]}"),
        ("edge_gateway-0.1.1-cp311-cp311-linux_aarch64.whl", hot, "x86_64",
         "is not an aarch64 ELF file"),
        ("uvloop-0.21-cp311-cp311-linux_aarch64.whl", hot, "aarch64", "expected our one wheel"),
    ]:
        with pytest.raises(BadInput, match=says):
            cross.check_wheel(wheel(name, modules, machine), arm64)


def test_a_missing_cross_compiler_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(BadInput, match=r"aarch64-linux-gnu-gcc not found: .*"
                                       r"\(apt-get install gcc-aarch64-linux-gnu\)"):
        cross.require_compiler(arch.get("arm64"))
