"""``gatewayctl users``: in process, against a database found the way gatewayd finds it
(a configuration file and GATEWAY_* variables)."""

from __future__ import annotations

import io
import os
import sys
from pathlib import Path

import pytest

from gateway.cli.gatewayctl import main
from gateway.security.scram import verify_password
from gateway.store.db import db_path
from gateway.store.users import UserStore


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for key in [k for k in os.environ if k.startswith("GATEWAY_")]:
        monkeypatch.delenv(key)
    d = tmp_path / "data"
    monkeypatch.setenv("GATEWAY_NODE__DATA_DIR", str(d))
    monkeypatch.setenv("GATEWAY_AUTHENTICATION__BUILTIN_DB__ITERATION_COUNT", "4096")
    return d


def run(capsys: pytest.CaptureFixture[str], *args: str, stdin: str = "") -> tuple[int, str, str]:
    old = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        code = main(list(args))
    finally:
        sys.stdin = old
    out, err = capsys.readouterr()
    return code, out, err


def store(data_dir: Path) -> UserStore:
    return UserStore.open(db_path(data_dir))


def test_add_list_passwd_delete(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "users", "add", "alice", "--password", "pw1")
    assert code == 0 and "'alice' added (4096 iterations)" in out  # from the configuration
    code, out, _ = run(capsys, "users", "add", "root", "--superuser", stdin="pw2\n")
    assert code == 0 and "superuser 'root'" in out
    code, out, _ = run(capsys, "users", "list")
    lines = out.splitlines()
    assert lines[0].split() == ["USER", "SUPERUSER", "ITERATIONS", "RULES", "CREATED", "UPDATED"]
    assert lines[2].split()[:3] == ["alice", "4096", "0"]
    assert lines[3].split()[:3] == ["root", "yes", "4096"]
    user = store(data_dir).get("root")
    assert user and user.is_superuser and verify_password(user.credential, "pw2")
    code, out, _ = run(capsys, "users", "passwd", "alice", "--password-stdin", stdin="new\n")
    assert code == 0
    user = store(data_dir).get("alice")
    assert user and verify_password(user.credential, "new")
    assert run(capsys, "users", "set", "alice", "--superuser")[0] == 0
    assert store(data_dir).get("alice").is_superuser  # type: ignore[union-attr]
    assert run(capsys, "users", "delete", "alice")[0] == 0
    assert store(data_dir).get("alice") is None


def test_errors_are_one_line(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "users", "add", "alice", "--password", "pw")
    code, _, err = run(capsys, "users", "add", "alice", "--password", "pw")
    assert code == 1 and err.strip() == "Error: user 'alice' already exists"
    code, _, err = run(capsys, "users", "delete", "bob")
    assert code == 1 and "no user 'bob'" in err
    code, _, err = run(capsys, "users", "passwd", "bob", "--password", "x")
    assert code == 1 and "no user 'bob'" in err
    code, _, err = run(capsys, "users", "add", "carol", "--password", "x", "--iterations", "10")
    assert code == 2  # usage error: below 4096
    code, _, err = run(capsys, "users", "add", "dave", stdin="\n")
    assert code == 1 and "password is empty" in err
    code, _, err = run(capsys, "users", "allow", "alice", "publish", "a/#/b")
    assert code == 1 and "invalid topic filter" in err
    code, _, err = run(capsys, "users", "allow", "alice", "everything", "a")
    assert code == 2


def test_rules(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run(capsys, "users", "add", "alice", "--password", "pw")
    code, out, _ = run(capsys, "users", "deny", "alice", "publish", "secret/#")
    assert code == 0 and out.startswith("rule 1: deny publish 'secret/#' for 'alice'")
    code, out, _ = run(capsys, "users", "allow", "alice", "all", "alice/${clientid}/#")
    assert code == 0
    code, out, _ = run(capsys, "users", "allow", "remote", "subscribe", "x")
    assert code == 0 and "no local credentials" in out
    code, out, _ = run(capsys, "users", "rules", "alice")
    rows = [line.split() for line in out.splitlines()]
    assert rows[0] == ["ID", "PERMISSION", "ACTION", "TOPIC"]
    assert rows[2:] == [
        ["1", "deny", "publish", "secret/#"],
        ["2", "allow", "all", "alice/${clientid}/#"],
    ]
    assert run(capsys, "users", "unrule", "alice", "1")[0] == 0
    assert run(capsys, "users", "unrule", "alice", "1")[0] == 1
    code, out, _ = run(capsys, "users", "rules", "nobody")
    assert "no rules for 'nobody'" in out
    code, out, _ = run(capsys, "users", "list")
    assert out.splitlines()[2].split()[:3] == ["alice", "4096", "1"]


def test_config_file_locates_the_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for key in [k for k in os.environ if k.startswith("GATEWAY_")]:
        monkeypatch.delenv(key)
    conf = tmp_path / "gw.toml"
    conf.write_text(f'[node]\ndata_dir = "{tmp_path / "elsewhere"}"\n')
    args = ["users", "add", "u", "--password", "p", "--iterations", "4096", "--config", str(conf)]
    code, _, _ = run(capsys, *args)
    assert code == 0
    assert UserStore.open(db_path(tmp_path / "elsewhere")).get("u") is not None
    bad = tmp_path / "bad.toml"
    bad.write_text("[node]\nnmae = 1\n")
    code, _, err = run(capsys, "users", "list", "-c", str(bad))
    assert code == 1 and "invalid configuration" in err and "node.nmae" in err


def test_list_without_database(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "users", "list")
    assert code == 0 and out.startswith("no users in")
    assert not db_path(data_dir).exists()  # listing does not create one
