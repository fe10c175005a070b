"""The largest idle-connection run this machine allows: many brokers, many load generators.

The process file limit is 20,000 and cannot be raised, so one process holds at most about
18,000 connections. This harness starts ``--brokers`` independent gatewayd nodes (not
clustered: idle connections never cross nodes, and a cluster would add its own links and
route replication to what is measured) on free loopback ports, and one load-generator
process per node (forked; one uvloop event loop of minimal raw protocols) that opens
``--per-broker`` MQTT 3.1.1 connections to it from its own loopback source address, then:

1. **ramp**: connects everything (``--concurrency`` CONNECTs in flight per generator) and
   times it: connects per second, first CONNECT to last CONNACK;
2. **settle**: ``--settle`` seconds without traffic, then reads every broker's RSS
   (``VmRSS``), ``/proc/net/sockstat`` and the kernel slab (``Slab:`` of
   ``/proc/meminfo``) against the figures before the ramp;
3. **quiet**: ``--quiet`` seconds without traffic: the brokers' CPU when nothing happens
   (the keepalive timer wheel, ``$SYS`` heartbeats);
4. **ping**: ``--ping`` seconds during which every client sends PINGREQ every
   ``--ping-interval`` seconds (spread evenly; the keepalive is ``--keepalive``): the
   brokers' CPU per PINGREQ, and every PINGRESP counted;
5. **stop**: the generators close their connections, the brokers are stopped (SIGTERM,
   then SIGKILL), temporary directories removed.

Everything is bounded: each phase has a deadline, a generator that does not answer in
time is killed, and ``--timeout`` caps the whole run. Results go to stdout (a table) and,
with ``--json``, to a file. Both ends of every connection are on this host, so the kernel
figures (sockstat, slab) count two sockets per connection.

    python -m bench.scale --brokers 4 --per-broker 18000 --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from multiprocessing import get_context
from multiprocessing.connection import Connection
from typing import Any

from bench import wire
from bench.brokers import Gatewayd, machine_busy_seconds, use_gatewayd_commit
from bench.procstat import CLK_TCK

PAGE = os.sysconf("SC_PAGE_SIZE")
FD_LIMIT_MARGIN = 500  # descriptors a process keeps for itself (logs, pipes, the store)


# ------------------------------------------------------------------------ load generator


class Stats:
    __slots__ = ("connacks", "lost", "pongs")

    def __init__(self) -> None:
        self.connacks = 0
        self.pongs = 0
        self.lost = 0


class IdleClient(asyncio.Protocol):
    """One idle MQTT connection: CONNECT on open, then counts CONNACK and PINGRESP."""

    __slots__ = ("connected", "pending", "stats", "subscribed", "transport")

    def __init__(self, stats: Stats, connected: asyncio.Future[None]) -> None:
        self.stats = stats
        self.connected: asyncio.Future[None] | None = connected
        self.subscribed: asyncio.Future[None] | None = None
        self.transport: asyncio.Transport | None = None
        self.pending = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        buf = self.pending + data if self.pending else data
        i, n = 0, len(buf)
        while i + 2 <= n:
            size = 2 + buf[i + 1]  # CONNACK and PINGRESP are short: one length byte
            if i + size > n:
                break
            kind = buf[i] >> 4
            if kind == wire.T_PINGRESP:
                self.stats.pongs += 1
            elif kind == wire.T_SUBACK:
                fut = self.subscribed
                self.subscribed = None
                if fut is not None and not fut.done():
                    if buf[i + 4] < 0x80:
                        fut.set_result(None)
                    else:
                        fut.set_exception(ConnectionError(f"SUBACK code {buf[i + 4]}"))
            elif kind == 2:  # CONNACK
                self.stats.connacks += 1
                fut = self.connected
                self.connected = None
                if fut is not None and not fut.done():
                    if buf[i + 3] == 0:
                        fut.set_result(None)
                    else:
                        fut.set_exception(ConnectionError(f"CONNACK code {buf[i + 3]}"))
            i += size
        self.pending = bytes(buf[i:])

    def connection_lost(self, exc: Exception | None) -> None:
        self.stats.lost += 1
        fut = self.connected
        if fut is not None and not fut.done():
            fut.set_exception(ConnectionError(f"closed before CONNACK: {exc!r}"))


async def _generator(pipe: Connection, spec: dict[str, Any]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    stats = Stats()
    clients: list[IdleClient] = []
    errors: list[str] = []
    failed = 0
    ids = iter(range(spec["count"]))

    async def one(i: int) -> None:
        fut: asyncio.Future[None] = loop.create_future()
        _, client = await loop.create_connection(
            lambda: IdleClient(stats, fut),
            spec["host"],
            spec["port"],
            local_addr=(spec["source_ip"], 0),
        )
        assert client.transport is not None
        client.transport.write(
            wire.connect(f"{spec['prefix']}{i}", spec["keepalive"], spec["clean"])
        )
        await asyncio.wait_for(fut, 30.0)
        if spec["subscribe"]:
            client.subscribed = sub = loop.create_future()
            client.transport.write(wire.subscribe(1, f"{spec['prefix']}{i}/cmd", 1))
            await asyncio.wait_for(sub, 30.0)
        clients.append(client)

    async def runner() -> None:
        nonlocal failed
        for i in ids:
            try:
                await one(i)
            except (OSError, ConnectionError, TimeoutError) as exc:
                failed += 1
                if len(errors) < 5:
                    errors.append(repr(exc))

    cpu0 = time.process_time()
    t0 = time.monotonic()
    await asyncio.gather(*(runner() for _ in range(spec["concurrency"])))
    t1 = time.monotonic()
    ramp = {
        "ok": len(clients),
        "failed": failed,
        "errors": errors,
        "seconds": t1 - t0,
        "cpu": time.process_time() - cpu0,
    }
    pipe.send(("ramp", ramp))

    # commands from the parent: ("ping", seconds, interval) | ("stop",)
    reader = asyncio.Queue[Any]()
    loop.add_reader(pipe.fileno(), lambda: reader.put_nowait(pipe.recv()))
    while True:
        cmd = await reader.get()
        if cmd[0] == "stop":
            break
        _, seconds, interval = cmd
        pongs0, cpu0, sent = stats.pongs, time.process_time(), 0
        start = time.monotonic()
        end = start + seconds
        # every client once per interval, in slices every 10 ms (evenly spread)
        slices = max(1, int(interval / 0.01))
        per_slice = len(clients) / slices
        k = 0
        while time.monotonic() < end:
            due = int((time.monotonic() - start) / 0.01) + 1
            while k < due * per_slice:
                c = clients[int(k) % len(clients)]
                if c.transport is not None and not c.transport.is_closing():
                    c.transport.write(wire.PINGREQ)
                    sent += 1
                k += 1
            await asyncio.sleep(0.01)
        # the last PINGRESPs: bounded wait
        deadline = time.monotonic() + 5.0
        while stats.pongs - pongs0 < sent and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        pipe.send(
            (
                "pinged",
                {
                    "sent": sent,
                    "pongs": stats.pongs - pongs0,
                    "cpu": time.process_time() - cpu0,
                    "lost": stats.lost,
                },
            )
        )
    loop.remove_reader(pipe.fileno())
    for c in clients:
        if c.transport is not None:
            c.transport.write(wire.DISCONNECT)
            c.transport.close()
    await asyncio.sleep(0.2)
    return {"lost_before_stop": stats.lost - len(clients)}


def _generator_main(pipe: Connection, spec: dict[str, Any]) -> None:
    import uvloop

    asyncio.set_event_loop_policy(None)
    try:
        result: Any = uvloop.run(_generator(pipe, spec))
        pipe.send(("done", result))
    except BaseException as exc:  # report anything to the parent rather than dying silently
        with contextlib.suppress(OSError):
            pipe.send(("error", repr(exc)))
    os._exit(0)


# ------------------------------------------------------------------------ measurements


def sockstat() -> dict[str, int]:
    """TCP sockets in use and their buffer memory (pages) from /proc/net/sockstat."""
    out: dict[str, int] = {}
    with open("/proc/net/sockstat") as f:
        for line in f:
            if line.startswith("TCP:"):
                parts = line.split()[1:]
                out = {parts[i]: int(parts[i + 1]) for i in range(0, len(parts), 2)}
    return out


def meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def slabinfo() -> dict[str, int]:
    """Bytes in each kernel slab cache (active objects x object size; needs root)."""
    out: dict[str, int] = {}
    with contextlib.suppress(OSError), open("/proc/slabinfo") as f:
        for line in f:
            if line.startswith(("slabinfo", "#")):
                continue
            parts = line.split()
            out[parts[0]] = int(parts[1]) * int(parts[3])
    return out


def tcp_mem_sysctls() -> dict[str, str]:
    out = {}
    for name in ("tcp_rmem", "tcp_wmem", "tcp_mem"):
        with contextlib.suppress(OSError), open(f"/proc/sys/net/ipv4/{name}") as f:
            out[name] = " ".join(f.read().split())
    return out


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.brokers: list[Gatewayd] = []
        self.gens: list[tuple[Any, Connection]] = []

    def _recv(self, pipe: Connection, kind: str, timeout: float) -> Any:
        if not pipe.poll(timeout):
            raise TimeoutError(f"load generator sent no {kind!r} within {timeout:.0f}s")
        msg = pipe.recv()
        if msg[0] == "error":
            raise RuntimeError(f"load generator failed: {msg[1]}")
        if msg[0] != kind:
            raise RuntimeError(f"expected {kind!r} from a load generator, got {msg[0]!r}")
        return msg[1]

    def _cpu(self) -> list[float]:
        return [b.cpu_seconds() for b in self.brokers]

    def run(self) -> dict[str, Any]:
        a = self.args
        for _ in range(a.brokers):
            b = Gatewayd()
            b.start()
            self.brokers.append(b)
        time.sleep(a.settle)
        rss0 = [b.rss_kib() for b in self.brokers]
        sock0, slab0, caches0 = sockstat(), meminfo("Slab"), slabinfo()
        ctx = get_context("fork")
        cpu0, busy0 = self._cpu(), machine_busy_seconds()
        t0 = time.monotonic()
        for w, b in enumerate(self.brokers):
            parent, child = ctx.Pipe()
            spec = {
                "host": b.host,
                "port": b.port,
                "source_ip": f"127.2.{os.getpid() % 250 + 1}.{w + 1}",
                "count": a.per_broker,
                "concurrency": a.concurrency,
                "prefix": f"scale{w}-",
                "keepalive": a.keepalive,
                "clean": not a.persistent,
                "subscribe": a.subscribe,
            }
            proc = ctx.Process(target=_generator_main, args=(child, spec), daemon=True)
            proc.start()
            child.close()
            self.gens.append((proc, parent))
        ramps = [self._recv(p, "ramp", a.ramp_timeout) for _, p in self.gens]
        ramp_wall = time.monotonic() - t0
        ramp_cpu = sum(self._cpu()) - sum(cpu0)
        ramp_busy = machine_busy_seconds() - busy0
        ok = sum(r["ok"] for r in ramps)
        failed = sum(r["failed"] for r in ramps)
        time.sleep(a.settle)
        rss1 = [b.rss_kib() for b in self.brokers]
        sock1, slab1, caches1 = sockstat(), meminfo("Slab"), slabinfo()
        grown = sorted(
            ((name, size - caches0.get(name, 0)) for name, size in caches1.items()),
            key=lambda kv: -kv[1],
        )[:8]
        per_broker = [
            {
                "connections": r["ok"],
                "rss_before_kib": r0,
                "rss_after_kib": r1,
                "kib_per_conn": round((r1 - r0) / r["ok"], 3) if r["ok"] else None,
                "ramp_seconds": round(r["seconds"], 2),
                "connects_per_s": round(r["ok"] / r["seconds"], 1) if r["seconds"] else None,
            }
            for r, r0, r1 in zip(ramps, rss0, rss1, strict=True)
        ]
        rss_growth = sum(rss1) - sum(rss0)
        sockets = sock1.get("inuse", 0) - sock0.get("inuse", 0)
        result: dict[str, Any] = {
            "brokers": a.brokers,
            "per_broker_target": a.per_broker,
            "connections": ok,
            "failed": failed,
            "errors": [e for r in ramps for e in r["errors"]][:5],
            "persistent": a.persistent,
            "subscribe": a.subscribe,
            "keepalive": a.keepalive,
            "ramp_wall_s": round(ramp_wall, 2),
            "connects_per_s_total": round(ok / ramp_wall, 1),
            "loadgen_ramp_cpu_s": round(sum(r["cpu"] for r in ramps), 2),
            "broker_ramp_cpu_s": round(ramp_cpu, 2),
            "broker_us_per_connect": round(1e6 * ramp_cpu / ok, 1) if ok else None,
            "machine_ramp_cpu_pct": round(100 * ramp_busy / ramp_wall, 1),
            "broker_rss_total_mib": round(sum(rss1) / 1024, 1),
            "broker_rss_growth_kib_per_conn": round(rss_growth / ok, 3) if ok else None,
            "per_broker": per_broker,
            "kernel": {
                "tcp_sockets_added": sockets,
                "sockstat_mem_pages_before": sock0.get("mem", 0),
                "sockstat_mem_pages_after": sock1.get("mem", 0),
                "sockstat_mem_kib_per_conn": round(
                    (sock1.get("mem", 0) - sock0.get("mem", 0)) * PAGE / 1024 / ok, 3
                )
                if ok
                else None,
                "slab_growth_kib": slab1 - slab0,
                "slab_kib_per_socket": round((slab1 - slab0) / sockets, 3) if sockets else None,
                # the slab caches that grew most: bytes per socket
                "slab_caches_bytes_per_socket": {
                    name: round(size / sockets) for name, size in grown if sockets and size > 0
                },
                "sysctl": tcp_mem_sysctls(),
            },
        }
        # quiet: nothing but the brokers' own timers
        cpu0, busy0, q0 = self._cpu(), machine_busy_seconds(), time.monotonic()
        time.sleep(a.quiet)
        cpu1, busy1, q1 = self._cpu(), machine_busy_seconds(), time.monotonic()
        wall = q1 - q0
        result["quiet"] = {
            "seconds": round(wall, 2),
            "broker_cpu_pct_total": round(100 * (sum(cpu1) - sum(cpu0)) / wall, 2),
            "machine_cpu_pct": round(100 * (busy1 - busy0) / wall, 1),
        }
        # ping: PINGREQ from every client every ping_interval seconds
        if a.ping > 0:
            cpu0, busy0, p0 = self._cpu(), machine_busy_seconds(), time.monotonic()
            for _, p in self.gens:
                p.send(("ping", a.ping, a.ping_interval))
            pinged = [self._recv(p, "pinged", a.ping + 60) for _, p in self.gens]
            cpu1, busy1, p1 = self._cpu(), machine_busy_seconds(), time.monotonic()
            sent = sum(x["sent"] for x in pinged)
            pongs = sum(x["pongs"] for x in pinged)
            broker_cpu = sum(cpu1) - sum(cpu0)
            wall = p1 - p0
            result["ping"] = {
                "seconds": round(wall, 2),
                "interval_s": a.ping_interval,
                "pingreq_sent": sent,
                "pingresp_received": pongs,
                "pingreq_per_s": round(sent / a.ping, 1),
                "broker_cpu_s": round(broker_cpu, 2),
                "broker_cpu_pct_total": round(100 * broker_cpu / wall, 1),
                "broker_us_per_ping": round(1e6 * broker_cpu / sent, 1) if sent else None,
                "loadgen_cpu_s": round(sum(x["cpu"] for x in pinged), 2),
                "machine_cpu_pct": round(100 * (busy1 - busy0) / wall, 1),
                "connections_lost": sum(x["lost"] for x in pinged),
            }
        result["brokers_alive"] = all(b.alive() for b in self.brokers)
        return result

    def cleanup(self) -> None:
        for _proc, pipe in self.gens:
            with contextlib.suppress(OSError, BrokenPipeError):
                pipe.send(("stop",))
        for proc, pipe in self.gens:
            with contextlib.suppress(OSError, EOFError):
                if pipe.poll(30):
                    pipe.recv()
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for b in self.brokers:
            with contextlib.suppress(Exception):
                b.cleanup()


def print_table(r: dict[str, Any]) -> None:
    k = r["kernel"]
    print(
        f"\n{r['brokers']} gatewayd x {r['per_broker_target']:,} = "
        f"{r['connections']:,} idle connections ({r['failed']} failed, keepalive "
        f"{r['keepalive']} s, {'persistent' if r['persistent'] else 'clean'} sessions"
        f"{', one subscription each' if r['subscribe'] else ''})"
    )
    print("| broker | connections | RSS before / after MiB | KiB per connection | connects/s |")
    print("|---|---|---|---|---|")
    for i, b in enumerate(r["per_broker"]):
        print(
            f"| {i} | {b['connections']:,} | {b['rss_before_kib'] / 1024:.1f} / "
            f"{b['rss_after_kib'] / 1024:.1f} | {b['kib_per_conn']} | {b['connects_per_s']:,} |"
        )
    print(
        f"\nramp: {r['connections']:,} connections in {r['ramp_wall_s']} s = "
        f"{r['connects_per_s_total']:,} connects/s (all generators together); brokers' CPU "
        f"{r['broker_ramp_cpu_s']} s = {r['broker_us_per_connect']} us per connect, machine "
        f"{r['machine_ramp_cpu_pct']} % busy"
    )
    print(
        f"brokers' RSS: {r['broker_rss_total_mib']} MiB in all, "
        f"{r['broker_rss_growth_kib_per_conn']} KiB per connection"
    )
    print(
        f"kernel: {k['tcp_sockets_added']:,} TCP sockets (both ends), sockstat buffers "
        f"{k['sockstat_mem_kib_per_conn']} KiB per connection, slab +{k['slab_growth_kib']:,} "
        f"KiB = {k['slab_kib_per_socket']} KiB per socket ({k['sysctl']})"
    )
    print(f"slab caches, bytes per socket: {k['slab_caches_bytes_per_socket']}")
    q = r["quiet"]
    print(f"quiet {q['seconds']} s: brokers' CPU {q['broker_cpu_pct_total']} % of one core")
    p = r.get("ping")
    if p:
        print(
            f"ping {p['seconds']} s: {p['pingreq_sent']:,} PINGREQ ({p['pingreq_per_s']:,}/s), "
            f"{p['pingresp_received']:,} PINGRESP; brokers' CPU {p['broker_cpu_pct_total']} % "
            f"of one core = {p['broker_us_per_ping']} us per PINGREQ; "
            f"connections lost {p['connections_lost']}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n")[0])
    ap.add_argument("--brokers", type=int, default=4, help="gatewayd processes (default 4)")
    ap.add_argument("--per-broker", type=int, default=18000, help="connections per broker")
    ap.add_argument("--concurrency", type=int, default=64, help="CONNECTs in flight per generator")
    ap.add_argument("--keepalive", type=int, default=300, help="CONNECT keepalive, seconds")
    ap.add_argument("--persistent", action="store_true", help="clean session 0 (default: 1)")
    ap.add_argument(
        "--subscribe", action="store_true", help="each client subscribes to one topic (QoS 1)"
    )
    ap.add_argument("--nice", type=int, default=0, help="as bench.run --nice (root: -20)")
    ap.add_argument("--settle", type=float, default=2.0, help="seconds of rest before reading RSS")
    ap.add_argument("--quiet", type=float, default=10.0, help="seconds without traffic")
    ap.add_argument("--ping", type=float, default=60.0, help="seconds of PINGREQ (0: none)")
    ap.add_argument(
        "--ping-interval", type=float, default=60.0, help="seconds between a client's PINGREQs"
    )
    ap.add_argument("--ramp-timeout", type=float, default=300.0)
    ap.add_argument("--timeout", type=float, default=900.0, help="the whole run, seconds")
    ap.add_argument("--gatewayd-commit", metavar="REV", help="run gatewayd from this commit")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    import resource

    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if args.per_broker > soft - FD_LIMIT_MARGIN:
        ap.error(f"--per-broker above {soft - FD_LIMIT_MARGIN} would hit the file limit {soft}")
    if args.ping and args.ping_interval > args.keepalive:
        ap.error("--ping-interval above --keepalive: the brokers would drop the clients")
    if args.gatewayd_commit:
        use_gatewayd_commit(args.gatewayd_commit)

    def on_alarm(signum: int, frame: Any) -> None:
        raise TimeoutError(f"the run took more than --timeout {args.timeout:.0f}s")

    if args.nice:
        from bench.run import renice

        renice(args.nice)
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(args.timeout))
    run = Run(args)
    try:
        result = run.run()
    finally:
        signal.alarm(0)
        run.cleanup()
    result["gatewayd"] = Gatewayd.source or "working tree"
    result["clk_tck"] = CLK_TCK
    print_table(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
