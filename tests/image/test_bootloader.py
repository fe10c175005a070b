"""The RAUC custom boot loader backend (image/rootfs/usr/lib/edge-gateway/rauc-bootloader)
against a directory standing in for the ESP, with systemd-boot's renames simulated:
which slot is primary, the try counter a fresh slot gets, good/bad states, and that it
writes the same entry text as image/build (edge_image.layout.entry). Fast: no VM."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from edge_image import layout
from tests.image.vm import REPO

HANDLER = REPO / "image/rootfs/usr/lib/edge-gateway/rauc-bootloader"


@pytest.fixture
def esp(tmp_path: Path) -> Path:
    entries = tmp_path / "loader/entries"
    entries.mkdir(parents=True)
    (entries / "slot-a.conf").write_text(layout.entry("A", 1))  # as image/build writes it
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "boot-tries").write_text("3\n")
    (lib / "kernel-cmdline").write_text(layout.kernel_cmdline() + "\n")
    return tmp_path


def handler(esp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAUC_ESP": str(esp), "EDGE_GATEWAY_LIB": str(esp / "lib")}
    return subprocess.run(["sh", str(HANDLER), *args], capture_output=True, text=True,
                          env=env, timeout=30)


def ok(esp: Path, *args: str) -> str:
    r = handler(esp, *args)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def entries(esp: Path) -> list[str]:
    return sorted(p.name for p in (esp / "loader/entries").iterdir())


def boot_attempt(esp: Path, name: str) -> str:
    """What systemd-boot does before starting a counted entry: +N-M -> +(N-1)-(M+1)."""
    stem = name.removesuffix(".conf")
    base, _, counter = stem.partition("+")
    left, _, done = counter.partition("-")
    new = f"{base}+{int(left) - 1}-{int(done or 0) + 1}.conf"
    (esp / "loader/entries" / name).rename(esp / "loader/entries" / new)
    return new


def test_install_then_boot_counting_then_bless(esp: Path) -> None:
    assert ok(esp, "get-primary") == "A"
    assert ok(esp, "get-state", "A") == "good"
    assert ok(esp, "get-state", "B") == "bad"  # never installed
    ok(esp, "set-state", "B", "bad")           # RAUC before writing B: no entry, no-op
    ok(esp, "set-primary", "B")
    assert entries(esp) == ["slot-a.conf", "slot-b+3.conf"]
    assert ok(esp, "get-primary") == "B"
    b = (esp / "loader/entries/slot-b+3.conf").read_text()
    assert b == layout.entry("B", 1)
    assert (esp / "loader/entries/slot-a.conf").read_text() == layout.entry("A", 2)
    name = boot_attempt(esp, "slot-b+3.conf")
    assert ok(esp, "get-state", "B") == "good"  # tries left: still a candidate
    ok(esp, "set-state", "B", "good")            # gateway-health -> rauc status mark-good
    assert entries(esp) == ["slot-a.conf", "slot-b.conf"], name


def test_exhausted_slot_is_bad(esp: Path) -> None:
    ok(esp, "set-primary", "B")
    name = "slot-b+3.conf"
    for _ in range(3):
        name = boot_attempt(esp, name)
    assert name == "slot-b+0-3.conf"
    assert ok(esp, "get-state", "B") == "bad"
    assert ok(esp, "get-state", "A") == "good"
    ok(esp, "set-state", "B", "bad")
    assert entries(esp) == ["slot-a.conf", "slot-b+0.conf"]


def test_bad_arguments_exit_2(esp: Path) -> None:
    assert handler(esp, "set-primary", "C").returncode == 2
    assert handler(esp, "set-state", "A", "maybe").returncode == 2
    assert handler(esp, "frobnicate").returncode == 2
