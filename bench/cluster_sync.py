"""Cluster-wide state benchmark: how long a change made on one node takes to reach every
other node, and what replicating the tables costs cross-node throughput.

    .venv/bin/python -m bench.cluster_sync [--repeat 10] [--messages 20000] [--no-tables]

Starts three real ``gatewayd`` cores A, B, C over mutual TLS (the harness of
tests/gateway/cluster) and measures:

- **reach**: a ban added with ``gatewayctl ban add`` on A (timed from the moment the
  row is in A's ``gateway.db``: committed) until it is in B's and C's ``banned`` table
  (every ``gateway.db`` polled every 5 ms, read-only); the same for ``gatewayctl users
  add``; a retained QoS 1 message published on A (timed from its PUBACK) until
  ``GET /api/v5/retainer/messages/<topic>`` on C returns it. Median and maximum over
  ``--repeat`` changes; "every node" is the slower of B and C.
- **throughput** A -> B, QoS 0 and QoS 1, plain and retained (every retained message also
  becomes a table row sent to B and C), 64-byte payloads, messages per second
  (``bench.cluster_bench``'s loops).

``--no-tables`` runs the same with ``cluster.tables = false`` (the "before": nothing
reaches the other nodes; the reach measures are skipped).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

from bench import cluster_bench, wire
from tests.gateway.cluster.harness import Node, make_pki, wait_mesh, wait_until
from tests.harness.gatewayd import clean_environ


def _in_db(node: Node, sql: str, args: tuple[str, ...]) -> bool:
    conn = sqlite3.connect(f"file:{node.workdir / 'data' / 'gateway.db'}?mode=ro", uri=True,
                           timeout=5)
    try:
        return conn.execute(sql, args).fetchone() is not None
    finally:
        conn.close()


def _until(cond: Any, timeout: float = 30.0) -> float:
    t0 = time.perf_counter()
    while not cond():
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError("change never arrived")
        time.sleep(0.005)
    return time.perf_counter()


def reach_db(a: Node, others: list[Node], args: list[str], sql: str, key: tuple[str, ...]
             ) -> float:
    """From the row's commit on A (seen in A's file) to its arrival in every other's."""
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli.gatewayctl", *args],
                            env={**clean_environ(), **a.ctl_env()},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        t0 = _until(lambda: _in_db(a, sql, key))
        return max(_until(lambda n=n: _in_db(n, sql, key)) for n in others) - t0
    finally:
        proc.wait(60)


def reach_retained(a: Node, others: list[Node], topic: str) -> float:
    async def publish() -> float:
        r, w = await cluster_bench._open(a.mqtt_port, "sync-pub")
        pkt = bytearray(wire.publish(topic, b"v", 1, 1))
        pkt[0] |= 0x01  # RETAIN
        w.write(bytes(pkt))
        async for first, _ in cluster_bench._packets(r):
            if first >> 4 == 4:
                break
        w.close()
        return time.perf_counter()

    def retained_publish() -> float:
        return asyncio.run(publish())

    path = f"/api/v5/retainer/messages/{urllib.parse.quote(topic, safe='')}"
    t0 = retained_publish()
    return max(_until(lambda n=n: n.http("GET", path)[0] == 200) for n in others) - t0


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--no-tables", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    quiet = {"GATEWAY_LOG__LEVEL": "warning", "GATEWAY_MQTT__MAX_MQUEUE_LEN": "10000000",
             "GATEWAY_CLUSTER__TABLES": "false" if args.no_tables else "true"}
    results: dict[str, Any] = {"tables": not args.no_tables}
    with tempfile.TemporaryDirectory(prefix="cluster-sync-") as tmp:
        root = Path(tmp)
        pki = make_pki(root / "pki", [f"{n}@127.0.0.1" for n in "abc"])
        a = Node(root, "a", pki, extra=quiet).start()
        b = Node(root, "b", pki, seeds=[a], extra=quiet).start()
        c = Node(root, "c", pki, seeds=[a, b], extra=quiet).start()
        try:
            wait_mesh([a, b, c])
            if not args.no_tables:
                wait_until(lambda: all(t["state"] == "synced"
                                       for t in a.cluster()["tables"].values()),
                           what="tables synced")
                reach: dict[str, list[float]] = {"ban": [], "user": [], "retained": []}
                for i in range(args.repeat):
                    reach["ban"].append(reach_db(
                        a, [b, c], ["ban", "add", "clientid", f"bench-{i}"],
                        "SELECT 1 FROM banned WHERE kind='clientid' AND value=?",
                        (f"bench-{i}",)))
                    reach["user"].append(reach_db(
                        a, [b, c], ["users", "add", f"u{i}", "--password", "pw",
                                    "--iterations", "4096"],
                        "SELECT 1 FROM users WHERE username=?", (f"u{i}",)))
                    reach["retained"].append(reach_retained(a, [b, c], f"bench/r/{i}"))
                results["reach_ms"] = {
                    k: {"median": round(statistics.median(v) * 1000, 1),
                        "max": round(max(v) * 1000, 1)} for k, v in reach.items()}
            for qos in (0, 1):
                results[f"cross_qos{qos}"] = round(cluster_bench._cross(a, b, qos,
                                                                        args.messages))
        finally:
            for n in (c, b, a):
                n.stop()
    if args.json:
        print(json.dumps(results, indent=2))
    print(f"tables {'on' if results['tables'] else 'off'}")
    for k, v in (results.get("reach_ms") or {}).items():
        print(f"| {k} reaches every node | median {v['median']} ms | max {v['max']} ms |")
    for qos in (0, 1):
        print(f"| cross-node QoS {qos} msg/s | {results[f'cross_qos{qos}']:,} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
