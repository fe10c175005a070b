"""``gatewayctl ban``: add, delete, list, against the database gatewayd would use."""

from __future__ import annotations

import json
import time

import pytest

from gateway.cli.gatewayctl import main
from gateway.store.banned import BannedStore
from gateway.store.db import db_path


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    d = tmp_path / "data"
    monkeypatch.setenv("GATEWAY_NODE__DATA_DIR", str(d))
    return d


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["ban", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_add_list_delete(data_dir, capsys) -> None:
    assert run(capsys, "add", "clientid", "c1", "--reason", "spam")[0] == 0
    code, out, _ = run(capsys, "add", "cidr", "10.1.2.3/8", "--duration", "2h")
    assert code == 0 and "banned cidr 10.0.0.0/8 until 20" in out
    code, out, _ = run(capsys, "list")
    lines = out.splitlines()
    assert lines[0].split() == ["KIND", "VALUE", "UNTIL", "BY", "REASON"]
    assert lines[1].startswith("cidr") and "10.0.0.0/8" in lines[1]
    assert lines[2].split() == ["clientid", "c1", "never", "gatewayctl", "spam"]
    code, out, _ = run(capsys, "list", "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert {r["value"] for r in rows} == {"10.0.0.0/8", "c1"}
    assert rows[0]["until"] == pytest.approx(time.time() + 7200, abs=60)
    assert run(capsys, "delete", "clientid", "c1") == (0, "unbanned clientid c1\n", "")
    code, _, err = run(capsys, "delete", "clientid", "c1")
    assert code == 1 and "no ban on clientid c1" in err
    store = BannedStore.open(db_path(data_dir))
    assert [b.value for b in store.active()] == ["10.0.0.0/8"]
    store.close()


def test_config_file_names_the_database(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("GATEWAY_NODE__DATA_DIR", raising=False)
    conf = tmp_path / "gateway.toml"
    conf.write_text(f'[node]\ndata_dir = "{tmp_path / "elsewhere"}"\n')
    assert run(capsys, "--config", str(conf), "add", "username", "bob")[0] == 0
    store = BannedStore.open(db_path(tmp_path / "elsewhere"))
    assert [(b.kind, b.value) for b in store.active()] == [("username", "bob")]
    store.close()


def test_until_and_expired_listing(data_dir, capsys) -> None:
    soon = time.time() + 3600
    assert run(capsys, "add", "peerhost", "::1", "--until", str(soon))[0] == 0
    store = BannedStore.open(db_path(data_dir))
    store.add("clientid", "old", expires_at=time.time() - 1)
    store.close()
    assert "old" not in run(capsys, "list")[1]
    assert "old" in run(capsys, "list", "--all")[1]
    assert run(capsys, "add", "clientid", "x", "--until", "2030-01-31T12:00")[0] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["add", "peerhost", "not-an-ip"], "not an IP address"),
        (["add", "cidr", "10.0.0.0/99"], "not an address or CIDR"),
        (["add", "clientid", "x", "--duration", "soon"], "expected a duration"),
        (["add", "clientid", "x", "--duration", "1h", "--until", "2999-01-01"], "not both"),
        (["add", "clientid", "x", "--until", "1999-01-01"], "in the past"),
        (["add", "clientid", "x", "--until", "tomorrow"], "ISO 8601"),
        (["add", "address", "x"], "Invalid value"),
    ],
)
def test_errors_are_one_line(data_dir, capsys, args, message) -> None:
    code, _, err = run(capsys, *args)
    assert code != 0 and message in err, err


def test_invalid_configuration(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("GATEWAY_MQTT__MAX_INFLIGHT", "0")
    code, _, err = run(capsys, "list")
    assert code == 1 and "invalid configuration: mqtt.max_inflight" in err


def test_empty_list(data_dir, capsys) -> None:
    assert run(capsys, "list") == (0, "no bans\n", "")
