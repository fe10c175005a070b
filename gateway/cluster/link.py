"""One TLS connection between two nodes, carrying frames (:mod:`gateway.cluster.frames`).

Every pair of nodes has four: each node dials the other twice, a *control* link
(membership, heartbeats, its route table, calls) and a *data* link (batches of forwarded
messages), and answers on the links it dialled (PONG, ROUTES_ACK, ACK). Control and data
are kept apart (the seeds' "scalable RPC"): a burst of forwarded messages never delays a
heartbeat or a route update.

:func:`dial` connects, does the TLS handshake and the HELLO/WELCOME exchange;
:func:`accept_tls` is the listener's side of the handshake, which logs and refuses a
peer whose certificate does not chain to the cluster CA. :class:`Link` then reads frames
in a task and hands each to a callback, in order.

Invariants:
- ``on_frame`` is called for each frame in arrival order, on the loop; after
  :meth:`Link.close` (or the peer's close) no further frame is delivered and
  ``on_close`` runs exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.cluster.frames import (
    HELLO,
    WELCOME,
    FrameError,
    FrameReader,
    control,
    parse_control,
)
from gateway.cluster.tls import peer_common_name

log = logging.getLogger("gateway.cluster")

_HEAD = struct.Struct(">IB")


class HandshakeError(Exception):
    """The peer refused us, or is not who it should be."""


async def read_frame(reader: asyncio.StreamReader, max_frame: int = 1 << 20) -> tuple[int, bytes]:
    head = await reader.readexactly(5)
    length, kind = _HEAD.unpack(head)
    if length < 1 or length > max_frame:
        raise FrameError(f"handshake frame length {length} out of range")
    return kind, await reader.readexactly(length - 1)


def split_addr(addr: str, default_port: int = 5370) -> tuple[str, int]:
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        return addr.strip("[]"), default_port
    return host.strip("[]"), int(port)


class Link:
    """A framed TLS stream to or from one peer (see module docstring)."""

    def __init__(
        self,
        peer: str,
        channel: str,
        inbound: bool,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        self.peer = peer
        self.channel = channel
        self.inbound = inbound
        self.reader = reader
        self.writer = writer
        self.closed = False
        self.reason = ""
        self.info: dict[str, Any] = {}  # what the peer said in its HELLO/WELCOME
        self.opened_at = time.time()
        self.frames_in = 0
        self.bytes_out = 0
        self._task: asyncio.Task[None] | None = None
        self._on_close: Callable[[Link], None] | None = None
        self.done = asyncio.Event()

    def __repr__(self) -> str:
        way = "from" if self.inbound else "to"
        return f"<{self.channel} link {way} {self.peer}>"

    def start(
        self,
        on_frame: Callable[[Link, int, bytes], None],
        on_close: Callable[[Link], None],
    ) -> None:
        self._on_close = on_close
        self._task = asyncio.get_running_loop().create_task(self._read(on_frame))

    async def _read(self, on_frame: Callable[[Link, int, bytes], None]) -> None:
        frames = FrameReader()
        reader = self.reader
        try:
            while not self.closed:
                data = await reader.read(1 << 18)
                if not data:
                    self.reason = self.reason or "closed by peer"
                    break
                for kind, body in frames.feed(data):
                    if self.is_closed():
                        break
                    self.frames_in += 1
                    on_frame(self, kind, body)
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError) as exc:
            self.reason = self.reason or f"{type(exc).__name__}: {exc}"
        except FrameError as exc:
            self.reason = str(exc)
            log.warning("cluster: %r: %s", self, exc)
        except asyncio.CancelledError:
            self.reason = self.reason or "cancelled"
        except Exception:  # a bug in a handler: log it, drop the link, keep the node
            log.exception("cluster: %r: handler failed", self)
            self.reason = "handler failed"
        finally:
            self._finish()

    def _finish(self) -> None:
        if not self.closed:
            self.closed = True
        self.writer.transport.abort()
        if not self.done.is_set():
            self.done.set()
            if self._on_close is not None:
                cb, self._on_close = self._on_close, None
                cb(self)

    def is_closed(self) -> bool:
        return self.closed

    def send(self, data: bytes) -> None:
        if not self.closed:
            self.bytes_out += len(data)
            self.writer.write(data)

    def buffered(self) -> int:
        return self.writer.transport.get_write_buffer_size()

    async def drain(self) -> None:
        with contextlib.suppress(OSError, ConnectionError, ssl.SSLError):
            await self.writer.drain()

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.reason = reason
        if self._task is not None and not self._task.done():
            self._task.cancel()  # its finally runs _finish (once it has started)
            # a task cancelled before its first step never runs its finally
            self._task.add_done_callback(lambda _t: self._finish())
        else:
            self._finish()


async def dial(
    addr: str,
    ctx: ssl.SSLContext,
    hello: dict[str, Any],
    *,
    expect: str | None,
    verify_name: bool,
    timeout: float,
    check: Callable[[asyncio.StreamWriter], Awaitable[str | None]] | None = None,
) -> Link:
    """Connect to ``addr``, shake hands; a :class:`Link` not yet started.

    ``expect``: the node name the peer must have (None when joining by address only).
    ``check``: the peer certificate's revocation, after TLS and before HELLO (None: ok).
    """
    host, port = split_addr(addr)

    async def go() -> Link:
        reader, writer = await asyncio.open_connection(host, port, ssl=ctx, server_hostname=host)
        try:
            refusal = await check(writer) if check is not None else None
            if refusal is not None:
                raise HandshakeError(f"peer certificate {refusal}")
            writer.write(control(HELLO, hello))
            kind, body = await read_frame(reader)
            if kind != WELCOME:
                raise HandshakeError(f"expected WELCOME, got frame {kind}")
            welcome = parse_control(body)
            if "refused" in welcome:
                raise HandshakeError(f"refused: {welcome['refused']}")
            name = welcome.get("name")
            if not isinstance(name, str) or (expect is not None and name != expect):
                raise HandshakeError(f"answered as {name!r}, expected {expect!r}")
            if verify_name:
                cn = peer_common_name(writer.get_extra_info("ssl_object"))
                if cn != name:
                    raise HandshakeError(f"certificate CN {cn!r} is not the node name {name!r}")
        except BaseException:
            writer.transport.abort()
            raise
        link = Link(name, str(hello["channel"]), False, reader, writer)
        link.info = welcome
        return link

    return await asyncio.wait_for(go(), timeout)


async def accept_tls(
    sock: socket.socket,
    ctx: ssl.SSLContext,
    timeout: float,
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, dict[str, Any]] | None:
    """The listener's side of a new connection: TLS handshake (on the accepted socket,
    so no byte of the ClientHello can be read before TLS starts), then HELLO. None
    (logged, closed) when refused."""
    loop = asyncio.get_running_loop()
    peer = sock.getpeername()
    reader = asyncio.StreamReader(limit=1 << 20, loop=loop)
    protocol = asyncio.StreamReaderProtocol(reader, loop=loop)
    try:
        transport, _ = await asyncio.wait_for(
            loop.connect_accepted_socket(
                lambda: protocol, sock, ssl=ctx, ssl_handshake_timeout=timeout
            ),
            timeout + 1,
        )
    except (TimeoutError, ssl.SSLError, OSError, ConnectionError) as exc:
        why = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
        log.warning(
            "cluster: refused a connection from %s: TLS handshake failed (%s)", _fmt(peer), why
        )
        with contextlib.suppress(OSError):
            sock.close()
        return None
    writer = asyncio.StreamWriter(transport, protocol, reader, loop)
    try:
        kind, body = await asyncio.wait_for(read_frame(reader), timeout)
        if kind != HELLO:
            raise FrameError(f"expected HELLO, got frame {kind}")
        return reader, writer, parse_control(body)
    except (TimeoutError, FrameError, OSError, asyncio.IncompleteReadError, ssl.SSLError) as exc:
        log.warning("cluster: refused a connection from %s: no HELLO (%s)", _fmt(peer), exc)
        transport.abort()
        return None


def refuse(writer: asyncio.StreamWriter, reason: str) -> None:
    with contextlib.suppress(Exception):
        writer.write(control(WELCOME, {"refused": reason}))
    writer.close()


def _fmt(peer: Any) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
