"""Running the playbooks of ansible/ from tests: the venv's ansible-playbook with
ansible/ansible.cfg, output captured, the PLAY RECAP parsed.

The wheelhouse (``scripts/wheelhouse``) is built once per content of the sources it
packs and cached outside the work tree (``tests.nspawn.cache_dir()``): rebuilding the
systemd-python wheel takes a minute on CI.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.nspawn import cache_dir

REPO = Path(__file__).resolve().parents[2]
ANSIBLE = REPO / "ansible"
BIN = Path(sys.executable).parent
_RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)",
                    re.MULTILINE)


def tool(name: str) -> Path:
    path = BIN / name
    if not path.exists():
        found = shutil.which(name)
        if found is None:
            pytest.skip(f"{name} not installed (pip install ansible ansible-lint: the test extra)")
        return Path(found)
    return path


def environ() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANSIBLE_", "GATEWAY_"))}
    env.update(ANSIBLE_CONFIG=str(ANSIBLE / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_HOST_KEY_CHECKING="0",
               ANSIBLE_LOCAL_TEMP=str(cache_dir() / "ansible-tmp"),
               PATH=f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    return env


@dataclass
class Run:
    returncode: int
    output: str
    seconds: float

    def recap(self) -> dict[str, dict[str, int]]:
        return {m[1]: {"ok": int(m[2]), "changed": int(m[3]), "unreachable": int(m[4]),
                       "failed": int(m[5])} for m in _RECAP.finditer(self.output)}

    def changed(self) -> dict[str, int]:
        return {host: r["changed"] for host, r in self.recap().items()}


def playbook(inventory: Path, play: str, *args: str, timeout: float = 900) -> Run:
    start = time.monotonic()
    r = subprocess.run([str(tool("ansible-playbook")), "-i", str(inventory), play, *args],
                       cwd=ANSIBLE, env=environ(), capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    return Run(r.returncode, r.stdout + r.stderr, time.monotonic() - start)


def _sources_key() -> str:
    digest = hashlib.sha256()
    files = [REPO / "pyproject.toml", REPO / "setup.py", REPO / "mypyc.ini",
             REPO / "scripts/wheelhouse",
             *sorted((REPO / "gateway").rglob("*.py")), *sorted((REPO / "protocols").rglob("*.py"))]
    for path in files:
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def wheelhouse() -> Path:
    """``scripts/wheelhouse`` output for this checkout (cached by a hash of its sources)."""
    final = cache_dir() / f"wheelhouse-{_sources_key()}"
    if (final / "requirements.txt").exists():
        return final
    building = final.with_name(final.name + f".tmp{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    r = subprocess.run([str(REPO / "scripts/wheelhouse"), str(building), "--python",
                        "/usr/bin/python3"], capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    building.rename(final)
    return final
