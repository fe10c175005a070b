"""The load generator: worker processes, each one uvloop event loop of raw asyncio protocols.

A scenario (see :mod:`bench.scenarios`) splits its clients over several worker processes
(fork). Each worker runs :func:`worker_main` and talks to the parent over a pipe, in phases:

1. connect its clients (subscribers subscribe and wait for SUBACK), then send ``ready``;
2. on ``go`` (a ``time.monotonic_ns()`` start time, one clock for all processes), run its
   publishers until their deadline or message cap;
3. on ``stop``, send DISCONNECT, close, and send ``result`` (counts, CPU time, latencies).

Cross-process flow control without locks: the parent allocates shared arrays before the
fork; ``sent[p]`` is written only by publisher ``p``, ``recv[s]`` only by subscriber ``s``.
A closed-loop publisher sends while every subscriber it feeds has fewer than ``window``
messages outstanding (sum of the sent counts of that subscriber's feeders minus what it
received), so the measured rate is what the broker delivers, not what piles up in its
buffers, and a bounded broker queue (1,000 messages per session in gatewayd and mosquitto)
never overflows because of the load generator. QoS 1 publishers also keep at most
``inflight`` PUBLISH packets unacknowledged.

Nothing is decoded into objects: :class:`Client` walks fixed headers, counts PUBLISH
packets, answers PUBACK for QoS 1 deliveries in one write per read, and reads the
timestamp at the start of the payload only in latency runs.

Every wait is bounded: connects, SUBACKs and PUBACK stalls time out, and the parent kills
a worker that does not answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

from bench import wire

monotonic_ns = time.monotonic_ns

BATCH = 64  # most PUBLISH packets joined into one write
CONNECT_TIMEOUT = 20.0
PUBACK_STALL = 1.0  # a QoS 1 publisher re-checks its deadline this often while blocked


# ------------------------------------------------------------------------------ specs


@dataclass
class PubSpec:
    index: int  # slot in the shared ``sent`` array
    client_id: str
    topic: str
    qos: int
    # (subscriber slot, publisher slots that feed it) for every subscriber this one feeds
    targets: list[tuple[int, list[int]]]
    cap: int  # most messages this publisher sends
    rate: float | None = None  # messages/s (open loop, timestamped) or None (closed loop)
    # open loop: where in its period this publisher's schedule starts (0 <= phase < 1), so
    # that many slow publishers (devices) do not all send in the same millisecond
    phase: float = 0.0


@dataclass
class SubSpec:
    index: int  # slot in the shared ``recv`` array
    client_id: str
    topic_filter: str
    qos: int
    latency: bool = False
    clean: bool = True  # False: a persistent session (durable on a durable broker)


@dataclass
class WorkerSpec:
    mode: str  # "traffic" | "connrate" | "idle"
    host: str
    port: int
    source_ip: str
    pubs: list[PubSpec] = field(default_factory=list)
    subs: list[SubSpec] = field(default_factory=list)
    duration: float = 5.0
    window: int = 500
    inflight: int = 32
    # connrate / idle
    count: int = 0
    concurrency: int = 32
    client_prefix: str = "c"
    keepalive: int = 60
    clean: bool = True  # connrate: clean sessions, or new persistent ones
    tls: bool = False  # connect with TLS (no certificate check: the broker's is self-signed)
    cpus: tuple[int, ...] = ()  # CPUs this worker is pinned to (empty: any)
    # traffic: SO_RCVLOWAT of QoS 0 throughput subscribers (0: the kernel's default, 1)
    rcvlowat: int = 0


class Shared:
    """Arrays shared by the parent and its forked workers (allocated before the fork)."""

    def __init__(self, n_pubs: int, n_subs: int) -> None:
        from multiprocessing.sharedctypes import RawArray

        self.sent = RawArray("q", max(n_pubs, 1))
        self.done = RawArray("q", max(n_pubs, 1))
        self.recv = RawArray("q", max(n_subs, 1))
        self.acked = RawArray("q", max(n_pubs, 1))


# ------------------------------------------------------------------------------ protocol


class Client(asyncio.Protocol):
    """One MQTT connection of the load generator."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        recv_arr: Any = None,
        recv_slot: int = -1,
        latencies: array[int] | None = None,
    ) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.pending = b""
        self.connack: asyncio.Future[int] = loop.create_future()
        self.suback: asyncio.Future[bytes] = loop.create_future()
        self.lost: asyncio.Future[None] = loop.create_future()
        self.received = 0
        self.acked = 0
        self.ack_waiter: asyncio.Future[None] | None = None
        self.drain_waiter: asyncio.Future[None] | None = None
        self.paused = False
        self.recv_arr = recv_arr
        self.recv_slot = recv_slot
        self.latencies = latencies
        self.first_recv_ns = 0
        self.last_recv_ns = 0
        self.unexpected = 0  # packets of a type we did not expect
        self.reads = 0  # data_received calls (bytes per read tells how the broker writes)

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)
        for fut in (self.connack, self.suback):
            if not fut.done():
                fut.set_exception(ConnectionError("connection lost"))
                fut.exception()  # whoever awaits it still gets it; nobody else warns
        self._wake()
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_result(None)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.drain_waiter is not None and not self.drain_waiter.done():
            self.drain_waiter.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.reads += 1
        if self.pending:
            data = self.pending + data
        n = len(data)
        i = 0
        got = 0
        acked = 0
        acks: bytearray | None = None
        lat = self.latencies
        now = monotonic_ns() if lat is not None else 0
        while i + 2 <= n:
            b0 = data[i]
            rl = data[i + 1]
            j = i + 2
            if rl & 0x80:
                rl &= 0x7F
                shift = 7
                complete = False
                while j < n:
                    b = data[j]
                    j += 1
                    rl |= (b & 0x7F) << shift
                    if not b & 0x80:
                        complete = True
                        break
                    shift += 7
                if not complete:
                    break
            end = j + rl
            if end > n:
                break
            kind = b0 >> 4
            if kind == 3:
                got += 1
                if b0 & 0x06 or lat is not None:
                    p = j + 2 + ((data[j] << 8) | data[j + 1])
                    if b0 & 0x06:
                        if acks is None:
                            acks = bytearray()
                        acks += wire.PUBACK_HEAD
                        acks += data[p : p + 2]
                        p += 2
                    if lat is not None:
                        lat.append(now - int.from_bytes(data[p : p + 8], "big"))
            elif kind == 4:
                acked += 1
            elif kind == 2:
                if not self.connack.done():
                    self.connack.set_result(data[j + 1])
            elif kind == 9:
                if not self.suback.done():
                    self.suback.set_result(bytes(data[j + 2 : end]))
            elif kind != 13:
                self.unexpected += 1
            i = end
        self.pending = data[i:] if i < n else b""
        if got:
            self.received += got
            if self.recv_slot >= 0:
                self.recv_arr[self.recv_slot] = self.received
            t = monotonic_ns()
            if not self.first_recv_ns:
                self.first_recv_ns = t
            self.last_recv_ns = t
            if acks is not None and self.transport is not None:
                self.transport.write(bytes(acks))
        if acked:
            self.acked += acked
            self._wake()

    # helpers

    def _wake(self) -> None:
        w = self.ack_waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def wait_ack(self, timeout: float) -> None:
        self.ack_waiter = self.loop.create_future()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.ack_waiter, timeout)
        self.ack_waiter = None

    async def wait_drained(self, timeout: float) -> None:
        self.drain_waiter = self.loop.create_future()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.drain_waiter, timeout)
        self.drain_waiter = None

    def close(self) -> None:
        tr = self.transport
        if tr is not None and not tr.is_closing():
            with contextlib.suppress(Exception):
                tr.write(wire.DISCONNECT)
            tr.close()


