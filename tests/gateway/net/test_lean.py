"""The lean transport (gateway/net/lean.py) on real loopback sockets, on uvloop (what
gatewayd runs) and on asyncio's own loop: partial writes to a peer that does not read,
half-close with output pending, peer RST, EOF, pause/resume reading (also with a peer
that hangs up meanwhile), the slow-reader drop through the stream shell, and 2,000
connections opened and closed leaving no fd and no table slot behind.

Waiting is on events (futures the protocol resolves), bounded by ``wait_for``; nothing
asserts on time."""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import uvloop

from gateway.config import ConfigError, load_config
from gateway.config.listeners import DEFAULT_TRANSPORT
from gateway.net import lean
from gateway.net.lean import LeanServer, LeanTransport, start_lean_server
from gateway.net.stream import ListenerLimits, StreamShell, start_stream_listener
from protocols.effects import Effect

BOUND = 20.0  # seconds: a bound on waiting for an event, never a figure under test
LOOPS = {"uvloop": uvloop.new_event_loop, "asyncio": asyncio.new_event_loop}


@pytest.fixture(params=sorted(LOOPS))
def run(request: pytest.FixtureRequest) -> Callable[[Awaitable[Any]], Any]:
    def runner(main: Awaitable[Any]) -> Any:
        with asyncio.Runner(loop_factory=LOOPS[request.param]) as r:
            return r.run(main)  # type: ignore[arg-type]

    return runner


