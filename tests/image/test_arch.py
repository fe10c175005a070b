"""What differs per arch, without building: kernel flavours (--kernel), the serial
console on the kernel command line, and the binfmt_misc check a foreign-arch build makes
first (against a fake binfmt_misc directory). Fast, no root."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from edge_image import arch, layout
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
