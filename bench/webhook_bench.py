"""Webhook delivery rate: publishers -> gatewayd -> rule -> webhook queue -> a local
aiohttp server (its own process) that answers 204 and counts.

    .venv/bin/python -m bench.webhook_bench                      # 20,000 requests
    .venv/bin/python -m bench.webhook_bench --messages 50000 --concurrency 32

The rule is ``SELECT payload AS p, clientid FROM "bench/#"`` with ``webhook:sink``
(body: the output as JSON). Publishing is QoS 1 with a window, so the queue fills while the
webhook drains it; the figure is requests received by the server per second, from the
first publish to the last request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time

from bench.bridge_common import publish
from bench.brokers import Gatewayd, free_port

SERVER = """
import sys
from aiohttp import web
count = 0
async def hook(request):
    global count
    await request.read()
    count += 1
    return web.Response(status=204)
async def n(request):
    return web.Response(text=str(count))
app = web.Application()
app.router.add_post("/hook", hook)
app.router.add_get("/count", n)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None)
"""


def count(port: int) -> int:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/count", timeout=5) as r:
        return int(r.read())


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args(argv)
    hport = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(hport)])

    class Broker(Gatewayd):
        name = "gatewayd-webhook"
        OPTIONAL_CONFIG = (*Gatewayd.OPTIONAL_CONFIG, (
            f'[webhooks.sink]\nurl = "http://127.0.0.1:{hport}/hook"\n'
            f"concurrency = {args.concurrency}\n"
            "[rule_engine.rules.wh]\n"
            "sql = 'SELECT payload AS p, clientid FROM \"bench/#\"'\n"
            '[[rule_engine.rules.wh.actions]]\nfunction = "webhook:sink"\n'))

    broker = Broker()
    try:
        if not broker._accepts(Broker.OPTIONAL_CONFIG[-1]):
            raise SystemExit("gatewayd refuses the webhook configuration")
        deadline = time.monotonic() + 10
        while True:
            try:
                count(hport)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        broker.start()
        t0 = time.monotonic()
        sent, _ = asyncio.run(publish(broker.port, 1, args.messages, window=500,
                                      outstanding=lambda c, s: s - c.acks))
        t_pub = time.monotonic() - t0
        last, last_change = 0, time.monotonic()
        while True:
            got = count(hport)
            now = time.monotonic()
            if got != last:
                last, last_change = got, now
            if got >= sent or now - last_change > 10:
                break
            time.sleep(0.02)  # bounded poll of the server's counter
        elapsed = last_change - t0
        rate = last / elapsed if elapsed > 0 else 0.0
        result = {"messages": sent, "delivered": last, "seconds": round(elapsed, 2),
                  "requests_per_s": round(rate), "publish_seconds": round(t_pub, 2),
                  "concurrency": args.concurrency}
        print(json.dumps(result))
        return 0 if last >= sent else 1
    finally:
        broker.cleanup()
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
