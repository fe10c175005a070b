"""Scenarios: build the clients of one measurement, run them in worker processes, measure.

Every scenario is bounded: publishers stop at ``duration`` or their message cap, the drain
ends when every expected message arrived, when nothing arrived for ``stall`` seconds, or
at ``max_drain``; connects time out; a worker that does not answer is killed. Lost
messages (expected deliveries minus deliveries seen at the end of the drain) are counted in
every traffic scenario.

Scenarios (``name``: what it measures):

- ``fanin-qos{0,1}``: N publishers -> 1 subscriber on a wildcard (``<prefix>/fanin/#``),
  closed loop; delivered messages/s.
- ``fanout-qos{0,1}``: 1 publisher -> N subscribers of one topic; delivered messages/s
  (N deliveries per publish).
- ``p2p-qos{0,1}``: N pairs, publisher i -> subscriber i on its own topic.
- ``connrate``: CONNECT/CONNACK/DISCONNECT cycles, ``concurrency`` at a time per worker;
  connects/s.
- ``connrate-{clean,persist}[-tls]-{50,1000}``: the same with clean sessions or new
  persistent ones (clean session 0, fresh client ids), over TCP or TLS (a full handshake
  each, ECDSA P-256), with 50 or 1,000 connects in flight.
- ``storm-5000``: 5,000 devices connecting at once and staying (a reconnect storm after a
  power cut); connects/s, and the kernel's ``TcpExt`` ListenOverflows, ListenDrops and
  TCPSynRetrans counters (``/proc/net/netstat``) before and after: an overflowing listen
  backlog shows there as drops and SYN retransmits (1 s, 3 s, ... of delay per device).
- ``idle-memory``: K idle connections; broker RSS growth per connection (VmRSS before and
  after, after a warm-up of a few connections).
- ``latency-qos{0,1}``: N pairs publishing timestamped messages at a fixed total rate
  (10,000 msg/s); p50/p99 of receive time minus send time.
- ``latency-devices-qos{0,1}``: the same total rate from many slow publishers, as a unit
  sees it: D devices (2,000; quick 1,000), each on its own topic at 10,000 / D msg/s and
  at its own phase (spread evenly over its period, shuffled), to one backend subscriber
  on ``<prefix>/devices/#``; p50/p99 latency, and the broker's CPU per message at that
  load.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import time
from array import array
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any, cast

from bench.brokers import Broker, machine_busy_seconds, mqtt_ping
from bench.loadgen import PubSpec, Shared, SubSpec, WorkerSpec, worker_main


@dataclass
class Params:
    # load-generator processes: one core is left to the broker (on this 2-core machine one
    # worker drives every broker hardest: more processes only preempt the broker)
    workers: int = max(1, (os.cpu_count() or 2) - 1)
    clients: int = 16  # N of fan-in / fan-out / p2p
    duration: float = 5.0  # seconds of publishing per traffic scenario
    max_publishes: int = 2_000_000  # cap on PUBLISH packets sent per scenario
    window: int = 500  # messages outstanding per subscriber (closed loop)
    inflight: int = 32  # unacknowledged QoS 1 PUBLISH per publisher
    stall: float = 3.0  # drain ends after this long without a delivery
    max_drain: float = 20.0
    conn_count: int = 8000  # connrate: connects per run (capped by conn_duration)
    conn_duration: float = 10.0
    conn_concurrency: int = 48  # per worker (listen backlogs are about 100)
    idle_conns: int = 5000  # idle-memory: connections held (<= ~8000, fd limit 20000)
    latency_rate: float = 10_000.0  # messages/s offered, total
    latency_pairs: int = 4
    devices: int = 2000  # latency-devices: publishers sharing latency_rate
    latency_duration: float = 5.0
    storm_conns: int = 5000  # storm-5000: connections opened at once
    loadgen_cpus: tuple[int, ...] = ()  # CPUs the load-generator workers are pinned to
    rcvlowat: int = 0  # SO_RCVLOWAT of QoS 0 throughput subscribers (loadgen._coalesce_reads)

    @classmethod
    def quick(cls) -> Params:
        return cls(
            clients=8,
            duration=1.5,
            max_publishes=300_000,
            stall=1.5,
            max_drain=4.0,
            conn_count=3000,
            conn_duration=3.0,
            idle_conns=1000,
            latency_duration=1.5,
            devices=1000,
        )

    @classmethod
    def tiny(cls) -> Params:
        """For the smoke test: a few clients, well under a second each."""
        return cls(
            workers=2,
            clients=3,
            duration=0.5,
            max_publishes=2_000,
            stall=5.0,
            max_drain=20.0,
            conn_count=50,
            conn_duration=5.0,
            conn_concurrency=4,
            idle_conns=50,
            latency_rate=500.0,
            latency_pairs=2,
            latency_duration=0.5,
            devices=20,
            storm_conns=50,
        )


@dataclass
class Result:
    scenario: str
    broker: str
    metric: str  # name of the headline figure
    value: float | None  # the headline figure (None: no figure, see error)
    unit: str
    lost: int = 0
    details: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


SCENARIOS = [
    "fanin-qos0",
    "fanin-qos1",
    "fanout-qos0",
    "fanout-qos1",
    "p2p-qos0",
    "p2p-qos1",
    "connrate-clean-50",
    "connrate-clean-1000",
    "connrate-persist-50",
    "connrate-persist-1000",
    "connrate-clean-tls-50",
    "connrate-clean-tls-1000",
    "connrate-persist-tls-1000",
    "storm-5000",
    "idle-memory",
    "latency-qos0",
    "latency-qos1",
    "latency-devices-qos0",
    "latency-devices-qos1",
]

# Not in the default run: QoS 1 to persistent sessions (clean session 0), whose every
# message is journaled by a durable broker; compare brokers gatewayd and gatewayd-memory.
DURABILITY_SCENARIOS = ["fanin-qos1-persistent", "fanout-qos1-persistent", "p2p-qos1-persistent"]
# Also accepted: "connrate" (issue 4's: 48 at a time per worker, clean, TCP).
EXTRA_SCENARIOS = ["connrate"]


def needs_tls(scenario: str) -> bool:
    return "-tls" in scenario


TCPEXT_COUNTERS = ("ListenOverflows", "ListenDrops", "TCPSynRetrans")


def tcpext() -> dict[str, int]:
    """The kernel's TcpExt counters of /proc/net/netstat (this network namespace)."""
    with open("/proc/net/netstat") as f:
        lines = f.read().splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        if names.startswith("TcpExt:"):
            return dict(zip(names.split()[1:], map(int, values.split()[1:]), strict=False))
    return {}


