"""Outbox drain rate: a backlog queued while upstream was unreachable, sent once it is back.

    .venv/bin/python -m bench.bridge_drain                      # 50,000 messages, QoS 1
    .venv/bin/python -m bench.bridge_drain --messages 200000 --qos 0
    .venv/bin/python -m bench.bridge_drain --drain-rate 2000    # check the pacing

1. gatewayd starts with its bridge pointing at a port where nothing listens, and local
   publishers (QoS 1: 64 in flight each) fill the outbox: every PUBACK means the message
   is on disk. *fill* is messages per second until the outbox holds them all.
2. gatewayd stops (SIGTERM) with the backlog on disk; mosquitto starts with a counting
   subscriber; gatewayd starts again on the same data, its bridge now pointing at
   mosquitto. The backlog is read back from disk and drained.
3. *drain* is messages counted upstream per second from the first to the last; *restart to
   drained* runs from starting gatewayd again to the last message upstream (process start,
   reading the outbox, connecting, draining).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from bench.bridge_common import (
    BridgedGatewayd,
    UpstreamMosquitto,
    counter,
    machine,
    publish,
    wait_until,
)
from bench.brokers import Gatewayd, free_port, use_gatewayd_commit


async def _fill(port: int, qos: int, total: int, publishers: int) -> None:
    share = [total // publishers + (1 if i < total % publishers else 0)
             for i in range(publishers)]

    def outstanding(c: Any, sent: int) -> int:
        return sent - c.acks if qos else 0

    await asyncio.gather(*(publish(port, qos, n, window=64, outstanding=outstanding,
                                   client_id=f"fill{i}") for i, n in enumerate(share)))


async def _drain(gw: BridgedGatewayd, mosq: UpstreamMosquitto, total: int) -> dict[str, Any]:
    up = await counter(mosq.port, qos=1)
    t_start = time.monotonic()
    await asyncio.get_running_loop().run_in_executor(None, gw.start)
    cpu0 = gw.cpu_seconds()
    deadline = time.monotonic() + 600
    rss = 0
    while up.received < total and time.monotonic() < deadline:
        rss = max(rss, gw.rss_kib())
        await asyncio.sleep(0.02)
    cpu1 = gw.cpu_seconds()
    assert up.first_at is not None and up.last_at is not None
    span = max(1e-9, up.last_at - up.first_at)
    return {
        "received": up.received,
        "drain_msgs_per_s": round(up.received / span),
        "drain_seconds": round(span, 2),
        "restart_to_drained_s": round(up.last_at - t_start, 2),
        "gatewayd_cpu_pct": round(100 * (cpu1 - cpu0) / max(1e-9, time.monotonic() - t_start)),
        "gatewayd_max_rss_mib": round(rss / 1024, 1),
    }


def run(total: int, qos: int, publishers: int, drain_rate: float) -> dict[str, Any]:
    dead = free_port()  # nothing listens here: upstream is down
    gw = BridgedGatewayd(dead, qos="${qos}", drain_rate=drain_rate)
    mosq = UpstreamMosquitto()
    try:
        gw.start()
        t0 = time.monotonic()
        asyncio.run(_fill(gw.port, qos, total, publishers))
        wait_until("outbox filled", lambda: gw.bridge()["queue_len"] >= total)
        fill_s = time.monotonic() - t0  # QoS 0 has no PUBACK: until the outbox holds all
        view = gw.bridge()
        gw.stop()
        mosq.start()
        gw.upstream_port = mosq.port
        result = asyncio.run(_drain(gw, mosq, total))
        after = gw.bridge()
        result.update(
            messages=total,
            qos=qos,
            drain_rate_setting=drain_rate,
            fill_msgs_per_s=round(total / fill_s),
            outbox_bytes=view["queue_bytes"],
            lost=max(0, total - result["received"]),
            outbox_after=after["queue_len"],
        )
        return result
    finally:
        gw.cleanup()
        mosq.cleanup()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=50_000)
    ap.add_argument("--qos", type=int, default=1, choices=(0, 1, 2))
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--drain-rate", type=float, default=0.0,
                    help="the bridge's outbox.drain_rate (messages/s; 0: no limit)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--gatewayd-commit", metavar="REV",
                    help="run gatewayd from this commit instead of the working tree")
    args = ap.parse_args(argv)
    if args.gatewayd_commit:
        use_gatewayd_commit(args.gatewayd_commit)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover
        pass
    r = run(args.messages, args.qos, args.publishers, args.drain_rate)
    info = machine()
    print("bridge outbox: fill while upstream is down, drain once it is back")
    print("| messages | QoS | outbox bytes | fill msg/s | drain msg/s | drain s | "
          "restart to drained | gatewayd max RSS | drain_rate | lost |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print(f"| {r['messages']:,} | {r['qos']} | {r['outbox_bytes']:,} | "
          f"{r['fill_msgs_per_s']:,} | {r['drain_msgs_per_s']:,} | {r['drain_seconds']} | "
          f"{r['restart_to_drained_s']} s | {r['gatewayd_max_rss_mib']} MiB | "
          f"{r['drain_rate_setting'] or 'none'} | {r['lost']} |")
    print("machine:", ", ".join(f"{k} {v}" for k, v in info.items()))
    print("gatewayd:", Gatewayd.version())
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"result": r, "machine": info}, f, indent=1)
    return 0 if r["lost"] == 0 and r["outbox_after"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
