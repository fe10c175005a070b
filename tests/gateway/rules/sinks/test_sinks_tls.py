"""TLS to the sink servers: PostgreSQL (``ssl = on``) and Redis (``--tls-port``) with the
server's certificate verified against the CA; a connector that trusts another CA does not
connect, says why, and keeps its items buffered."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.security.pki import init_ca
from tests.gateway.admin.gatewayd import Client, Gatewayd
from tests.gateway.rules.sinks.servers import PgServer, RedisServer

API = "/api/v5"
pytestmark = [pytest.mark.sinks, pytest.mark.slow]


def env_for(pg: PgServer, rd: RedisServer, other_ca: Path) -> dict[str, str]:
    c = "GATEWAY_CONNECTORS__"
    r = "GATEWAY_RULE_ENGINE__RULES__"
    env = {
        f"{c}POSTGRESQL__PGS__SERVER": f"127.0.0.1:{pg.port}",
        f"{c}POSTGRESQL__PGS__DATABASE": pg.database,
        f"{c}POSTGRESQL__PGS__USERNAME": "gateway",
        f"{c}POSTGRESQL__PGS__PASSWORD": pg.password,
        f"{c}POSTGRESQL__PGS__TLS__ENABLE": "true",
        f"{c}POSTGRESQL__PGS__TLS__CACERTFILE": str(pg.pki / "ca.crt"),
        f"{c}REDIS__RDS__SERVER": f"127.0.0.1:{rd.tls_port}",
        f"{c}REDIS__RDS__PASSWORD": rd.password,
        f"{c}REDIS__RDS__TLS__ENABLE": "true",
        f"{c}REDIS__RDS__TLS__CACERTFILE": str(rd.pki / "ca.crt"),
        f"{c}REDIS__WRONGCA__SERVER": f"127.0.0.1:{rd.tls_port}",
        f"{c}REDIS__WRONGCA__PASSWORD": rd.password,
        f"{c}REDIS__WRONGCA__TLS__ENABLE": "true",
        f"{c}REDIS__WRONGCA__TLS__CACERTFILE": str(other_ca),
        f"{r}TLS_PG__SQL": "SELECT concat('tls/', payload.n) AS mid, clientid, payload.n AS n "
                           'FROM "tls/#"',
        f"{r}TLS_PG__ACTIONS": '[{function = "postgresql:pgs", args = {sql = "INSERT INTO '
                              "readings(msgid, clientid, n) VALUES (${mid}, ${clientid}, "
                              '${n})"}}, {function = "redis:rds", args = {command = '
                              '"RPUSH tls:${clientid} ${n}"}}, {function = "redis:wrongca", '
                              'args = {command = "RPUSH never ${n}"}}]',
    }
    for p in ("POSTGRESQL__PGS", "REDIS__RDS", "REDIS__WRONGCA"):
        env[f"{c}{p}__RETRY_INTERVAL"] = "100ms"
        env[f"{c}{p}__MAX_RETRY_INTERVAL"] = "500ms"
    return env


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, pg: PgServer,
       redis_server: RedisServer) -> Iterator[Gatewayd]:
    work = tmp_path_factory.mktemp("sinks-tls")
    other = init_ca(work / "other-ca", common_name="not the servers' CA").cert_path
    g = Gatewayd(work, env_for(pg, redis_server, other))
    g.start()
    yield g
    g.stop()


def connectors(gw: Gatewayd) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in gw.get(f"{API}/connectors")["data"]}


def test_tls_connectors_verify_the_server(gw: Gatewayd, pg: PgServer,
                                          redis_server: RedisServer) -> None:
    c = Client(gw, "dev-tls")
    try:
        for n in range(3):
            c.publish("tls/a", json.dumps({"n": n}), 1)
    finally:
        c.close()
    deadline = time.monotonic() + 60
    while True:
        got = connectors(gw)
        if got["postgresql:pgs"]["success"] == 3 and got["redis:rds"]["success"] == 3 \
                and got["redis:wrongca"]["last_error"]:
            break
        assert time.monotonic() < deadline, got
        time.sleep(0.1)  # bounded poll of the node's counters
    rows = pg.psql("SELECT n FROM readings WHERE clientid = 'dev-tls' ORDER BY seq",
                   pg.database).split()
    assert rows == ["0", "1", "2"]
    # the server saw TLS connections from gatewayd
    assert pg.psql("SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) "
                   "WHERE s.ssl AND a.application_name = 'gatewayd:pgs'").strip() == "1"
    assert redis_server.cli("LRANGE", "tls:dev-tls", "0", "-1").split() == ["0", "1", "2"]
    w = got["redis:wrongca"]
    assert w["status"] != "connected" and w["buffer"]["depth"] == 3
    assert "certificate" in w["last_error"].lower(), w["last_error"]