_TLS: list[ssl.SSLContext] = []


def _client_tls() -> ssl.SSLContext:
    """One client context per worker: TLS 1.2/1.3, no certificate check, no session
    resumption (every connect is a full handshake, the reconnect-storm case)."""
    if not _TLS:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        _TLS.append(ctx)
    return _TLS[0]


SOURCE_IP_EVERY = 2000  # connrate: connects from one source address before the next


def source_ip(spec: WorkerSpec, nth: int) -> str:
    """The source address of a worker's ``nth`` connect: ``spec.source_ip`` for the first
    ``SOURCE_IP_EVERY``, then another one (second octet 2..251) per ``SOURCE_IP_EVERY``.
    A client that closes first (MQTT's rule after DISCONNECT) keeps each port in
    TIME_WAIT for a minute, and with tens of thousands of connects from one address the
    kernel's search for a free port to bind took the load generator's whole core."""
    block = nth // SOURCE_IP_EVERY
    if not block:
        return spec.source_ip
    octets = spec.source_ip.split(".")
    octets[1] = str(2 + (block - 1) % 250)
    return ".".join(octets)


async def open_client(
    loop: asyncio.AbstractEventLoop,
    spec: WorkerSpec,
    client_id: str,
    clean: bool = True,
    nth: int = 0,
    **kwargs: Any,
) -> Client:
    _, client = await asyncio.wait_for(
        loop.create_connection(
            lambda: Client(loop, **kwargs),
            spec.host,
            spec.port,
            local_addr=(source_ip(spec, nth), 0),
            ssl=_client_tls() if spec.tls else None,
        ),
        CONNECT_TIMEOUT,
    )
    assert client.transport is not None
    client.transport.write(wire.connect(client_id, spec.keepalive, clean))
    rc = await asyncio.wait_for(client.connack, CONNECT_TIMEOUT)
    if rc != 0:
        client.close()
        raise ConnectionError(f"CONNACK return code {rc}")
    return client


