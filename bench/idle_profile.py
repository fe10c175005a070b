"""Where an idle connection's memory goes: gatewayd in this process under tracemalloc.

Starts a gateway (``gateway.app.Gateway``, the working tree's code, on uvloop) on a free
loopback port, opens 20 warm-up connections and then ``N`` idle MQTT 3.1.1 connections
from a child process (blocking sockets; optionally clean session 0 and one QoS 1
subscription each), and prints the Python allocations that grew between the two
snapshots, per connection, by source line. Plain-TCP listeners run on the lean
transport (``gateway/net/lean.py``: a 64-byte object, the fd's int and a table slot);
with ``--transport asyncio`` uvloop's own objects show up under ``asyncio/runners.py``
instead (the transport, 680 bytes, and libuv's handle, 248 bytes). RSS
growth is printed too, but tracemalloc's own bookkeeping inflates it: use
``bench.run --scenarios idle-memory`` for the RSS figure.

    python -m bench.idle_profile 3000                 # clean sessions
    python -m bench.idle_profile 3000 --persistent --subscribe
    python -m bench.idle_profile 3000 --loop asyncio  # asyncio's own loop instead
    python -m bench.idle_profile 3000 --transport asyncio  # the loop's transport
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import subprocess
import sys
import tempfile
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CLIENTS = r"""
import socket, sys
sys.path.insert(0, sys.argv[1])
from bench import wire
port, n, tag = int(sys.argv[2]), int(sys.argv[3]), sys.argv[6]
clean, sub = sys.argv[4] == "1", sys.argv[5] == "1"
socks = []
def read(s, n):
    d = b""
    while len(d) < n:
        chunk = s.recv(n - len(d))
        if not chunk:
            raise SystemExit("closed")
        d += chunk
    return d
for i in range(n):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(wire.connect(f"{tag}-{i}", 600, clean))
    read(s, 4)
    if sub:
        s.sendall(wire.subscribe(1, f"dev/{tag}-{i}/cmd", 1))
        read(s, 5)
    socks.append(s)
print("ready", flush=True)
sys.stdin.readline()
"""


def rss_kib() -> int:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def profile(
    n: int, clean: bool, subscribe: bool, top: int, transport: str = "lean"
) -> None:
    from gateway.app import Gateway
    from gateway.config import load_config
    from tests.harness.gatewayd import free_port

    tmp = tempfile.mkdtemp(prefix="idle-profile-")
    port = free_port()
    conf = Path(tmp) / "gateway.toml"
    conf.write_text(
        f'[node]\nname = "profile@127.0.0.1"\ndata_dir = "{tmp}/data"\n'
        f'[listeners.tcp.default]\nbind = "127.0.0.1:{port}"\ntransport = "{transport}"\n'
        '[api]\nbind = "127.0.0.1:0"\n'
    )
    gateway = Gateway(load_config(str(conf)))
    await gateway.start()
    loop = asyncio.get_running_loop()
    children: list[subprocess.Popen[str]] = []

    async def clients(count: int, tag: str) -> None:
        args = [str(REPO), str(port), str(count), "1" if clean else "0", "1" if subscribe else "0"]
        p = subprocess.Popen(
            [sys.executable, "-c", CLIENTS, *args, tag],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        children.append(p)
        assert p.stdout is not None
        line = await asyncio.wait_for(loop.run_in_executor(None, p.stdout.readline), 300)
        if line.strip() != "ready":
            raise RuntimeError(f"clients failed: {line!r}")
        await asyncio.sleep(1.0)

    try:
        await clients(20, "warm")
        gc.collect()
        tracemalloc.start(8)
        rss0, snap0 = rss_kib(), tracemalloc.take_snapshot()
        await clients(n, "idle")
        gc.collect()
        rss1, snap1 = rss_kib(), tracemalloc.take_snapshot()
        tracemalloc.stop()
        ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
        diff = snap1.filter_traces(ignore).compare_to(snap0.filter_traces(ignore), "lineno")
        total = sum(d.size_diff for d in diff)
        kind = "clean" if clean else "persistent"
        print(
            f"{n} idle connections ({kind}{', one subscription' if subscribe else ''}): "
            f"Python heap +{total / n:.0f} B per connection, RSS +{(rss1 - rss0) / n:.2f} KiB "
            "(with tracemalloc's overhead)"
        )
        print(f"{'bytes':>8} {'blocks':>7}  allocated at")
        for d in diff[:top]:
            if d.size_diff / n < 2:
                break
            frame = d.traceback[0]
            where = frame.filename.replace(str(REPO) + "/", "")
            print(f"{d.size_diff / n:8.1f} {d.count_diff / n:7.2f}  {where}:{frame.lineno}")
    finally:
        for p in children:
            if p.stdin is not None:
                p.stdin.close()
            p.wait(30)
        await gateway.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.idle_profile", description=__doc__)
    ap.add_argument("connections", type=int, nargs="?", default=3000)
    ap.add_argument("--persistent", action="store_true", help="clean session 0")
    ap.add_argument("--subscribe", action="store_true", help="one QoS 1 subscription each")
    ap.add_argument("--top", type=int, default=40, help="lines to print")
    ap.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="event loop (gatewayd runs on uvloop; asyncio's own loop for comparison)",
    )
    ap.add_argument(
        "--transport",
        choices=("lean", "asyncio"),
        default="lean",
        help="the listener's transport (gateway/net/lean.py, or the event loop's own)",
    )
    args = ap.parse_args(argv)
    run = profile(
        args.connections, not args.persistent, args.subscribe, args.top, args.transport
    )
    if args.loop == "asyncio":
        asyncio.run(run)
        return 0
    import uvloop

    uvloop.run(run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