def tcpext_delta(before: dict[str, int]) -> dict[str, int]:
    after = tcpext()
    return {k: after.get(k, 0) - before.get(k, 0) for k in TCPEXT_COUNTERS}

_run_counter = random.randrange(250)


def _source_ip(worker: int) -> str:
    """A fresh loopback source address per run and worker, so that TIME_WAIT sockets of
    earlier runs never exhaust the ephemeral ports of later ones."""
    return f"127.1.{_run_counter % 250 + 1}.{worker + 1}"


# ------------------------------------------------------------------------------ workers


class _Workers:
    """Forked workers and their pipes; every wait on them has a timeout."""

    def __init__(self, specs: list[WorkerSpec], shared: Shared | None) -> None:
        ctx = mp.get_context("fork")
        self.pipes: list[Connection] = []
        self.procs: list[Any] = []
        for spec in specs:
            parent, child = ctx.Pipe()
            proc = ctx.Process(target=worker_main, args=(child, spec, shared), daemon=True)
            proc.start()
            child.close()
            self.pipes.append(parent)
            self.procs.append(proc)

    def collect(self, kind: str, timeout: float) -> list[dict[str, Any]]:
        """One ``kind`` message from every worker (a missing one becomes an error)."""
        out: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while len(out) < len(self.pipes):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            pending = [p for i, p in enumerate(self.pipes) if i not in out]
            for ready in wait(pending, timeout=left):
                p = cast(Connection, ready)
                i = self.pipes.index(p)
                try:
                    msg: tuple[str, dict[str, Any]] = p.recv()
                except (EOFError, OSError):
                    out[i] = {"error": "worker exited"}
                    continue
                if msg[0] == kind:
                    out[i] = msg[1]
                elif msg[0] == "result":  # a worker that failed early
                    out[i] = msg[1] if "error" in msg[1] else {"error": "early result"}
        return [
            out.get(i, {"error": f"no {kind} from worker {i} in {timeout}s"})
            for i in range(len(self.pipes))
        ]

    def send(self, msg: tuple[Any, ...]) -> None:
        for p in self.pipes:
            with contextlib.suppress(OSError):
                p.send(msg)

    def finish(self, timeout: float = 20.0, *, stop: bool = True) -> list[dict[str, Any]]:
        """Stop the workers and collect their results (``stop=False``: already collected,
        only reap the processes)."""
        results: list[dict[str, Any]] = []
        if stop:
            self.send(("stop",))
            results = self.collect("result", timeout)
        for proc in self.procs:
            proc.join(timeout=2)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=2)
        for p in self.pipes:
            p.close()
        return results