# ------------------------------------------------------------------------------ publishers


async def closed_loop_publisher(
    client: Client, spec: PubSpec, ws: WorkerSpec, shared: Shared, deadline: int
) -> int:
    ring = wire.publish_ring(spec.topic, spec.qos)
    ring_len = len(ring)
    sent_arr, recv_arr = shared.sent, shared.recv
    targets = [(s, feeders) for s, feeders in spec.targets]
    window, inflight, qos, cap, idx = ws.window, ws.inflight, spec.qos, spec.cap, spec.index
    assert client.transport is not None
    write = client.transport.write
    sleep = asyncio.sleep
    k = 0
    sent = 0
    while sent < cap and monotonic_ns() < deadline and not client.lost.done():
        room = min(BATCH, cap - sent)
        for s, feeders in targets:
            if len(feeders) == 1:
                free = window - (sent_arr[feeders[0]] - recv_arr[s])
            else:
                # feeders in other processes read the same figure at the same time: take a
                # share only, so that together they never overshoot the window
                free = window - (sum([sent_arr[f] for f in feeders]) - recv_arr[s])
                if free > 0:
                    free = max(1, free // len(feeders))
            if free < room:
                room = free
        if qos and inflight - (sent - client.acked) < room:
            room = inflight - (sent - client.acked)
            if room <= 0:
                await client.wait_ack(PUBACK_STALL)
                continue
        if room <= 0:
            await sleep(0.001)
            continue
        if client.paused:
            await client.wait_drained(PUBACK_STALL)
            continue
        end = k + room
        if end <= ring_len:
            chunk = ring[k:end]
        else:
            end -= ring_len
            chunk = ring[k:] + ring[:end]
        k = end
        write(b"".join(chunk))
        sent += room
        sent_arr[idx] = sent
        await sleep(0)
    return sent


def open_loop_due(elapsed_ns: int, rate: float, phase: float) -> tuple[int, int]:
    """An open-loop schedule: message k is due ``(k + phase) / rate`` seconds after the
    start. Returns (messages due by ``elapsed_ns``, ns from then until the next is due)."""
    period = 1e9 / rate
    offset = phase * period
    due = 0 if elapsed_ns < offset else int((elapsed_ns - offset) / period) + 1
    return due, int(offset + due * period) - elapsed_ns


async def open_loop_publisher(
    client: Client, spec: PubSpec, ws: WorkerSpec, shared: Shared, start: int, deadline: int
) -> int:
    """Timestamped messages at ``spec.rate`` per second: what is due is sent, then the
    publisher sleeps until the next message is due (at least 1 ms)."""
    assert spec.rate is not None
    msg = wire.TimestampedPublish(spec.topic, spec.qos)
    sent_arr, idx, qos, inflight, cap = shared.sent, spec.index, spec.qos, ws.inflight, spec.cap
    rate, phase = spec.rate, spec.phase
    assert client.transport is not None
    write = client.transport.write
    sent = 0
    pid = 0
    while not client.lost.done():
        now = monotonic_ns()
        if now >= deadline or sent >= cap:
            break
        due, wait_ns = open_loop_due(now - start, rate, phase)
        n = min(due - sent, cap - sent)
        if qos:
            n = min(n, inflight - (sent - client.acked))
        if n > 0:
            parts = []
            for _ in range(n):
                pid = pid % 65535 + 1
                parts.append(msg.build(now, pid))
            write(b"".join(parts))
            sent += n
            sent_arr[idx] = sent
        # behind (the inflight window was full): look again in 1 ms
        await asyncio.sleep(0.001 if sent < due else max(0.001, wait_ns / 1e9))
    return sent


# ------------------------------------------------------------------------------ worker


class _Inbox:
    """Messages from the parent, read on the event loop (no thread)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, pipe: Connection) -> None:
        self.pipe = pipe
        self.queue: asyncio.Queue[Any] = asyncio.Queue()
        loop.add_reader(pipe.fileno(), self._readable)

    def _readable(self) -> None:
        while self.pipe.poll():
            try:
                self.queue.put_nowait(self.pipe.recv())
            except EOFError:
                self.queue.put_nowait(("stop",))
                asyncio.get_running_loop().remove_reader(self.pipe.fileno())
                return

    async def get(self, kind: str) -> Any:
        while True:
            msg = await self.queue.get()
            if msg[0] == kind or msg[0] == "stop":
                return msg


async def _connect_many(
    loop: asyncio.AbstractEventLoop, ws: WorkerSpec, ids: Sequence[str], concurrency: int
) -> tuple[list[Client], int, list[str]]:
    clients: list[Client] = []
    failed = 0
    errors: list[str] = []
    it = iter(ids)

    async def runner() -> None:
        nonlocal failed
        for cid in it:
            try:
                clients.append(await open_client(loop, ws, cid))
            except (TimeoutError, OSError, ConnectionError) as exc:
                failed += 1
                if len(errors) < 5:
                    errors.append(f"{cid}: {exc!r}")

    await asyncio.gather(*(runner() for _ in range(concurrency)))
    return clients, failed, errors


async def _traffic(pipe: Connection, ws: WorkerSpec, shared: Shared) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    inbox = _Inbox(loop, pipe)
    subs: list[tuple[SubSpec, Client]] = []
    pubs: list[tuple[PubSpec, Client]] = []
    latencies: array[int] = array("q")
    try:
        for s in ws.subs:
            c = await open_client(
                loop,
                ws,
                s.client_id,
                clean=s.clean,
                recv_arr=shared.recv,
                recv_slot=s.index,
                latencies=latencies if s.latency else None,
            )
            assert c.transport is not None
            c.transport.write(wire.subscribe(1, s.topic_filter, s.qos))
            granted = await asyncio.wait_for(c.suback, CONNECT_TIMEOUT)
            if granted[:1] != bytes([s.qos]):
                raise ConnectionError(f"SUBACK {granted!r} for {s.topic_filter} qos {s.qos}")
            subs.append((s, c))
        for p in ws.pubs:
            pubs.append((p, await open_client(loop, ws, p.client_id)))
    except (TimeoutError, OSError, ConnectionError) as exc:
        pipe.send(("ready", {"error": repr(exc)}))
        await inbox.get("stop")
        for _, c in subs + pubs:
            c.close()
        return {"error": repr(exc)}
    coalesced = _coalesce_reads(ws, subs)
    pipe.send(("ready", {}))
    msg = await inbox.get("go")
    cpu0 = time.process_time()
    if msg[0] == "go":
        start = msg[1]
        deadline = start + int(ws.duration * 1e9)
        await asyncio.sleep(max(0.0, (start - monotonic_ns()) / 1e9))

        async def one(p: PubSpec, c: Client) -> None:
            if p.rate is None:
                n = await closed_loop_publisher(c, p, ws, shared, deadline)
            else:
                n = await open_loop_publisher(c, p, ws, shared, start, deadline)
            shared.sent[p.index] = n
            shared.done[p.index] = 1

        async def acks() -> None:
            # keep the shared acked counts fresh for the parent's drain check
            while True:
                for p, c in pubs:
                    shared.acked[p.index] = c.acked
                await asyncio.sleep(0.05)

        async def uncoalesce() -> None:
            # once every publisher (of every worker) is done, the tail below the low-water
            # mark must still be read
            while not all(shared.done):
                await asyncio.sleep(0.005)
            for sock in coalesced:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)

        ack_task = loop.create_task(acks())
        tasks = [loop.create_task(one(p, c)) for p, c in pubs]
        if coalesced:
            tasks.append(loop.create_task(uncoalesce()))
        await inbox.get("stop")
        ack_task.cancel()
        for t in tasks:
            t.cancel()
    cpu = time.process_time() - cpu0
    result: dict[str, Any] = {
        "received": sum(c.received for _, c in subs),
        "sent": sum(shared.sent[p.index] for p, _ in pubs),
        "acked": sum(c.acked for _, c in pubs),
        "first_recv_ns": min((c.first_recv_ns for _, c in subs if c.first_recv_ns), default=0),
        "last_recv_ns": max((c.last_recv_ns for _, c in subs), default=0),
        "disconnected": sum(1 for _, c in subs + pubs if c.lost.done()),
        "unexpected": sum(c.unexpected for _, c in subs + pubs),
        "sub_reads": sum(c.reads for _, c in subs),
        "cpu": cpu,
        "latencies": latencies.tobytes() if len(latencies) else b"",
    }
    for _, c in subs + pubs:
        c.close()
    await asyncio.sleep(0.05)
    return result


def _coalesce_reads(ws: WorkerSpec, subs: list[tuple[SubSpec, Client]]) -> list[Any]:
    """Set SO_RCVLOWAT on the QoS 0 throughput subscribers: the kernel wakes the load
    generator for a read only once ``ws.rcvlowat`` bytes wait. A broker that writes each
    delivery in its own send() otherwise costs the load generator one read (a Python
    callback) per 2-3 messages: a check of whether that, not the broker, sets the figure
    (bench/README.md; off by default, it raises the broker's own cost). QoS 1
    subscribers are left alone: the broker's inflight window (20 in mosquitto) may hold
    less than the mark. Returns the sockets set."""
    if not ws.rcvlowat:
        return []
    socks = []
    for spec, c in subs:
        if spec.qos == 0 and not spec.latency and c.transport is not None:
            sock = c.transport.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, ws.rcvlowat)
            socks.append(sock)
    return socks


async def _connrate(pipe: Connection, ws: WorkerSpec) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    inbox = _Inbox(loop, pipe)
    pipe.send(("ready", {}))
    msg = await inbox.get("go")
    if msg[0] != "go":
        return {"ok": 0, "failed": 0}
    start = msg[1]
    deadline = start + int(ws.duration * 1e9)
    await asyncio.sleep(max(0.0, (start - monotonic_ns()) / 1e9))
    cpu0 = time.process_time()
    ok = failed = 0
    errors: list[str] = []
    counter = iter(range(ws.count))
    last = 0

    async def runner() -> None:
        nonlocal ok, failed, last
        for i in counter:
            if monotonic_ns() >= deadline:
                return
            cid = f"{ws.client_prefix}{i}"
            try:
                c = await open_client(loop, ws, cid, ws.clean, nth=i)
            except (TimeoutError, OSError, ConnectionError) as exc:
                failed += 1
                if len(errors) < 5:
                    errors.append(f"{cid}: {exc!r}")
                continue
            ok += 1
            last = monotonic_ns()
            c.close()

    await asyncio.gather(*(runner() for _ in range(ws.concurrency)))
    cpu = time.process_time() - cpu0
    await asyncio.sleep(0.05)
    return {"ok": ok, "failed": failed, "errors": errors, "last_ns": last, "cpu": cpu}


async def _idle(pipe: Connection, ws: WorkerSpec) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    inbox = _Inbox(loop, pipe)
    ids = [f"{ws.client_prefix}{i}" for i in range(ws.count)]
    t0 = monotonic_ns()
    clients, failed, errors = await _connect_many(loop, ws, ids, ws.concurrency)
    seconds = (monotonic_ns() - t0) / 1e9
    pipe.send(
        ("ready", {"ok": len(clients), "failed": failed, "errors": errors, "seconds": seconds})
    )
    await inbox.get("stop")
    dropped = sum(1 for c in clients if c.lost.done())
    for c in clients:
        c.close()
    await asyncio.sleep(0.1)
    return {"ok": len(clients), "failed": failed, "dropped": dropped, "errors": errors}


def worker_main(pipe: Connection, ws: WorkerSpec, shared: Shared | None) -> None:
    """Entry point of a forked worker process."""
    import uvloop

    # the parent may have run an event loop before forking: start from a clean slate
    asyncio.set_event_loop_policy(None)
    if ws.cpus:
        os.sched_setaffinity(0, ws.cpus)

    async def main() -> dict[str, Any]:
        if ws.mode == "traffic":
            assert shared is not None
            return await _traffic(pipe, ws, shared)
        if ws.mode == "connrate":
            return await _connrate(pipe, ws)
        return await _idle(pipe, ws)

    try:
        result = uvloop.run(main())
    except BaseException as exc:  # report anything to the parent rather than dying silently
        import traceback

        result = {"error": repr(exc), "traceback": traceback.format_exc()}
    # the event loop watched the pipe and left it non-blocking: a large result (latency
    # samples) would fail with EAGAIN half-way
    with contextlib.suppress(OSError):
        os.set_blocking(pipe.fileno(), True)
    with contextlib.suppress(OSError, BrokenPipeError):
        pipe.send(("result", result))
    pipe.close()
    os._exit(0)
