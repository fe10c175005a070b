"""Steady forwarding throughput of a bridge: local publishers -> gatewayd -> bridge ->
mosquitto -> a counting subscriber upstream.

    .venv/bin/python -m bench.bridge_forward                    # QoS 0 and 1, 10 s each
    .venv/bin/python -m bench.bridge_forward --qos 1 --duration 20 --publishers 8
    .venv/bin/python -m bench.bridge_forward --json out.json

Closed loop, so the figure is what the bridge sustains, not what piles up in its outbox:
publishers send while the messages sent but not yet counted upstream stay under
``--window`` (and, at QoS 1, while their own unacknowledged PUBLISH stay under 32). The
forward rule keeps the message's QoS (``qos = "${qos}"``): at QoS 1 every message is an
outbox row written before the local PUBACK and deleted on the upstream PUBACK; at QoS 0
the bridge writes straight to the socket while nothing is queued. The figure is messages
counted upstream per second over the measured span (after a 1 s warm-up); CPU is the
share of one core each broker used meanwhile.
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
from bench.brokers import Gatewayd, machine_busy_seconds, use_gatewayd_commit

WARMUP = 1.0


async def _run(gw: BridgedGatewayd, mosq: UpstreamMosquitto, qos: int, publishers: int,
               duration: float, window: int) -> dict[str, Any]:
    up = await counter(mosq.port, qos=1)  # counts every forwarded message once
    progress = asyncio.Event()
    up.on_progress = progress.set
    end = time.monotonic() + WARMUP + duration
    sent_by: dict[int, int] = {}

    def outstanding(i: int, client: Any, sent: int) -> int:
        """Compared with ``window``: the publisher's share of what is not upstream yet,
        or ``window`` itself (stop) while 32 of its QoS 1 PUBLISH are unacknowledged."""
        sent_by[i] = sent
        if qos and sent - client.acks >= 32:
            return window
        return (sum(sent_by.values()) - up.received) // publishers

    async def one(i: int) -> int:
        sent, _ = await publish(gw.port, qos, 10**12, window=window,
                                outstanding=lambda c, s: outstanding(i, c, s),
                                client_id=f"p{i}", deadline=end, wake=progress)
        return sent

    tasks = [asyncio.create_task(one(i)) for i in range(publishers)]
    await asyncio.sleep(WARMUP)
    busy0 = machine_busy_seconds()
    r0, t0 = up.received, time.monotonic()
    cpu_gw0, cpu_mq0, cpu_lg0 = gw.cpu_seconds(), mosq.cpu_seconds(), time.process_time()
    await asyncio.sleep(duration)
    r1, t1 = up.received, time.monotonic()
    cpu_gw1, cpu_mq1, cpu_lg1 = gw.cpu_seconds(), mosq.cpu_seconds(), time.process_time()
    busy = machine_busy_seconds() - busy0
    ours = (cpu_gw1 - cpu_gw0) + (cpu_mq1 - cpu_mq0) + (cpu_lg1 - cpu_lg0)
    others = max(0.0, 100 * (busy - ours) / (t1 - t0))
    sent = sum(await asyncio.gather(*tasks))
    deadline = time.monotonic() + 30
    while up.received < sent and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    span = t1 - t0
    return {
        "qos": qos,
        "publishers": publishers,
        "seconds": round(span, 2),
        "msgs_per_s": round((r1 - r0) / span),
        "sent": sent,
        "received": up.received,
        "lost": max(0, sent - up.received),
        "gatewayd_cpu_pct": round(100 * (cpu_gw1 - cpu_gw0) / span),
        "mosquitto_cpu_pct": round(100 * (cpu_mq1 - cpu_mq0) / span),
        "loadgen_cpu_pct": round(100 * (cpu_lg1 - cpu_lg0) / span),
        "others_cpu_pct": round(others),
    }


def run_one(qos: int, publishers: int, duration: float, window: int) -> dict[str, Any]:
    mosq = UpstreamMosquitto()
    mosq.start()
    gw = BridgedGatewayd(mosq.port, qos="${qos}")
    try:
        gw.start()
        wait_until("bridge connected", lambda: gw.bridge()["status"] == "connected")
        result = asyncio.run(_run(gw, mosq, qos, publishers, duration, window))
        view = gw.bridge()
        result["outbox_after"] = view["queue_len"]
        result["dropped"] = view["dropped"]
        return result
    finally:
        gw.cleanup()
        mosq.cleanup()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qos", default="0,1", help="comma-separated QoS levels (default 0,1)")
    ap.add_argument("--publishers", type=int, default=4)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--window", type=int, default=500,
                    help="messages per publisher sent but not yet counted upstream")
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
    results = [run_one(int(q), args.publishers, args.duration, args.window)
               for q in args.qos.split(",")]
    info = machine()
    print("bridge forwarding: local publishers -> gatewayd -> bridge -> mosquitto")
    print("| QoS | publishers | msg/s upstream | CPU % gatewayd / mosquitto / loadgen / "
          "others | lost |")
    print("|---|---|---|---|---|")
    for r in results:
        print(f"| {r['qos']} | {r['publishers']} | {r['msgs_per_s']:,} | "
              f"{r['gatewayd_cpu_pct']} / {r['mosquitto_cpu_pct']} / {r['loadgen_cpu_pct']} / "
              f"{r['others_cpu_pct']} | {r['lost']} |")
    print("machine:", ", ".join(f"{k} {v}" for k, v in info.items()))
    print("gatewayd:", Gatewayd.version())
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "machine": info}, f, indent=1)
    return 0 if all(r["lost"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