def _first_error(items: list[dict[str, Any]]) -> str | None:
    for item in items:
        if item.get("error"):
            return str(item["error"]) + (f"\n{item['traceback']}" if "traceback" in item else "")
    return None


# ------------------------------------------------------------------------------ traffic


def _topology(
    kind: str, n: int, qos: int, prefix: str, latency: bool
) -> tuple[list[PubSpec], list[SubSpec]]:
    if kind in ("fanin", "devices"):
        subs = [SubSpec(0, f"{prefix}s0", f"{prefix}/{kind}/#", qos, latency)]
        pubs = [
            PubSpec(i, f"{prefix}p{i}", f"{prefix}/{kind}/{i}", qos, [(0, list(range(n)))], 0)
            for i in range(n)
        ]
    elif kind == "fanout":
        subs = [SubSpec(i, f"{prefix}s{i}", f"{prefix}/fanout", qos, latency) for i in range(n)]
        pubs = [PubSpec(0, f"{prefix}p0", f"{prefix}/fanout", qos, [(i, [0]) for i in range(n)], 0)]
    elif kind == "p2p":
        subs = [SubSpec(i, f"{prefix}s{i}", f"{prefix}/p2p/{i}", qos, latency) for i in range(n)]
        pubs = [
            PubSpec(i, f"{prefix}p{i}", f"{prefix}/p2p/{i}", qos, [(i, [i])], 0) for i in range(n)
        ]
    else:
        raise ValueError(kind)
    return pubs, subs


def spread_phases(pubs: list[PubSpec]) -> None:
    """Give open-loop publishers phases spread evenly over their period, in a fixed
    shuffle (the same every run), so that devices of one rate do not send together."""
    slots = list(range(len(pubs)))
    random.Random(len(pubs)).shuffle(slots)
    for p, slot in zip(pubs, slots, strict=True):
        p.phase = slot / len(pubs)


def _assign(
    broker: Broker,
    params: Params,
    mode: str,
    pubs: list[PubSpec],
    subs: list[SubSpec],
    duration: float,
    *,
    subs_apart: bool = False,
) -> list[WorkerSpec]:
    """Clients spread round-robin over ``params.workers`` processes. ``subs_apart``: the
    subscribers get a process of their own (an extra one), so that their reads never wait
    behind the timers of many publishers sharing one event loop (the device scenarios)."""

    def spec(w: int) -> WorkerSpec:
        return WorkerSpec(
            mode,
            broker.host,
            broker.port,
            _source_ip(w),
            duration=duration,
            window=params.window,
            inflight=params.inflight,
            cpus=params.loadgen_cpus,
            rcvlowat=params.rcvlowat,
        )

    if subs_apart and subs and pubs:
        nw = max(1, min(params.workers, len(pubs)))
        specs = [spec(w) for w in range(nw + 1)]
        specs[0].subs.extend(subs)
        for k, p in enumerate(pubs):
            specs[1 + k % nw].pubs.append(p)
        return specs
    nw = max(1, min(params.workers, len(pubs) + len(subs)))
    specs = [spec(w) for w in range(nw)]
    k = 0
    for s in subs:
        specs[k % nw].subs.append(s)
        k += 1
    for p in pubs:
        specs[k % nw].pubs.append(p)
        k += 1
    return specs


