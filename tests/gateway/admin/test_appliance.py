"""gateway.admin.appliance: the image version and booted slot that ``gatewayctl status``
shows on an edge-gateway image, and nothing elsewhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.admin.appliance import image_info
from gateway.cli.ctl import status as status_cmd
from tests.harness.status import status_view


def write(tmp_path: Path, os_release: str, cmdline: str) -> tuple[Path, Path]:
    (tmp_path / "os-release").write_text(os_release)
    (tmp_path / "cmdline").write_text(cmdline)
    return tmp_path / "os-release", tmp_path / "cmdline"


def test_on_an_image_version_and_slot(tmp_path: Path) -> None:
    paths = write(tmp_path, 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nID=debian\n'
                  'IMAGE_ID=edge-gateway\nIMAGE_VERSION="1.2.3-rc1"\n',
                  "root=PARTLABEL=rootB rauc.slot=B ro console=ttyS0\n")
    assert image_info(*paths) == {"version": "1.2.3-rc1", "slot": "B"}


def test_not_an_image(tmp_path: Path) -> None:
    paths = write(tmp_path, "ID=debian\nVERSION_ID=12\n", "root=/dev/sda1 ro\n")
    assert image_info(*paths) is None
    assert image_info(tmp_path / "missing", tmp_path / "missing") is None


def test_image_without_slot_on_cmdline(tmp_path: Path) -> None:
    paths = write(tmp_path, "IMAGE_ID=edge-gateway\nIMAGE_VERSION=7\n", "ro quiet\n")
    assert image_info(*paths) == {"version": "7", "slot": "unknown"}


def test_status_renders_the_image_row(capsys: pytest.CaptureFixture[str]) -> None:
    data = status_view(image={"version": "9.9", "slot": "A"})
    status_cmd.render(data)
    assert "edge-gateway 9.9 (slot A)" in capsys.readouterr().out
    data["image"] = None
    status_cmd.render(data)
    assert "edge-gateway" not in capsys.readouterr().out
