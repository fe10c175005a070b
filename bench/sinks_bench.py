"""Sink throughput: fan-in QoS 1 publishers -> gatewayd -> a rule -> PostgreSQL or Redis
(real servers from Debian's packages, started here as in tests/gateway/rules/sinks).

    .venv/bin/python -m bench.sinks_bench                       # 20,000 messages each
    .venv/bin/python -m bench.sinks_bench --messages 50000 --publishers 8 --batch-size 500

Two figures per sink:

- ``sustained``: rows (Redis: stream entries) per second from the first publish to the
  last row stored, with the server up; the rule is ``SELECT clientid, topic, timestamp
  FROM "bench/#"`` and the action ``INSERT INTO bench(clientid, topic, ts) VALUES
  (${clientid}, ${topic}, ${timestamp})`` (Redis: ``XADD bench * c ${clientid} t
  ${timestamp}``).
- ``drain``: the server is stopped, the same number of messages is published (they wait in
  the durable buffer), the server is started again; rows per second from its start to
  the last row stored.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable

from bench.bridge_common import publish
from bench.brokers import Gatewayd
from tests.gateway.rules.sinks.servers import PgServer, RedisServer, Server


def _wait(count: Callable[[], int], want: int, idle: float = 15.0) -> tuple[int, float]:
    """Poll ``count`` until ``want`` (or no progress for ``idle`` s); (got, when)."""
    last, last_change = -1, time.monotonic()
    while True:
        got = count()
        now = time.monotonic()
        if got != last:
            last, last_change = got, now
        if got >= want or now - last_change > idle:
            return got, last_change
        time.sleep(0.02)  # bounded poll of the server


async def _fan_in(port: int, publishers: int, total: int) -> int:
    per = total // publishers
    results = await asyncio.gather(*[
        publish(port, 1, per, window=200, outstanding=lambda c, s: s - c.acks,
                client_id=f"p{i}") for i in range(publishers)])
    return sum(sent for sent, _ in results)


def run(kind: str, args: argparse.Namespace) -> dict[str, object]:
    server: Server
    if kind == "postgresql":
        pg = PgServer()
        server = pg
        pg.start()
        pg.psql(f"CREATE DATABASE {pg.database}")
        pg.psql("CREATE TABLE bench(id bigserial PRIMARY KEY, clientid text, topic text, "
                "ts bigint)", pg.database)
        section = (f'[connectors.postgresql.b]\nserver = "127.0.0.1:{pg.port}"\n'
                   f'database = "{pg.database}"\nusername = "gateway"\n'
                   f'password = "{pg.password}"\n')
        action = ('function = "postgresql:b"\nargs = { sql = "INSERT INTO bench(clientid, '
                  'topic, ts) VALUES (${clientid}, ${topic}, ${timestamp})" }\n')

        def count() -> int:
            return int(pg.psql("SELECT count(*) FROM bench", pg.database).strip())

        def reset() -> None:
            pg.psql("TRUNCATE bench", pg.database)
    else:
        rd = RedisServer()
        server = rd
        rd.start()
        section = (f'[connectors.redis.b]\nserver = "127.0.0.1:{rd.port}"\n'
                   f'password = "{rd.password}"\n')
        action = ('function = "redis:b"\n'
                  'args = { command = "XADD bench * c ${clientid} t ${timestamp}" }\n')

        def count() -> int:
            out = rd.cli("XLEN", "bench").strip()
            return int(out) if out.isdigit() else 0  # LOADING while the AOF is replayed

        def reset() -> None:
            rd.cli("DEL", "bench")
    section += (f"retry_interval = \"200ms\"\nmax_retry_interval = \"500ms\"\n"
                f"[connectors.{kind}.b.buffer]\nbatch_size = {args.batch_size}\n"
                "max_bytes = \"512MB\"\n")
    rule = ("[rule_engine.rules.sink]\n"
            "sql = 'SELECT clientid, topic, timestamp FROM \"bench/#\"'\n"
            f"[[rule_engine.rules.sink.actions]]\n{action}")

    class Broker(Gatewayd):
        name = f"gatewayd-{kind}"
        OPTIONAL_CONFIG = (*Gatewayd.OPTIONAL_CONFIG, section + rule)

    broker = Broker()
    try:
        if not broker._accepts(Broker.OPTIONAL_CONFIG[-1]):
            raise SystemExit(f"gatewayd refuses the {kind} configuration")
        broker.start()
        n = args.messages
        t0 = time.monotonic()
        sent = asyncio.run(_fan_in(broker.port, args.publishers, n))
        t_pub = time.monotonic() - t0
        got, t_last = _wait(count, sent)
        sustained = got / (t_last - t0)
        reset()
        server.stop()
        sent2 = asyncio.run(_fan_in(broker.port, args.publishers, n))
        t_pub2 = time.monotonic() - t0
        t1 = time.monotonic()
        server.start()
        t_up = time.monotonic() - t1
        got2, t_last2 = _wait(count, sent2)
        drain = got2 / (t_last2 - t1)
        return {"sink": kind, "messages": sent, "stored": got,
                "sustained_per_s": round(sustained), "publish_s": round(t_pub, 2),
                "drain_messages": sent2, "drain_stored": got2, "drain_per_s": round(drain),
                "server_start_s": round(t_up, 2), "publish2_s": round(t_pub2, 2),
                "publishers": args.publishers, "batch_size": args.batch_size}
    finally:
        broker.cleanup()
        server.close()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=100)
    ap.add_argument("--sinks", default="postgresql,redis")
    args = ap.parse_args(argv)
    ok = True
    for kind in args.sinks.split(","):
        r = run(kind, args)
        print(json.dumps(r), flush=True)
        ok = ok and r["stored"] == r["messages"] and r["drain_stored"] == r["drain_messages"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
