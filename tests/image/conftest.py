"""The image test group's shared artefacts: an SSH key, and (re-exported from
tests/image_build.py) what the session fixture ``built`` of tests/conftest.py returns: one
image build per run, shared with tests/hil, cached outside the work tree."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import tests.image.vm  # noqa: F401  (puts image/ on sys.path: edge_image for every test)
from tests.image_build import BOOT_TRIES, VERSION, Built, image_cache, skip_unless_possible

__all__ = ["BOOT_TRIES", "VERSION", "Built", "image_cache", "skip_unless_possible"]


@pytest.fixture(scope="session")
def ssh_key(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("ssh")
    key = d / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    yield key
