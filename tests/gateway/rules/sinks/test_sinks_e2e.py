"""The four sinks end to end: a real gatewayd, paho publishers, and real PostgreSQL, Redis,
RabbitMQ and InfluxDB servers (session fixtures, conftest.py).

Rows, keys, messages and points arrive with the right values (a hostile payload stays a
value); a refused row is counted and does not block the rows behind it; the servers down
and back, then down again with ``kill -9`` of gatewayd, lose nothing and duplicate
nothing; a full buffer refuses, counts and alarms; health shows in the API, in
``gatewayctl status`` and in Prometheus."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import redis

from tests.gateway.admin.gatewayd import WAIT, Client, Gatewayd, clean_environ, free_port
from tests.gateway.rules.sinks.servers import InfluxServer, PgServer, RabbitServer, RedisServer

API = "/api/v5"
pytestmark = [pytest.mark.sinks, pytest.mark.slow]

HOSTILE = "x'); DROP TABLE readings; -- $1 %s \\ \" ,= \n${clientid} é"


def env_for(pg: PgServer, rd: RedisServer, mq: RabbitServer, ix: InfluxServer,
            dead_port: int) -> dict[str, str]:
    c = "GATEWAY_CONNECTORS__"
    r = "GATEWAY_RULE_ENGINE__RULES__"
    # health checks seldom (but for InfluxDB): a server that goes away is found by the
    # next delivery, whose batch must then go back to the buffer
    fast = {"RETRY_INTERVAL": "100ms", "MAX_RETRY_INTERVAL": "500ms",
            "HEALTH_CHECK_INTERVAL": "120s", "CONNECT_TIMEOUT": "3s", "REQUEST_TIMEOUT": "5s"}
    env: dict[str, str] = {}
    for prefix in ("POSTGRESQL__PG", "REDIS__RD", "RABBITMQ__MQ", "INFLUXDB__IX", "REDIS__TINY"):
        for k, v in fast.items():
            env[f"{c}{prefix}__{k}"] = v
    env.update({
        f"{c}POSTGRESQL__PG__SERVER": f"127.0.0.1:{pg.port}",
        f"{c}POSTGRESQL__PG__DATABASE": pg.database,
        f"{c}POSTGRESQL__PG__USERNAME": "gateway",
        f"{c}POSTGRESQL__PG__PASSWORD": pg.password,  # the credential from the environment
        f"{c}REDIS__RD__SERVER": f"127.0.0.1:{rd.port}",
        f"{c}REDIS__RD__PASSWORD": rd.password,
        f"{c}RABBITMQ__MQ__SERVER": f"127.0.0.1:{mq.port}",
        f"{c}INFLUXDB__IX__SERVER": f"127.0.0.1:{ix.port}",
        f"{c}INFLUXDB__IX__DATABASE": ix.database,
        f"{c}INFLUXDB__IX__HEALTH_CHECK_INTERVAL": "1s",
        f"{c}REDIS__TINY__SERVER": f"127.0.0.1:{dead_port}",
        f"{c}REDIS__TINY__BUFFER__MAX_BYTES": "1KB",
        f"{r}TO_PG__SQL": "SELECT concat(clientid, '/', payload.n) AS mid, clientid, topic, "
                          'payload.t AS t, payload.n AS n, payload.note AS note, payload '
                          'FROM "pg/#"',
        f"{r}TO_PG__ACTIONS": "[{function = \"postgresql:pg\", args = {sql = \"INSERT INTO "
                              "readings(msgid, clientid, topic, t, n, note, payload) VALUES "
                              "(${mid}, ${clientid}, '${topic}', ${t}, ${n}, ${note}, "
                              "${payload}) ON CONFLICT (msgid) DO NOTHING\"}}]",
        f"{r}TO_RD__SQL": 'SELECT clientid, payload.n AS n, payload.note AS note FROM "rd/#"',
        f"{r}TO_RD__ACTIONS": '[{function = "redis:rd", args = {command = '
                              '"HSET dev:${clientid} n ${n} note ${note}"}}, '
                              '{function = "redis:rd", args = {command = '
                              '"RPUSH log:${clientid} ${n}"}}]',
        f"{r}RD_BAD__SQL": 'SELECT clientid FROM "rdbad/#"',
        f"{r}RD_BAD__ACTIONS": '[{function = "redis:rd", args = {command = '
                               '"INCR dev:${clientid}"}}]',
        f"{r}TO_MQ__SQL": 'SELECT payload.n AS n, clientid, payload.note AS note FROM "mq/#"',
        f"{r}TO_MQ__ACTIONS": '[{function = "rabbitmq:mq", args = {exchange = "sinks", '
                              'routing_key = "dev.${clientid}"}}]',
        f"{r}MQ_BAD__SQL": 'SELECT clientid FROM "mqbad/#"',
        f"{r}MQ_BAD__ACTIONS": '[{function = "rabbitmq:mq", args = {exchange = "", '
                               'routing_key = "no-such-queue", mandatory = true}}]',
        f"{r}TO_IX__SQL": 'SELECT payload.t AS t, payload.n AS n, clientid, '
                          'payload.note AS note, payload.ts AS ts FROM "ix/#"',
        f"{r}TO_IX__ACTIONS": '[{function = "influxdb:ix", args = {write_syntax = '
                              '"temp,client=${clientid},note=${note} t=${t},n=${n}i,'
                              'text=${note} ${ts}"}}]',
        f"{r}TO_TINY__SQL": 'SELECT payload.n AS n FROM "tiny/#"',
        f"{r}TO_TINY__ACTIONS": '[{function = "redis:tiny", args = {command = "SET k ${n}"}}]',
    })
    return env


@pytest.fixture(scope="module")
def servers(pg: PgServer, redis_server: RedisServer, rabbit: RabbitServer,
            influx: InfluxServer) -> tuple[PgServer, RedisServer, RabbitServer, InfluxServer]:
    return pg, redis_server, rabbit, influx


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory, servers: Any) -> Iterator[Gatewayd]:
    g = Gatewayd(tmp_path_factory.mktemp("sinks"), env_for(*servers, free_port()))
    g.start()
    yield g
    g.stop()


# -- reading back ------------------------------------------------------------------------


def connectors(gw: Gatewayd) -> dict[str, dict[str, Any]]:
    return {c["id"]: c for c in gw.get(f"{API}/connectors")["data"]}


def wait_until(gw: Gatewayd, pred: Callable[[dict[str, dict[str, Any]]], bool], what: str,
               timeout: float = 60.0) -> dict[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        c = connectors(gw)
        if pred(c):
            return c
        assert time.monotonic() < deadline, f"{what}: {json.dumps(c, indent=1)}"
        time.sleep(0.1)  # bounded poll of the node's counters


def drained(c: dict[str, dict[str, Any]]) -> bool:
    return all(c[s]["buffer"]["depth"] == 0 for s in ("postgresql:pg", "redis:rd",
                                                       "rabbitmq:mq", "influxdb:ix"))


def pg_rows(pg: PgServer, clientid: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg.dsn()) as conn:
        return conn.execute("SELECT n, t, note, topic, payload FROM readings WHERE clientid=%s "
                            "ORDER BY seq", (clientid,)).fetchall()


def rd(r: RedisServer) -> redis.Redis:
    return redis.Redis(port=r.port, password=r.password, decode_responses=True)


async def _drain_queue(url: str) -> list[tuple[str, bool, bytes]]:
    import aio_pika

    conn = await aio_pika.connect(url)
    out = []
    async with conn:
        ch = await conn.channel()
        q = await ch.get_queue("q_all", ensure=False)
        while True:
            m = await q.get(no_ack=True, fail=False)
            if m is None:
                return out
            out.append((m.routing_key or "", m.delivery_mode == 2, m.body))


def mq_messages(mq: RabbitServer) -> list[tuple[str, bool, bytes]]:
    return asyncio.run(_drain_queue(mq.url()))


def ix_points(ix: InfluxServer, client: str) -> list[dict[str, Any]]:
    r = ix.query(f"SELECT * FROM temp WHERE client = '{client}'", ix.database)
    series = r["results"][0].get("series") or []
    if not series:
        return []
    cols = series[0]["columns"]
    return [dict(zip(cols, v, strict=True)) for v in series[0]["values"]]


def publish(gw: Gatewayd, cid: str, topic: str, payloads: list[dict[str, Any]]) -> None:
    c = Client(gw, cid)
    try:
        for p in payloads:
            c.publish(topic, json.dumps(p), 1)
    finally:
        c.close()


# -- the tests ---------------------------------------------------------------------------


def test_rows_keys_messages_and_points_arrive_with_their_values(gw: Gatewayd,
                                                                servers: Any) -> None:
    pg, r, mq, ix = servers
    mq_messages(mq)  # empty the queue
    payloads = [{"t": 20.5 + n, "n": n, "note": f"note {n}", "ts": 1_700_000_000_000 + n}
                for n in range(5)]
    payloads.append({"t": 1.0, "n": 5, "note": HOSTILE, "ts": 1_700_000_000_005})
    for prefix in ("pg", "rd", "mq", "ix"):
        publish(gw, "dev-a", f"{prefix}/a", payloads)
    c = wait_until(gw, lambda c: drained(c) and c["postgresql:pg"]["success"] >= 6
                   and c["influxdb:ix"]["success"] >= 6, "all stored")
    for sid in ("postgresql:pg", "redis:rd", "rabbitmq:mq", "influxdb:ix"):
        assert c[sid]["status"] == "connected" and c[sid]["failed"] == 0, c[sid]

    rows = pg_rows(pg, "dev-a")
    assert [row[0] for row in rows] == list(range(6))
    assert rows[0][1:4] == (20.5, "note 0", "pg/a")
    assert rows[0][4] == payloads[0]  # jsonb from the payload text
    assert rows[5][2] == HOSTILE  # bound, not spliced: the table is still there

    h = rd(r).hgetall("dev:dev-a")
    assert h == {"n": "5", "note": HOSTILE}  # a value with spaces is one argument
    assert rd(r).lrange("log:dev-a", 0, -1) == [str(n) for n in range(6)]

    msgs = mq_messages(mq)
    assert [m[0] for m in msgs] == ["dev.dev-a"] * 6
    assert all(m[1] for m in msgs)  # persistent
    bodies = [json.loads(m[2]) for m in msgs]
    assert [b["n"] for b in bodies] == list(range(6)) and bodies[5]["note"] == HOSTILE

    points = ix_points(ix, "dev-a")
    assert [p["n"] for p in points] == list(range(6))
    assert points[0]["t"] == 20.5 and points[0]["text"] == "note 0"
    assert points[5]["text"] == HOSTILE.replace("\n", "\\n")
    # a tag: escaped, still one tag; 1.x stores a backslash before a space doubled
    assert points[5]["note"] == HOSTILE.replace("\n", "\\n").replace("\\ ", "\\\\ ")


def test_a_refused_row_is_counted_and_does_not_block(gw: Gatewayd, servers: Any) -> None:
    pg, r, mq, _ = servers
    before = connectors(gw)
    publish(gw, "dev-b", "pg/b", [{"n": 1}, {"n": -1}, {"n": 2}])  # CHECK (n >= 0)
    publish(gw, "dev-b", "rd/b", [{"n": 6, "note": "before"}])  # makes the hash
    publish(gw, "dev-b", "rdbad/b", [{}])  # INCR on a hash: WRONGTYPE
    publish(gw, "dev-b", "rd/b", [{"n": 7, "note": "after"}])
    mq_messages(mq)
    publish(gw, "dev-b", "mqbad/b", [{}])  # mandatory, unroutable: returned by the broker
    publish(gw, "dev-b", "mq/b", [{"n": 8}])
    c = wait_until(gw, lambda c: c["postgresql:pg"]["failed"] > before["postgresql:pg"]["failed"]
                   and c["redis:rd"]["failed"] > before["redis:rd"]["failed"]
                   and c["rabbitmq:mq"]["failed"] > before["rabbitmq:mq"]["failed"]
                   and drained(c), "refused rows counted")
    assert [row[0] for row in pg_rows(pg, "dev-b")] == [1, 2]
    assert "23514" in c["postgresql:pg"]["last_error"]  # check_violation
    assert "WRONGTYPE" in c["redis:rd"]["last_error"]
    assert rd(r).hget("dev:dev-b", "n") == "7"
    assert rd(r).lrange("log:dev-b", 0, -1) == ["6", "7"]
    assert "unroutable" in c["rabbitmq:mq"]["last_error"]
    assert [json.loads(m[2])["n"] for m in mq_messages(mq)] == [8]


@pytest.mark.timeout(600)
def test_a_full_redis_is_waited_for_not_refused(gw: Gatewayd, servers: Any) -> None:
    r = servers[1]
    r.cli("CONFIG", "SET", "maxmemory", "1")  # every write: OOM command not allowed
    try:
        publish(gw, "dev-m", "rd/m", [{"n": n, "note": "m"} for n in range(3)])
        c = wait_until(gw, lambda c: "OutOfMemory" in (c["redis:rd"]["last_error"] or "")
                       and c["redis:rd"]["buffer"]["depth"] == 6, "OOM: items kept")
        failed = c["redis:rd"]["failed"]
    finally:
        r.cli("CONFIG", "SET", "maxmemory", "0")
    c = wait_until(gw, lambda c: c["redis:rd"]["buffer"]["depth"] == 0, "drained")
    assert c["redis:rd"]["failed"] == failed
    assert rd(r).lrange("log:dev-m", 0, -1) == ["0", "1", "2"]


@pytest.mark.timeout(600)
def test_servers_down_then_kill_9_lose_nothing(gw: Gatewayd, servers: Any) -> None:
    pg, r, mq, ix = servers
    mq_messages(mq)
    kinds = {"pg": "postgresql:pg", "rd": "redis:rd", "mq": "rabbitmq:mq", "ix": "influxdb:ix"}
    per = {"redis:rd": 2}  # items per message: two redis actions (HSET, RPUSH)

    def batch(ns: range) -> list[dict[str, Any]]:
        return [{"t": float(n), "n": n, "note": f"o{n}", "ts": 1_700_000_100_000 + n}
                for n in ns]

    def all_servers(action: str) -> None:
        for s in (pg, r, ix, mq):
            getattr(s, action)()

    base = connectors(gw)
    # 1. the servers go down while gatewayd runs: items wait in the buffers
    all_servers("stop")
    for prefix in kinds:
        publish(gw, "dev-o", f"{prefix}/o", batch(range(0, 20)))
    wait_until(gw, lambda c: all(c[s]["buffer"]["depth"] == 20 * per.get(s, 1)
                                 and c[s]["status"] != "connected" for s in kinds.values()),
               "20 buffered per sink, sinks down")
    all_servers("start")
    wait_until(gw, lambda c: drained(c) and all(c[s]["status"] == "connected"
                                                for s in kinds.values()), "drained", 120)
    # 2. down again, more messages, then kill -9 with them on disk. ``committed`` counts
    # since gatewayd started, and this gatewayd also served the module's earlier tests:
    # wait for 30 more than before these puts, not for a total.
    all_servers("stop")
    before = {s: v["buffer"]["committed"] for s, v in connectors(gw).items()}
    for prefix in kinds:
        publish(gw, "dev-o", f"{prefix}/o", batch(range(20, 50)))
    wait_until(gw, lambda c: all(c[s]["buffer"]["depth"] == 30 * per.get(s, 1)
                                 and c[s]["buffer"]["committed"]
                                 >= before[s] + 30 * per.get(s, 1)
                                 for s in kinds.values()),
               "30 buffered and committed per sink")
    assert gw.proc is not None
    gw.proc.kill()
    gw.proc.wait(WAIT)
    gw.stop()
    all_servers("start")
    gw.start()
    c = wait_until(gw, lambda c: drained(c) and all(c[s]["success"] >= 30 * per.get(s, 1)
                                                    for s in kinds.values()),
                   "drained after the restart", 120)
    assert "postgresql:pg: 30 buffered item(s) from before the restart" in gw.log()
    assert "redis:rd: 60 buffered item(s) from before the restart" in gw.log()

    want = list(range(50))
    assert [row[0] for row in pg_rows(pg, "dev-o")] == want  # in order, each once
    assert rd(r).lrange("log:dev-o", 0, -1) == [str(n) for n in want]
    assert [json.loads(m[2])["n"] for m in mq_messages(mq)] == want
    assert [p["n"] for p in ix_points(ix, "dev-o")] == want
    for s in kinds.values():
        assert c[s]["failed"] == 0 and c[s]["dropped"] == 0, c[s]
    assert base  # (counters restart with the process; the data is the proof)


def test_a_full_buffer_refuses_counts_and_alarms(gw: Gatewayd) -> None:
    publish(gw, "dev-t", "tiny/t", [{"n": n} for n in range(100)])
    c = wait_until(gw, lambda c: c["redis:tiny"]["dropped"] > 0
                   and c["redis:tiny"]["buffer"]["depth"] + c["redis:tiny"]["dropped"] == 100,
                   "overflow")
    t = c["redis:tiny"]
    assert t["buffer"]["bytes"] <= 1024 and t["status"] != "connected"
    assert "connect" in (t["last_error"] or "")
    rule = gw.get(f"{API}/rules/to_tiny")
    assert rule["metrics"]["actions.failed"] == t["dropped"]
    alarms = {a["name"] for a in gw.get(f"{API}/alarms")["data"]}
    assert "sink_buffer_full:redis:tiny" in alarms


def test_health_in_status_gatewayctl_and_prometheus(gw: Gatewayd) -> None:
    wait_until(gw, lambda c: c["influxdb:ix"]["last_health_check"] is not None,
               "a health check ran")
    status = gw.get(f"{API}/status")
    ids = {c["id"]: c["status"] for c in status["connectors"]}
    assert ids["postgresql:pg"] == "connected" and ids["redis:tiny"] != "connected"
    out = subprocess.run([sys.executable, "-m", "gateway.cli.gatewayctl", "status"],
                         capture_output=True, text=True, timeout=60,
                         env={**clean_environ(), **gw.env, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "Connectors" in out.stdout and "postgresql:pg" in out.stdout
    code, _, body = gw.http("GET", "/metrics", auth=False)
    text = body.decode()
    assert code == 200
    assert 'gateway_sink_up{sink="postgresql:pg"} 1.0' in text
    assert 'gateway_sink_up{sink="redis:tiny"} 0.0' in text
    assert 'gateway_sink_items_total{result="success",sink="redis:rd"}' in text


def test_the_password_is_not_shown(gw: Gatewayd, servers: Any) -> None:
    pg = servers[0]
    body = json.dumps(gw.get(f"{API}/connectors")) + json.dumps(gw.get(f"{API}/status"))
    assert pg.password not in body and pg.password not in gw.log()