class Recorder(asyncio.Protocol):
    """Records what the transport tells it; futures for the events tests wait on."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.transport: LeanTransport | None = None
        self.data = bytearray()
        self.made: asyncio.Future[None] = loop.create_future()
        self.lost: asyncio.Future[Exception | None] = loop.create_future()
        self.eof: asyncio.Future[None] = loop.create_future()
        self.got: asyncio.Event = asyncio.Event()
        self.paused = 0
        self.resumed = 0
        self.resumed_event = asyncio.Event()
        self.keep_open = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.made.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.data += data
        self.got.set()

    def eof_received(self) -> bool:
        self.eof.set_result(None)
        return self.keep_open

    def pause_writing(self) -> None:
        self.paused += 1

    def resume_writing(self) -> None:
        self.resumed += 1
        self.resumed_event.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set_result(exc)


async def serve() -> tuple[LeanServer, list[Recorder], int]:
    protocols: list[Recorder] = []

    def factory() -> Recorder:
        p = Recorder()
        protocols.append(p)
        return p

    server = await start_lean_server(factory, "127.0.0.1", 0, backlog=128)
    return server, protocols, server.sockets[0].getsockname()[1]


async def connect(
    port: int, protocols: list[Recorder], rcvbuf: int = 0
) -> tuple[socket.socket, Recorder]:
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.setblocking(False)
    n = len(protocols)
    await asyncio.get_running_loop().sock_connect(s, ("127.0.0.1", port))
    while len(protocols) <= n:  # the accept callback runs on a later loop turn
        await asyncio.sleep(0)
    p = protocols[n]
    await asyncio.wait_for(p.made, BOUND)
    return s, p


async def recv_all(s: socket.socket, n: int) -> bytes:
    loop = asyncio.get_running_loop()
    out = bytearray()
    while len(out) < n:
        chunk = await asyncio.wait_for(loop.sock_recv(s, 65536), BOUND)
        assert chunk, f"EOF after {len(out)} of {n} bytes"
        out += chunk
    return bytes(out)


def mask_of(t: LeanTransport) -> int:
    return t.hub.mask(t)


def test_echo_peer_info_and_eof(run: Callable[[Awaitable[Any]], Any]) -> None:
    async def main() -> None:
        server, protocols, port = await serve()
        s, p = await connect(port, protocols)
        t = p.transport
        assert t is not None
        assert t.get_extra_info("peername") == s.getsockname()
        assert t.get_extra_info("sockname") == s.getpeername()
        assert t.get_extra_info("nothing", 7) == 7
        # accepted sockets are TCP_NODELAY, as asyncio's and uvloop's
        dup = t.get_extra_info("socket")
        assert dup.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        dup.close()  # a duplicate: the connection stays open
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(s, b"hello")
        await asyncio.wait_for(p.got.wait(), BOUND)
        assert bytes(p.data) == b"hello"
        t.writelines([b"wor", b"ld"])
        assert await recv_all(s, 5) == b"world"
        s.shutdown(socket.SHUT_WR)
        await asyncio.wait_for(p.eof, BOUND)
        assert await asyncio.wait_for(p.lost, BOUND) is None
        assert t.fd == -1 and p.transport is t
        assert await asyncio.wait_for(loop.sock_recv(s, 10), BOUND) == b""  # we closed
        s.close()
        server.close()
        await server.wait_closed()
        assert server.hub.ep.closed  # the last connection gone, the listener closed

    run(main())


def test_partial_writes_wait_for_epollout_and_flow_control(
    run: Callable[[Awaitable[Any]], Any],
) -> None:
    """A peer that does not read: the kernel takes part, the rest waits in wbuf with
    EPOLLOUT; pause_writing above the high-water mark; once the peer reads, all of it
    arrives in order, resume_writing is called and EPOLLOUT is dropped."""

    async def main() -> None:
        server, protocols, port = await serve()
        s, p = await connect(port, protocols, rcvbuf=4096)
        t = p.transport
        assert t is not None
        blob = os.urandom(4 << 20)
        t.write(blob)
        assert t.get_write_buffer_size() > lean.HIGH_WATER
        assert p.paused == 1 and p.resumed == 0
        assert mask_of(t) & lean.EPOLLOUT
        t.write(b"tail")  # appended behind the pending bytes
        got = await recv_all(s, len(blob) + 4)
        assert got == blob + b"tail"
        await asyncio.wait_for(p.resumed_event.wait(), BOUND)
        assert t.wbuf is None and t.get_write_buffer_size() == 0
        assert mask_of(t) == lean.EPOLLIN
        s.close()
        await asyncio.wait_for(p.lost, BOUND)
        server.close()

    run(main())


def test_close_sends_pending_output_first_and_abort_drops_it(
    run: Callable[[Awaitable[Any]], Any],
) -> None:
    async def main() -> None:
        server, protocols, port = await serve()
        s, p = await connect(port, protocols, rcvbuf=4096)
        t = p.transport
        assert t is not None
        blob = os.urandom(1 << 20) * 16  # more than the kernel takes at once
        t.write(blob)
        assert t.get_write_buffer_size() > 0
        t.close()
        assert t.is_closing() and not p.lost.done()
        t.write(b"ignored")  # a closing transport ignores writes, as asyncio's
        assert await recv_all(s, len(blob)) == blob
        loop = asyncio.get_running_loop()
        assert await asyncio.wait_for(loop.sock_recv(s, 10), BOUND) == b""
        assert await asyncio.wait_for(p.lost, BOUND) is None
        s.close()

        s2, p2 = await connect(port, protocols, rcvbuf=4096)
        t2 = p2.transport
        assert t2 is not None
        big = blob
        t2.write(big)
        assert t2.get_write_buffer_size() > 0  # more than the kernel takes at once
        t2.abort()
        assert await asyncio.wait_for(p2.lost, BOUND) is None
        got = bytearray()
        while True:
            try:
                chunk = await asyncio.wait_for(loop.sock_recv(s2, 65536), BOUND)
            except ConnectionResetError:
                break
            if not chunk:
                break
            got += chunk
        assert len(got) < len(big)  # the rest was dropped
        s2.close()
        server.close()

    run(main())


def test_half_close_with_pending_output(run: Callable[[Awaitable[Any]], Any]) -> None:
    """write_eof with output pending: the FIN follows the last byte, and we still read
    what the peer sends after it (the shell's LINGER relies on this)."""

    async def main() -> None:
        server, protocols, port = await serve()
        s, p = await connect(port, protocols, rcvbuf=4096)
        t = p.transport
        assert t is not None
        blob = os.urandom(1 << 20) * 16  # more than the kernel takes at once
        t.write(blob)
        t.write_eof()
        assert not t.is_closing() and t.get_write_buffer_size() > 0
        with pytest.raises(RuntimeError):
            t.write(b"after eof")
        assert await recv_all(s, len(blob)) == blob
        loop = asyncio.get_running_loop()
        assert await asyncio.wait_for(loop.sock_recv(s, 10), BOUND) == b""  # our FIN
        await loop.sock_sendall(s, b"still reading")
        await asyncio.wait_for(p.got.wait(), BOUND)
        assert bytes(p.data) == b"still reading"
        s.close()
        assert await asyncio.wait_for(p.lost, BOUND) is None
        server.close()

    run(main())


def test_peer_reset(run: Callable[[Awaitable[Any]], Any]) -> None:
    async def main() -> None:
        server, protocols, port = await serve()
        s, p = await connect(port, protocols)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # RST
        exc = await asyncio.wait_for(p.lost, BOUND)
        assert exc is None or isinstance(exc, ConnectionResetError)
        assert p.transport is not None and p.transport.fd == -1
        server.close()

    run(main())


def test_pause_and_resume_reading(run: Callable[[Awaitable[Any]], Any]) -> None:
    async def main() -> None:
        server, protocols, port = await serve()
        a, pa = await connect(port, protocols)
        b, pb = await connect(port, protocols)
        ta = pa.transport
        assert ta is not None
        ta.pause_reading()
        assert not ta.is_reading() and mask_of(ta) == 0
        loop = asyncio.get_running_loop()
        await loop.sock_sendall(a, b"held")
        # b's bytes are read after a's are queued in the kernel: had a been watched,
        # its input would be handed over in the same poll or an earlier one
        await loop.sock_sendall(b, b"marker")
        await asyncio.wait_for(pb.got.wait(), BOUND)
        assert bytes(pa.data) == b""
        ta.resume_reading()
        await asyncio.wait_for(pa.got.wait(), BOUND)
        assert bytes(pa.data) == b"held"
        # paused, then the peer resets: taken out of the epoll (no spinning on a
        # level-triggered EPOLLHUP), and the loss is seen once reading resumes
        ta.pause_reading()
        a.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        a.close()
        pb.got.clear()
        await loop.sock_sendall(b, b"marker2")
        await asyncio.wait_for(pb.got.wait(), BOUND)
        while not ta.flags & lean.UNWATCHED:  # the hang-up's poll may come a turn later
            await asyncio.sleep(0)
        assert not pa.lost.done()
        ta.resume_reading()
        await asyncio.wait_for(pa.lost, BOUND)
        b.close()
        await asyncio.wait_for(pb.lost, BOUND)
        server.close()

    run(main())


def open_fds() -> int:
    gc.collect()  # sockets an earlier test dropped close when collected
    return len(os.listdir("/proc/self/fd"))


def test_two_thousand_connections_leave_nothing_behind(
    run: Callable[[Awaitable[Any]], Any],
) -> None:
    async def main() -> None:
        server, protocols, port = await serve()
        hub = server.hub
        before = open_fds()
        loop = asyncio.get_running_loop()
        for batch in range(4):
            socks = []
            for _ in range(500):
                s = socket.socket()
                s.setblocking(False)
                await loop.sock_connect(s, ("127.0.0.1", port))
                socks.append(s)
            while len(protocols) < 500 * (batch + 1):
                await asyncio.sleep(0)
            assert hub.count == 500
            for i, s in enumerate(socks):
                if i % 3 == 0:  # a third reset, the rest a clean close
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
            await asyncio.wait_for(
                asyncio.gather(*(p.lost for p in protocols[-500:])), BOUND
            )
        assert len(protocols) == 2000
        assert hub.count == 0
        assert all(t is None for t in hub.table)
        assert not hub.limits
        assert open_fds() == before, os.listdir("/proc/self/fd")
        server.close()
        assert hub.ep.closed

    run(main())


class Blaster:
    """A stream channel that answers any input with ``size`` bytes."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self) -> list[Effect]:
        return []

    def handle_data(self, data: bytes) -> list[Effect]:
        return [b"x" * self.size]

    def on_timer(self, name: str) -> list[Effect]:
        return []

    def connection_lost(self) -> None:
        self.lost.set_result(None)

    def deliver(self, deliveries: object) -> list[Effect]:
        return []

    def release(self, packet_id: int) -> list[Effect]:
        return []

    def kick(self, reason_code: int) -> list[Effect]:
        return []


def test_stream_shell_drops_a_slow_reader_and_refuses_over_max_connections(
    run: Callable[[Awaitable[Any]], Any],
) -> None:
    async def main() -> None:
        limits = ListenerLimits("tcp:t", max_connections=1, max_send_buffer=256 << 10)
        channels: list[Blaster] = []
        shells: list[StreamShell] = []

        def factory(shell: StreamShell, peer: tuple[str, int] | None) -> Blaster:
            assert peer is not None and peer[0] == "127.0.0.1"
            shells.append(shell)
            channels.append(Blaster(16 << 20))
            return channels[-1]

        server = await start_stream_listener("127.0.0.1:0", limits, factory, transport="lean")
        assert isinstance(server, LeanServer)
        port = server.sockets[0].getsockname()[1]
        loop = asyncio.get_running_loop()
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.setblocking(False)
        await loop.sock_connect(s, ("127.0.0.1", port))
        # a second client while the first is connected: refused before any channel
        s2 = socket.socket()
        s2.setblocking(False)
        await loop.sock_connect(s2, ("127.0.0.1", port))
        assert await asyncio.wait_for(loop.sock_recv(s2, 10), BOUND) == b""
        s2.close()
        assert limits.refused == 1 and len(channels) == 1
        await loop.sock_sendall(s, b"go")  # 16 MiB back, into a 4 KiB window: dropped
        await asyncio.wait_for(channels[0].lost, BOUND)
        assert limits.slow_readers == 1 and limits.current == 0
        assert shells[0].channel is None
        s.close()
        server.close()

    run(main())


def test_transport_setting(tmp_path: Path) -> None:
    env = {"GATEWAY_LISTENERS__TCP__DEFAULT__TRANSPORT": "asyncio"}
    assert load_config(None, environ=env).listeners.tcp["default"].transport == "asyncio"
    env = {"GATEWAY_LISTENERS__TCP__DEFAULT__TRANSPORT": "lean"}
    assert load_config(None, environ=env).listeners.tcp["default"].transport == "lean"
    assert load_config(None, environ={}).listeners.tcp["default"].transport == DEFAULT_TRANSPORT
    with pytest.raises(ConfigError, match="transport"):
        load_config(None, environ={"GATEWAY_LISTENERS__TCP__DEFAULT__TRANSPORT": "epoll"})
    # TLS stays on the event loop's transport
    with pytest.raises(ConfigError, match="transport"):
        load_config(None, environ={"GATEWAY_LISTENERS__SSL__X__TRANSPORT": "lean",
                                   "GATEWAY_LISTENERS__SSL__X__BIND": "127.0.0.1:0"})


def test_gatewayd_check_refuses_a_bad_transport(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from gateway.cli import gatewayd

    bad = tmp_path / "gateway.toml"
    bad.write_text('[listeners.tcp.default]\ntransport = "fast"\n')
    assert gatewayd.main(["--config", str(bad), "--check"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "listeners.tcp.default.transport" in err, err


def test_asyncio_transport_still_available(run: Callable[[Awaitable[Any]], Any]) -> None:
    async def main() -> None:
        server = await start_stream_listener(
            "127.0.0.1:0", ListenerLimits("tcp:t"), lambda s, p: Blaster(1), transport="asyncio"
        )
        assert not isinstance(server, LeanServer)
        server.close()
        with pytest.raises(ValueError, match="transport"):
            await start_stream_listener(
                "127.0.0.1:0", ListenerLimits("tcp:t"), lambda s, p: Blaster(1), transport="x"
            )

    run(main())
