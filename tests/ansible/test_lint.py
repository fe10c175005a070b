"""ansible-lint (production profile) and ansible-playbook --syntax-check over ansible/,
and proof that the lint fails on a role that breaks its rules."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.ansible.harness import ANSIBLE, environ, tool

pytestmark = [pytest.mark.ansible, pytest.mark.slow, pytest.mark.timeout(600)]


def lint(where: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tool("ansible-lint")), "--profile", "production", "--offline",
                           "--nocolor"], cwd=where, env=environ(), capture_output=True,
                          text=True, timeout=500)


def test_syntax_check() -> None:
    for play in ("site.yml", "upgrade.yml"):
        r = subprocess.run([str(tool("ansible-playbook")), "--syntax-check", play],
                           cwd=ANSIBLE, env=environ(), capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr


def test_lint_production_profile_passes() -> None:
    r = lint(ANSIBLE)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    assert "Passed" in r.stdout + r.stderr


def test_lint_fails_on_a_role_breaking_the_rules(tmp_path: Path) -> None:
    copy = tmp_path / "ansible"
    shutil.copytree(ANSIBLE, copy, ignore=shutil.ignore_patterns("pki", ".ansible"))
    shutil.copytree(ANSIBLE.parent / "systemd", tmp_path / "systemd")
    tasks = copy / "roles/tuning/tasks/main.yml"
    # a short module name, a variable without the role's prefix, a handler by hand
    tasks.write_text(tasks.read_text() + """
- name: Restart by hand
  command: systemctl restart gatewayd
  when: something.changed
- name: Unprefixed variable
  ansible.builtin.set_fact:
    profile_in_use: edge
""")
    r = lint(copy)
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    for rule in ("fqcn", "no-handler", "var-naming"):
        assert rule in out, out[-4000:]
