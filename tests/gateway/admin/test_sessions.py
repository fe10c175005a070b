"""Accounts, the setup token, sessions and the login limit, on a virtual clock."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gateway.admin.sessions import (
    AccountError,
    Accounts,
    LoginLimiter,
    Sessions,
    SetupToken,
    check_new_password,
    check_password,
    hash_password,
)
from tests.harness.clock import Clock


def test_password_hash_checks_and_refuses() -> None:
    stored = hash_password("correct horse")
    assert stored.startswith("scrypt$") and "correct horse" not in stored
    assert check_password("correct horse", stored)
    assert not check_password("correct hors", stored)
    assert not check_password("x", "garbage")
    with pytest.raises(AccountError, match="8 characters"):
        check_new_password("short")


def test_accounts_file_is_private_and_keeps_the_last_administrator(tmp_path: Path) -> None:
    accounts = Accounts.in_dir(tmp_path)
    assert not accounts.has_administrator()
    accounts.add("root", hash_password("password1"), "administrator")
    accounts.add("eve", hash_password("password2"), "viewer")
    path = tmp_path / "dashboard.json"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert "password1" not in path.read_text()
    again = Accounts.in_dir(tmp_path)
    assert again.list() == [{"username": "eve", "role": "viewer"},
                            {"username": "root", "role": "administrator"}]
    with pytest.raises(AccountError, match="last administrator"):
        again.delete("root")
    with pytest.raises(AccountError, match="role"):
        again.add("bob", hash_password("password3"), "root")
    with pytest.raises(AccountError, match="user name"):
        again.add("bad name", hash_password("password3"), "viewer")
    assert again.delete("eve") and not again.delete("eve")
    assert json.loads(path.read_text())["users"].keys() == {"root"}


def test_setup_token_is_single_use_replaced_and_expires() -> None:
    clock = Clock(1000.0)
    setup = SetupToken(clock, ttl=60)
    first = setup.issue()
    second = setup.issue()  # replaces the first
    assert not setup.consume(first)
    assert setup.consume(second)
    assert not setup.consume(second)  # spent
    third = setup.issue()
    clock.t += 60
    assert not setup.pending and not setup.consume(third)  # expired


def test_sessions_expire_when_idle_and_at_their_maximum_age() -> None:
    clock = Clock(1000.0)
    sessions = Sessions(clock, idle=30, max_age=100)
    s = sessions.create("root", "administrator")
    assert s.csrf and s.csrf != s.id
    for _ in range(3):  # used every 25 s: idle never reached
        clock.t += 25
        assert sessions.get(s.id) is s
    clock.t += 25  # 100 s after the login
    assert sessions.get(s.id) is None
    idle = sessions.create("root", "administrator")
    clock.t += 30
    assert sessions.get(idle.id) is None
    assert sessions.get("made-up") is None and sessions.get(None) is None
    other = sessions.create("eve", "viewer")
    sessions.end_user("eve")
    assert sessions.get(other.id) is None


def test_login_limiter_locks_out_until_the_window_passes() -> None:
    clock = Clock(1000.0)
    limiter = LoginLimiter(clock, attempts=3, window=60)
    for _ in range(3):
        assert limiter.retry_after("ip:a", "user:root") == 0
        limiter.failed("ip:a", "user:root")
        clock.t += 1
    assert limiter.retry_after("ip:a") == pytest.approx(57)
    assert limiter.retry_after("ip:b", "user:root") == pytest.approx(57)  # the name too
    assert limiter.retry_after("ip:b", "user:eve") == 0
    clock.t += 57
    assert limiter.retry_after("ip:a", "user:root") == 0
    limiter.failed("ip:a")
    limiter.succeeded("ip:a")
    assert limiter.retry_after("ip:a") == 0


def test_accounts_see_what_another_process_wrote(tmp_path: Path) -> None:
    mine, other = Accounts.in_dir(tmp_path), Accounts.in_dir(tmp_path)
    assert not mine.has_administrator()
    other.add("root", hash_password("password1"), "administrator")
    assert mine.has_administrator() and mine.get("root") is not None