def run_traffic(
    broker: Broker,
    params: Params,
    kind: str,
    qos: int,
    *,
    rate: float | None = None,
    persistent: bool = False,
) -> Result:
    """Closed-loop throughput (rate None) or open-loop latency (rate = total msg/s);
    kind ``devices`` is fan-in from ``params.devices`` open-loop publishers."""
    global _run_counter
    _run_counter += 1
    latency = rate is not None
    devices = kind == "devices"
    n = params.devices if devices else params.latency_pairs if latency else params.clients
    duration = params.latency_duration if latency else params.duration
    prefix = f"b{_run_counter}{kind}{qos}"
    pubs, subs = _topology(kind, n, qos, prefix, latency)
    for s in subs:
        s.clean = not persistent
    cap = params.max_publishes // len(pubs)
    for p in pubs:
        p.cap = cap
        if rate is not None:
            p.rate = rate / len(pubs)
    if devices:
        spread_phases(pubs)
    feeders = {s: f for p in pubs for s, f in p.targets}
    label = "latency-devices" if devices else "latency" if latency else kind
    name = f"{label}-qos{qos}" + ("-persistent" if persistent else "")
    metric = "p99 latency" if latency else "delivered"
    unit = "ms" if latency else "msg/s"

    shared = Shared(len(pubs), len(subs))
    specs = _assign(broker, params, "traffic", pubs, subs, duration, subs_apart=devices)
    workers = _Workers(specs, shared)
    ready = workers.collect("ready", 60.0)
    err = _first_error(ready)
    if err:
        workers.finish()
        return Result(name, broker.name, metric, None, unit, error=f"setup: {err}")

    def expected() -> int:
        return sum(sum(shared.sent[f] for f in fs) for fs in feeders.values())

    def received() -> int:
        return sum(shared.recv[s] for s in range(len(subs)))

    go = time.monotonic_ns() + 50_000_000
    cpu0 = broker.cpu_seconds()
    busy0 = machine_busy_seconds()
    workers.send(("go", go))
    # publishing phase (bounded by the publishers' own deadline, plus a grace period)
    end_pub = time.monotonic() + 0.05 + duration + 5.0
    while time.monotonic() < end_pub and not all(shared.done[p.index] for p in pubs):
        time.sleep(0.01)
    # drain phase
    drain_end = time.monotonic() + params.max_drain
    last_count, last_change = received(), time.monotonic()
    while time.monotonic() < drain_end:
        got = received()
        if got >= expected():
            break
        if got != last_count:
            last_count, last_change = got, time.monotonic()
        elif time.monotonic() - last_change > params.stall:
            break
        time.sleep(0.01)
    end_ns = time.monotonic_ns()
    cpu1 = broker.cpu_seconds() if broker.alive() else cpu0
    busy1 = machine_busy_seconds()
    exp_total = expected()
    results = workers.finish()
    err = _first_error(results)
    recv_total = sum(r.get("received", 0) for r in results)
    sent_total = sum(r.get("sent", 0) for r in results)
    last = max((r.get("last_recv_ns", 0) for r in results), default=0)
    elapsed = max(1e-9, ((last or end_ns) - go) / 1e9)
    wall = max(1e-9, (end_ns - go) / 1e9)
    lost = max(0, exp_total - recv_total)
    details: dict[str, Any] = {
        "clients": n,
        "sent": sent_total,
        "expected": exp_total,
        "received": recv_total,
        "duplicates_or_extra": max(0, recv_total - exp_total),
        "acked": sum(r.get("acked", 0) for r in results) if qos else None,
        "seconds": round(elapsed, 3),
        "delivered_per_s": round(recv_total / elapsed, 1),
        "broker_cpu_pct": round(100 * (cpu1 - cpu0) / wall, 1),
        "broker_cpu_us_per_msg": round(1e6 * (cpu1 - cpu0) / max(1, recv_total), 3),
        "loadgen_cpu_pct": round(100 * sum(r.get("cpu", 0.0) for r in results) / wall, 1),
        "machine_cpu_pct": round(100 * (busy1 - busy0) / wall, 1),
        "disconnected": sum(r.get("disconnected", 0) for r in results),
        "unexpected_packets": sum(r.get("unexpected", 0) for r in results),
        "deliveries_per_read": round(
            recv_total / max(1, sum(r.get("sub_reads", 0) for r in results)), 1
        ),
        "broker_alive": broker.alive(),
    }
    if latency:
        lat = array("q")
        for r in results:
            lat.frombytes(r.get("latencies", b""))
        values = sorted(lat)
        details["offered_per_s"] = rate
        details["samples"] = len(values)
        if values:

            def pct(q: float) -> float:
                return round(values[min(len(values) - 1, int(q * len(values)))] / 1e6, 3)

            details.update(
                p50_ms=pct(0.50),
                p99_ms=pct(0.99),
                p999_ms=pct(0.999),
                max_ms=round(values[-1] / 1e6, 3),
            )
        value = details.get("p99_ms")
    else:
        value = details["delivered_per_s"]
    if not broker.alive():
        err = err or f"broker died: {broker.log_tail()}"
    return Result(name, broker.name, metric, value, unit, lost=lost, details=details, error=err)


