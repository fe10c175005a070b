"""Cluster benchmark: cross-node throughput against single-node, and route replication
lag with many subscriptions, in one run on loopback.

    .venv/bin/python -m bench.cluster_bench [--messages 50000] [--subscriptions 100000]

Starts real ``gatewayd`` processes (two clustered nodes, A and B, over mutual TLS with
certificates from ``gatewayctl certs``; the harness of tests/gateway/cluster) and measures
with raw MQTT 3.1.1 sockets (``bench.wire``; no client library in the way):

- **throughput**: one publisher, one subscriber (``bench/t``), 64-byte payloads, QoS 0
  and QoS 1 (publisher window of 256 unacknowledged PUBLISHes); messages per second from
  the first PUBLISH sent to the last one received. *single*: both clients on A;
  *cross*: publisher on A, subscriber on B (every message crosses the cluster's data
  link). A stays clustered with B in both cases, so the only difference is the hop.
- **route replication**: one client on B subscribes to N distinct filters (SUBSCRIBE
  packets of 500 filters); the time until B has acknowledged them all, until A's
  ``GET /api/v5/cluster`` shows N routes of B, and the difference (replication lag as an
  operator sees it, polled every 20 ms).

- **replicant bootstrap** (``cluster.raft``): two fresh cores C and D, S persistent
  sessions created on C (each claimed in the Raft session table), then a replicant R is
  started; seconds from R's process start until its Raft state is ``normal`` with all S
  sessions applied (the wait for its readiness included).

Prints a Markdown table (and ``--json``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from bench import wire
from tests.gateway.cluster.harness import Node, make_pki, wait_mesh, wait_until

PAYLOAD = b"x" * 64
LOSS: dict[str, int] = {}  # QoS 0 messages that never arrived, per run


async def _open(port: int, cid: str, clean: bool = True
                ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    r, w = await asyncio.open_connection("127.0.0.1", port, limit=1 << 22)
    w.write(wire.connect(cid, clean=clean))
    head = await r.readexactly(4)
    assert head[0] == 0x20 and head[3] == 0, f"CONNACK {head!r}"
    return r, w


async def _packets(r: asyncio.StreamReader) -> AsyncIterator[tuple[int, bytes]]:
    """Yield (first byte, body) of every packet on ``r``."""
    buf = bytearray()
    while True:
        data = await r.read(1 << 20)
        if not data:
            return
        buf += data
        pos = 0
        n = len(buf)
        while True:
            if n - pos < 2:
                break
            mult, length, i = 1, 0, pos + 1
            ok = False
            while i < n:
                b = buf[i]
                length += (b & 0x7F) * mult
                mult <<= 7
                i += 1
                if not b & 0x80:
                    ok = True
                    break
            if not ok or n - i < length:
                break
            yield buf[pos], bytes(buf[i : i + length])
            pos = i + length
        del buf[:pos]


async def throughput(pub_port: int, sub_port: int, qos: int, n: int, tag: str) -> float:
    sr, sw = await _open(sub_port, f"sub-{tag}")
    sw.write(wire.subscribe(1, "bench/t", qos))
    got = 0
    done = asyncio.Event()
    suback = asyncio.Event()

    async def receive() -> None:
        nonlocal got
        async for first, body in _packets(sr):
            kind = first >> 4
            if kind == 9:
                suback.set()
            elif kind == 3:
                got += 1
                if first & 0x06:
                    tl = int.from_bytes(body[:2], "big")
                    sw.write(wire.PUBACK_HEAD + body[2 + tl : 4 + tl])
                if got >= n:
                    done.set()
                    return

    rx = asyncio.create_task(receive())
    await asyncio.wait_for(suback.wait(), 10)
    return await _publish(pub_port, qos, n, tag, done, rx, lambda: got)


async def _publish(port: int, qos: int, n: int, tag: str, done: asyncio.Event,
                   rx: asyncio.Task[None], count: Any) -> float:
    pr, pw = await _open(port, f"pub-{tag}")
    window = asyncio.Semaphore(256)
    acks = 0

    async def pubacks() -> None:
        nonlocal acks
        async for first, _ in _packets(pr):
            if first >> 4 == 4:
                acks += 1
                window.release()

    ack_task = asyncio.create_task(pubacks()) if qos else None
    # the subscriber's route must be on the publisher's node first
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    for i in range(n):
        if qos:
            await window.acquire()
            pw.write(wire.publish("bench/t", PAYLOAD, 1, (i % 65535) + 1))
        else:
            pw.write(wire.publish("bench/t", PAYLOAD))
        if i % 256 == 255:
            await pw.drain()
    # QoS 0 may be dropped under overload (counted): stop once nothing came for 2 s
    last, last_t = -1, time.perf_counter()
    while not done.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(done.wait(), 0.2)
        if count() != last:
            last, last_t = count(), time.perf_counter()
        elif time.perf_counter() - last_t > (2 if qos == 0 else 60):
            break
    elapsed = (time.perf_counter() if done.is_set() else last_t) - t0
    print(f"{tag}: {count()} of {n} in {elapsed:.2f} s", file=sys.stderr)
    LOSS[tag] = n - count()
    for t in (rx, ack_task):
        if t is not None:
            t.cancel()
    return float(count() / elapsed)


async def subscribe_many(port: int, n: int, replicated: Any) -> tuple[float, float]:
    """Subscribe one client to ``n`` filters; (seconds until every SUBACK, seconds until
    ``replicated()`` is true), the connection held open meanwhile."""
    r, w = await _open(port, "many")
    per = 500
    sent = 0
    pid = 0
    t0 = time.perf_counter()
    while sent < n:
        k = min(per, n - sent)
        pid += 1
        body = pid.to_bytes(2, "big") + b"".join(
            wire.mqtt_str(f"dev/{sent + j}/telemetry") + b"\x01" for j in range(k))
        w.write(wire.packet(0x82, body))
        sent += k
    acked = 0
    async for first, _ in _packets(r):
        if first >> 4 == 9:
            acked += 1
            if acked == pid:
                break
    subscribed = time.perf_counter() - t0
    while not await asyncio.to_thread(replicated):
        await asyncio.sleep(0.02)
    seen = time.perf_counter() - t0
    w.close()
    return subscribed, seen


def main() -> int:
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the nodes on the way out
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--subscriptions", type=int, default=100_000)
    ap.add_argument("--sessions", type=int, default=5000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cluster-bench-") as tmp:
        root = Path(tmp)
        pki = make_pki(root / "pki", [f"{n}@127.0.0.1" for n in "abcdr"])
        quiet = {"GATEWAY_LOG__LEVEL": "warning",  # and no queue drops under a burst
                 "GATEWAY_MQTT__MAX_MQUEUE_LEN": "10000000"}
        a = Node(root, "a", pki, extra=quiet).start()
        b = Node(root, "b", pki, seeds=[a], extra=quiet).start()
        results: dict[str, Any] = {"messages": args.messages,
                                   "subscriptions": args.subscriptions}
        try:
            wait_mesh([a, b])
            for qos in (0, 1):
                # cross first, then single: the subscriber's route reaches A before the
                # publisher starts (subscribe, then wait for the route)
                async def run(pub: Node, sub: Node, tag: str, q: int = qos) -> float:
                    return await throughput(pub.mqtt_port, sub.mqtt_port, q,
                                            args.messages, tag)
                single = asyncio.run(run(a, a, f"single{qos}"))
                cross = _cross(a, b, qos, args.messages)
                results[f"qos{qos}"] = {"single": round(single), "cross": round(cross)}
            target = a.remote_routes(b) + args.subscriptions
            subscribed, seen = asyncio.run(subscribe_many(
                b.mqtt_port, args.subscriptions, lambda: a.remote_routes(b) >= target))
            lag_ms = (b.member(a.name) or {}).get("replication", {}).get("lag_ms")
            results["routes"] = {
                "subscribed_s": round(subscribed, 3),
                "replicated_s": round(seen, 3),
                "lag_s": round(max(0.0, seen - subscribed), 3),
                "b_reported_lag_ms": lag_ms,
            }
        finally:
            a.stop()
            b.stop()
        results["replicant"] = replicant_bootstrap(root, pki, quiet, args.sessions)
    results["lost"] = LOSS
    if args.json:
        print(json.dumps(results, indent=2))
    r = results
    print("| Measure | Single node | Cross-node (A -> B) | Ratio |\n|---|---|---|---|")
    for qos in (0, 1):
        s, c = r[f"qos{qos}"]["single"], r[f"qos{qos}"]["cross"]
        print(f"| QoS {qos} msg/s ({r['messages']} x 64 B) | {s:,} | {c:,} | {c / s:.2f} |")
    print(f"\nQoS 0 messages not delivered (dropped under overload): {r['lost']}")
    rt = r["routes"]
    rb = r["replicant"]
    print(f"\nReplicant bootstrap with {rb['sessions']:,} sessions in the Raft table: "
          f"{rb['bootstrap_s']} s from process start to normal (lag 0)")
    print(f"\n{r['subscriptions']:,} subscriptions on B: acknowledged in "
          f"{rt['subscribed_s']} s, all on A after {rt['replicated_s']} s "
          f"(lag {rt['lag_s']} s; B's last measured route-ack lag {rt['b_reported_lag_ms']} ms)")
    return 0


def replicant_bootstrap(root: Path, pki: Path, quiet: dict[str, str], n: int
                        ) -> dict[str, Any]:
    raft = {**quiet, "GATEWAY_CLUSTER__RAFT": "true"}
    c = Node(root, "c", pki, extra=raft).start()
    d = Node(root, "d", pki, seeds=[c], extra=raft).start()
    r: Node | None = None
    try:
        wait_mesh([c, d])
        wait_until(lambda: (c.cluster()["raft"] or {}).get("leader"), what="a leader")

        async def sessions() -> None:
            for i in range(n):
                _rd, wr = await _open(c.mqtt_port, f"dev-{i}", clean=False)
                wr.write(wire.DISCONNECT)
                wr.close()

        asyncio.run(sessions())
        wait_until(lambda: c.cluster()["raft"]["sessions"] >= n, timeout=120,
                   what="sessions in the table")
        t0 = time.perf_counter()
        r = Node(root, "r", pki, seeds=[c], role="replicant", extra=raft).start()
        wait_until(lambda: (r.cluster()["raft"] or {}).get("state") == "normal"
                   and r.cluster()["raft"]["sessions"] >= n, timeout=300,
                   what="the replicant caught up")
        return {"sessions": n, "bootstrap_s": round(time.perf_counter() - t0, 3)}
    finally:
        for node in (r, d, c):
            if node is not None:
                node.stop()


def _cross(a: Node, b: Node, qos: int, n: int) -> float:
    async def run() -> float:
        sr, sw = await _open(b.mqtt_port, f"sub-cross{qos}")
        sw.write(wire.subscribe(1, "bench/t", qos))
        got = 0
        done = asyncio.Event()

        async def receive() -> None:
            nonlocal got
            async for first, body in _packets(sr):
                if first >> 4 == 3:
                    got += 1
                    if first & 0x06:
                        tl = int.from_bytes(body[:2], "big")
                        sw.write(wire.PUBACK_HEAD + body[2 + tl : 4 + tl])
                    if got >= n:
                        done.set()
                        return

        rx = asyncio.create_task(receive())
        # wait until A has B's route for bench/t before publishing
        routes = await asyncio.to_thread(a.remote_routes, b)
        if routes == 0:
            await asyncio.to_thread(wait_until, lambda: a.remote_routes(b) > 0, 10, "route")
        return await _publish(a.mqtt_port, qos, n, f"cross{qos}", done, rx, lambda: got)

    return asyncio.run(run())


if __name__ == "__main__":
    sys.exit(main())
