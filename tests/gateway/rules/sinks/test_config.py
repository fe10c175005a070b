"""``gatewayd --check`` on connector and sink settings: exit 2, one line naming the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.gatewayd import clean_environ

GOOD = """
[connectors.postgresql.pg]
server = "127.0.0.1:5432"
database = "iot"
[connectors.redis.rd]
server = "127.0.0.1"
[connectors.rabbitmq.mq]
server = "127.0.0.1:5672"
[connectors.influxdb.ix]
server = "127.0.0.1:8086"
database = "db"

[rule_engine.rules.r1]
sql = 'SELECT clientid, payload.v AS v FROM "t/#"'
[[rule_engine.rules.r1.actions]]
function = "postgresql:pg"
args = { sql = "INSERT INTO t(c, v) VALUES (${clientid}, ${v})" }
[[rule_engine.rules.r1.actions]]
function = "redis:rd"
args = { command = "LPUSH l ${v}" }
[[rule_engine.rules.r1.actions]]
function = "rabbitmq:mq"
args = { exchange = "ex", routing_key = "k.${clientid}" }
[[rule_engine.rules.r1.actions]]
function = "influxdb:ix"
args = { write_syntax = "m,c=${clientid} v=${v}" }
"""


def check(tmp_path: Path, text: str, **env: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "gateway.toml"
    cfg.write_text(text)
    return subprocess.run([sys.executable, "-m", "gateway.cli.gatewayd", "--check", "-c",
                           str(cfg)], capture_output=True, text=True, timeout=60,
                          env={**clean_environ(), **env})


def test_a_good_configuration_passes(tmp_path: Path) -> None:
    r = check(tmp_path, GOOD)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(("change", "key"), [
    (('server = "127.0.0.1:5432"', 'server = "127.0.0.1:99999"'),
     "connectors.postgresql.pg.server"),
    (('database = "iot"\n', ""), "connectors.postgresql.pg.database"),
    (('[connectors.redis.rd]\n', '[connectors.redis.rd]\nbogus = 1\n'),
     "connectors.redis.rd.bogus"),
    (('function = "redis:rd"', 'function = "redis:nope"'), "no [connectors.redis.nope]"),
    (("VALUES (${clientid}, ${v})", "VALUES ('a${clientid}', ${v})"),
     "rule_engine.rules.r1.actions[0]"),
    (('routing_key = "k.${clientid}"', 'routing_key = ""'), "rule_engine.rules.r1.actions[2]"),
    (('v=${v}"', 'v="'), "rule_engine.rules.r1.actions[3]"),
])
def test_bad_settings_exit_2_naming_the_key(tmp_path: Path, change: tuple[str, str],
                                           key: str) -> None:
    assert change[0] in GOOD
    r = check(tmp_path, GOOD.replace(change[0], change[1], 1))
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and key in lines[0], lines


def test_the_password_can_come_from_the_environment(tmp_path: Path) -> None:
    r = check(tmp_path, GOOD, GATEWAY_CONNECTORS__POSTGRESQL__PG__PASSWORD="s3cret")
    assert r.returncode == 0, r.stderr
    assert "s3cret" not in r.stdout + r.stderr


def test_the_worked_examples_of_the_doc_pass_check(tmp_path: Path) -> None:
    import re

    doc = (Path(__file__).resolve().parents[4] / "docs" / "integrations.md").read_text()
    examples = doc[doc.index("## Worked examples"):doc.index("## Kafka and Pulsar")]
    blocks = re.findall(r"```toml\n(.*?)```", examples, re.S)
    assert len(blocks) == 4
    r = check(tmp_path, "\n".join(blocks))
    assert r.returncode == 0, r.stderr
