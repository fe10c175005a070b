"""The only part of the bridge that touches sockets: TCP or TLS connections on asyncio.

:class:`AsyncioDialer` opens one :class:`AsyncioLink` per attempt and forwards every
socket event to the :class:`~gateway.bridge.client.UpstreamClient`, naming the link, so
the client can ignore a link it already gave up on. Closing a link closes the transport
after its buffered writes (a DISCONNECT goes out) or cancels the attempt still
connecting.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from gateway.bridge.client import UpstreamClient

WRITE_BUFFER_HIGH = 512 * 1024  # pause draining the outbox above this many bytes unsent

# a revocation check of the link just handshaken (gateway.security.linkcheck, set up by
# gateway.bridge.Bridges): None admits it, a string refuses it (the reason)
LinkCheck = Callable[["AsyncioLink"], Awaitable["str | None"]]


def describe_error(exc: BaseException) -> str:
    """A short reason for the status page and the log."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"TLS certificate verification failed: {exc.verify_message or exc.reason}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS error: {exc.reason or exc}"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host: {exc.strerror or exc}"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "connect timeout"
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__
    return str(exc) or type(exc).__name__


class _Protocol(asyncio.Protocol):
    def __init__(self, link: AsyncioLink) -> None:
        self.link = link

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        t = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass it
        t.set_write_buffer_limits(high=WRITE_BUFFER_HIGH)
        self.link.transport = t

    def data_received(self, data: bytes) -> None:
        self.link.client.data_received(self.link, data)

    def connection_lost(self, exc: Exception | None) -> None:
        link = self.link
        link.transport = None
        link.done.set()
        if not link.closed:
            link.closed = True
            link.client.link_lost(link, describe_error(exc) if exc is not None else None)

    def pause_writing(self) -> None:
        self.link.client.pause_writing(self.link)

    def resume_writing(self) -> None:
        self.link.client.resume_writing(self.link)


class AsyncioLink:
    def __init__(
        self,
        client: UpstreamClient,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None,
        server_hostname: str | None,
        check: LinkCheck | None = None,
    ) -> None:
        self.client = client
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.done = asyncio.Event()  # set once the socket is gone (or never was)
        self.check = check
        self.task = asyncio.get_running_loop().create_task(
            self._open(host, port, ssl_context, server_hostname)
        )

    async def _open(
        self, host: str, port: int, ctx: ssl.SSLContext | None, server_hostname: str | None
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            if ctx is None:
                await loop.create_connection(lambda: _Protocol(self), host, port)
            else:  # server_hostname "" sends no SNI (the context then checks no name)
                await loop.create_connection(
                    lambda: _Protocol(self), host, port, ssl=ctx,
                    server_hostname=server_hostname or "",
                )
        except asyncio.CancelledError:
            self.done.set()
            raise
        except (OSError, ssl.SSLError, TimeoutError, ValueError) as exc:
            self.done.set()
            if not self.closed:
                self.closed = True
                self.client.link_failed(self, describe_error(exc))
            return
        if self.closed:
            if self.transport is not None:
                self.transport.close()
            return
        if self.check is not None and ctx is not None:
            # after the handshake, before CONNECT: the upstream certificate's revocation
            refusal = await self.check(self)
            if self._given_up():  # the connect timeout, or stop(), came first
                return
            if refusal is not None:
                self.closed = True
                if self.transport is not None:
                    self.transport.abort()
                self.client.link_failed(self, f"upstream certificate {refusal}")
                return
        self.client.link_up(self)

    def _given_up(self) -> bool:
        return self.closed  # (a method: mypy would take ``closed`` as still False)

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and not self.closed:
            transport.write(data)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.transport is not None:
            self.transport.close()
        if not self.task.done():  # still connecting, or waiting for a revocation verdict
            self.task.cancel()

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await self.done.wait()


class AsyncioDialer:
    def __init__(
        self,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
        server_hostname: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.server_hostname = server_hostname
        self.check: LinkCheck | None = None  # revocation of each new TLS link (Bridges)
        self.links: set[AsyncioLink] = set()

    def dial(self, client: UpstreamClient) -> AsyncioLink:
        self.links = {old for old in self.links if not old.done.is_set()}
        link = AsyncioLink(client, self.host, self.port, self.ssl_context, self.server_hostname,
                           self.check)
        self.links.add(link)
        return link

    async def wait_closed(self, timeout: float) -> None:
        """Wait (at most ``timeout`` seconds) until every link's socket is closed."""
        links = [link for link in self.links if not link.done.is_set()]
        self.links.clear()
        if links:
            await asyncio.wait(
                [asyncio.ensure_future(link.wait_closed()) for link in links], timeout=timeout
            )