# ------------------------------------------------------------------------------ connections


def run_connrate(
    broker: Broker,
    params: Params,
    name: str = "connrate",
    *,
    clean: bool = True,
    tls: bool = False,
    at_once: int | None = None,
) -> Result:
    """Connect cycles; ``at_once`` connects in flight in all (None: ``conn_concurrency``
    per worker)."""
    global _run_counter
    _run_counter += 1
    nw = params.workers
    per = params.conn_count // nw
    concurrency = params.conn_concurrency if at_once is None else max(1, at_once // nw)
    specs = [
        WorkerSpec(
            "connrate",
            broker.host,
            broker.tls_port if tls else broker.port,
            _source_ip(w),
            duration=params.conn_duration,
            count=per,
            concurrency=concurrency,
            client_prefix=f"cr{_run_counter}w{w}-",
            clean=clean,
            tls=tls,
            cpus=params.loadgen_cpus,
        )
        for w in range(nw)
    ]
    workers = _Workers(specs, None)
    workers.collect("ready", 30.0)
    go = time.monotonic_ns() + 50_000_000
    net0 = tcpext()
    cpu0 = broker.cpu_seconds()
    busy0 = machine_busy_seconds()
    workers.send(("go", go))
    results = workers.collect("result", params.conn_duration + 30.0)
    workers.finish(stop=False)
    end_ns = time.monotonic_ns()
    cpu1 = broker.cpu_seconds() if broker.alive() else cpu0
    busy1 = machine_busy_seconds()
    wall = max(1e-9, (end_ns - go) / 1e9)
    ok = sum(r.get("ok", 0) for r in results)
    failed = sum(r.get("failed", 0) for r in results)
    last = max((r.get("last_ns", 0) for r in results), default=0)
    elapsed = max(1e-9, ((last or end_ns) - go) / 1e9)
    errors = [e for r in results for e in r.get("errors", [])][:3]
    details = {
        "connects": ok,
        "failed": failed,
        "at_once": concurrency * nw,
        "seconds": round(elapsed, 3),
        "broker_cpu_pct": round(100 * (cpu1 - cpu0) / wall, 1),
        "broker_cpu_us_per_msg": round(1e6 * (cpu1 - cpu0) / max(1, ok), 3),
        "loadgen_cpu_pct": round(100 * sum(r.get("cpu", 0.0) for r in results) / wall, 1),
        "machine_cpu_pct": round(100 * (busy1 - busy0) / wall, 1),
        "errors": errors,
        **tcpext_delta(net0),
    }
    err = _first_error(results) or (f"{failed} connects failed: {errors}" if failed else None)
    return Result(
        name,
        broker.name,
        "connects",
        round(ok / elapsed, 1),
        "conn/s",
        lost=failed,
        details=details,
        error=err,
    )


def run_storm(broker: Broker, params: Params, name: str = "storm-5000") -> Result:
    """``storm_conns`` connections opened at once (one connect attempt in flight per
    device) and held; connects/s over the time until the last CONNACK."""
    global _run_counter
    _run_counter += 1
    mqtt_ping(broker.host, broker.port, f"warm{_run_counter}")
    nw = params.workers
    total = params.storm_conns
    counts = [total // nw + (1 if w < total % nw else 0) for w in range(nw)]
    specs = [
        WorkerSpec(
            "idle",
            broker.host,
            broker.port,
            _source_ip(w),
            count=counts[w],
            concurrency=counts[w],
            client_prefix=f"storm{_run_counter}w{w}-",
            keepalive=600,
            cpus=params.loadgen_cpus,
        )
        for w in range(nw)
    ]
    net0 = tcpext()
    cpu0 = broker.cpu_seconds()
    workers = _Workers(specs, None)
    ready = workers.collect("ready", 120.0)
    cpu1 = broker.cpu_seconds() if broker.alive() else cpu0
    net = tcpext_delta(net0)
    workers.finish()
    ok = sum(r.get("ok", 0) for r in ready)
    failed = sum(r.get("failed", 0) for r in ready)
    seconds = max((r.get("seconds", 0.0) for r in ready), default=0.0)
    errors = [e for r in ready for e in r.get("errors", [])][:3]
    details = {
        "connections": ok,
        "failed": failed,
        "seconds": round(seconds, 3),
        "broker_cpu_us_per_msg": round(1e6 * (cpu1 - cpu0) / max(1, ok), 3),
        "errors": errors,
        **net,
    }
    err = _first_error(ready) or (f"{failed} connects failed: {errors}" if failed else None)
    return Result(
        name,
        broker.name,
        "connects",
        round(ok / seconds, 1) if seconds else None,
        "conn/s",
        lost=failed,
        details=details,
        error=err,
    )


def run_idle_memory(broker: Broker, params: Params) -> Result:
    global _run_counter
    _run_counter += 1
    for i in range(20):  # warm-up: first connections allocate per-process structures
        mqtt_ping(broker.host, broker.port, f"warm{_run_counter}-{i}")
    time.sleep(0.5)
    before = broker.rss_kib()
    nw = params.workers
    counts = [params.idle_conns // nw + (1 if w < params.idle_conns % nw else 0) for w in range(nw)]
    specs = [
        WorkerSpec(
            "idle",
            broker.host,
            broker.port,
            _source_ip(w),
            count=counts[w],
            concurrency=params.conn_concurrency,
            client_prefix=f"idle{_run_counter}w{w}-",
            keepalive=600,
            cpus=params.loadgen_cpus,
        )
        for w in range(nw)
    ]
    workers = _Workers(specs, None)
    ready = workers.collect("ready", 120.0)
    time.sleep(1.0)  # let the broker settle
    after = broker.rss_kib() if broker.alive() else before
    results = workers.finish()
    ok = sum(r.get("ok", 0) for r in ready)
    failed = sum(r.get("failed", 0) for r in ready)
    dropped = sum(r.get("dropped", 0) for r in results)
    errors = [e for r in ready for e in r.get("errors", [])][:3]
    per = (after - before) / ok if ok else None
    details = {
        "connections": ok,
        "failed": failed,
        "dropped_while_idle": dropped,
        "rss_before_kib": before,
        "rss_after_kib": after,
        "errors": errors,
    }
    err = _first_error(ready) or (f"{failed} connects failed: {errors}" if failed else None)
    return Result(
        "idle-memory",
        broker.name,
        "RSS per connection",
        round(per, 3) if per is not None else None,
        "KiB",
        lost=failed + dropped,
        details=details,
        error=err,
    )


def run_scenario(name: str, broker: Broker, params: Params) -> Result:
    if name == "connrate":
        return run_connrate(broker, params)
    if name.startswith("connrate-"):
        parts = name.split("-")
        return run_connrate(
            broker, params, name, clean=parts[1] == "clean", tls="tls" in parts,
            at_once=int(parts[-1]),
        )
    if name.startswith("storm-"):
        return run_storm(broker, params, name)
    if name == "idle-memory":
        return run_idle_memory(broker, params)
    kind, _, q = name.partition("-qos")
    q, _, variant = q.partition("-")
    qos = int(q)
    if variant == "persistent":
        return run_traffic(broker, params, kind, qos, persistent=True)
    if kind == "latency":
        return run_traffic(broker, params, "p2p", qos, rate=params.latency_rate)
    if kind == "latency-devices":
        return run_traffic(broker, params, "devices", qos, rate=params.latency_rate)
    return run_traffic(broker, params, kind, qos)
