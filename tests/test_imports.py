"""What may import what: no import cycle between modules (scripts/import_cycles.py) and
the import-linter contracts of pyproject.toml (protocols/ never imports gateway/, the
core imports no I/O, no cycle between sibling sub-packages).

Each checker also runs on a copy of the tree with one bad import added, and must fail
there naming the problem: a checker that cannot fail proves nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CYCLES = ROOT / "scripts" / "import_cycles.py"


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(root)
    return env


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    lint = Path(sys.executable).parent / "lint-imports"
    return subprocess.run(
        [str(lint), str(root / "pyproject.toml"), "--no-cache", "--no-logo"],
        cwd=root, env=_env(root), capture_output=True, text=True, timeout=120, check=False,
    )


def _cycles(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(CYCLES), str(root)],
        env=_env(root), capture_output=True, text=True, timeout=120, check=False,
    )


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gateway/, protocols/ and pyproject.toml, copied (each test edits its own copy of
    one file and restores it)."""
    root = tmp_path_factory.mktemp("tree")
    for name in ("gateway", "protocols"):
        shutil.copytree(ROOT / name, root / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def test_no_module_import_cycle() -> None:
    r = _cycles(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr


def test_import_contracts_kept() -> None:
    r = _lint_imports(ROOT)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout, r.stdout


def _with_line(path: Path, line: str) -> str:
    before = path.read_text()
    path.write_text(before + f"\n{line}\n")
    return before


BAD_IMPORTS = {
    # gateway.app imports gateway.admin.registry: a cycle of modules and of packages
    "gateway/admin/registry.py": ("import gateway.app  # noqa", "no import cycles"),
    "protocols/mqtt/packets.py": ("import gateway.core.metrics  # noqa",
                                  "protocols/ never imports gateway/"),
    "gateway/core/metrics.py": ("import socket  # noqa", "the broker core does no I/O"),
}


def test_contracts_fail_on_bad_imports(copy: Path) -> None:
    """One bad import per contract, all in one run (each contract must report its own)."""
    saved = {m: _with_line(copy / m, line) for m, (line, _) in BAD_IMPORTS.items()}
    try:
        r = _lint_imports(copy)
    finally:
        for m, text in saved.items():
            (copy / m).write_text(text)
    assert r.returncode != 0, r.stdout
    assert "3 broken" in r.stdout, r.stdout
    broken_part = " ".join(r.stdout.split("Broken contracts", 1)[-1].split())
    for _, contract in BAD_IMPORTS.values():
        assert contract in broken_part, (contract, r.stdout)
    assert ".admin -> .app" in broken_part, r.stdout  # the edge that makes the cycle
    assert "gateway.core.metrics -> socket" in broken_part, r.stdout


def test_cycle_checker_fails_on_a_cycle(copy: Path) -> None:
    path = copy / "gateway" / "admin" / "registry.py"
    before = _with_line(path, "if False:\n    import gateway.app  # noqa")
    try:
        r = _cycles(copy)
    finally:
        path.write_text(before)
    assert r.returncode == 1, r.stdout + r.stderr
    (line,) = [ln for ln in r.stdout.splitlines() if "gateway.app" in ln]
    assert line.startswith("import cycle: ") and "gateway.admin.registry" in line, line
