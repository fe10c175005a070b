"""A lean transport for plain-TCP stream listeners (MQTT and WebSocket over TCP).

uvloop's ``TCPTransport`` costs ~1.2 KiB per connection (the transport object, libuv's
``uv_tcp_t``, its small objects and the loop's weak reference to it): more than an idle
MQTT connection's own state. Here a connection is one slotted :class:`LeanTransport`
(fd, protocol, pending output, flags: 64 bytes) and one slot in its listener's fd table; the
socket is a bare file descriptor (accepted with the C ``_accept``, made non-blocking), with no
Python socket object, no libuv handle and no weak reference.

One :class:`Hub` per listener owns an ``epoll`` object registered with the event loop
once (``loop.add_reader(ep.fileno())``); every connection's fd is registered in it.
When the epoll fd is readable the hub drains ``ep.poll(0)`` and reads each ready fd into
one shared 256 KiB buffer, calling the protocol's ``data_received`` / ``eof_received`` /
``connection_lost`` as asyncio's transports do. The epoll is **level-triggered**: one
read per ready connection per loop turn (asyncio's fairness: a client that floods cannot
starve the others), and pausing reading is simply dropping ``EPOLLIN`` from the fd's
mask, with no edge to lose when reading resumes.

Invariants:
- ``EPOLLIN`` is in an fd's mask exactly while it is reading (not paused, not closing,
  no EOF seen); ``EPOLLOUT`` exactly while output is pending (``wbuf`` is not None).
  A paused connection whose peer hung up (``EPOLLHUP``/``EPOLLERR`` are reported even
  when not asked for) is taken out of the epoll until reading resumes, so a
  level-triggered hang-up cannot spin the loop.
- Writes go out at once (``os.write``); what the kernel does not take waits in ``wbuf``
  (None while empty). Above the high-water mark (64 KiB) the protocol gets
  ``pause_writing``, below the low-water mark (16 KiB) ``resume_writing``.
- ``close()`` sends what is pending first; ``write_eof()`` half-closes after it;
  ``abort()`` drops it. ``connection_lost`` is called exactly once, in a later loop
  callback, after which the fd is closed (so ``get_extra_info`` still works inside it)
  and its table slot is already free.
- Accepting and the listener's limits work as with asyncio's transports: the protocol's
  ``connection_made`` runs before any input, and may ``abort()`` (a refusal).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import select
import socket
from collections.abc import Callable, Iterable
from typing import Any

log = logging.getLogger("gateway.net")

READ_SIZE = 256 * 1024  # asyncio's and uvloop's read size
HIGH_WATER = 64 * 1024  # asyncio's default write-buffer limits
LOW_WATER = 16 * 1024

EPOLLIN, EPOLLOUT = select.EPOLLIN, select.EPOLLOUT
HANGUP = select.EPOLLHUP | select.EPOLLERR

_write = os.write

# LeanTransport.flags
PAUSED = 1  # pause_reading()
EOF_IN = 2  # the peer's FIN was read
CLOSING = 4  # close() or abort(): no more writes
EOF_OUT = 8  # write_eof(): FIN sent, or to be sent once wbuf drains
DONE = 16  # unregistered; connection_lost scheduled
WRITE_PAUSED = 32  # the protocol was told pause_writing()
UNWATCHED = 64  # out of the epoll (a paused connection that hung up)
NOT_READING = PAUSED | EOF_IN | CLOSING | DONE
NOT_WRITING = EOF_OUT | CLOSING | DONE
MAX_EVENTS = 256  # per poll (level-triggered: the rest are reported on the next one)

# Accept errors that mean "out of resources", not "this listener is broken" (asyncio's)
ACCEPT_RESOURCE_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
ACCEPT_RETRY = 1.0  # seconds without accepting after such an error


def _sock(fd: int) -> socket.socket:
    """A temporary socket object on ``fd`` (the caller must ``detach()`` it, or the
    fd would be closed with it)."""
    return socket.socket(fileno=fd)


class LeanTransport:
    """One connection: an ``asyncio.Transport`` without the per-connection weight.

    Implements what :class:`gateway.net.stream.StreamShell` (and any protocol) asks of
    a transport: ``write``, ``writelines``, ``write_eof``, ``can_write_eof``, ``close``,
    ``abort``, ``is_closing``, ``pause_reading``, ``resume_reading``, ``is_reading``,
    ``get_write_buffer_size``, ``set_write_buffer_limits``, ``get_extra_info``."""

    __slots__ = ("fd", "flags", "hub", "protocol", "wbuf")

    def __init__(self, fd: int, hub: Hub) -> None:
        self.fd = fd
        # the listener's hub. A slot: a class attribute of a subclass made per hub would
        # save it (80 -> 64 bytes in pure Python), but a compiled class cannot be
        # subclassed at run time, and compiled it costs nothing (80 bytes either way)
        self.hub = hub
        self.protocol: Any = None  # an asyncio.Protocol; None after connection_lost
        self.wbuf: bytearray | None = None  # unsent output; None while there is none
        self.flags = 0

    def __repr__(self) -> str:
        return f"<LeanTransport fd={self.fd} flags={self.flags:#x}>"

    # -- reading -----------------------------------------------------------------------

    def is_reading(self) -> bool:
        return not self.flags & NOT_READING

    def pause_reading(self) -> None:
        if self.flags & (PAUSED | CLOSING | DONE):
            return
        self.flags |= PAUSED
        self.hub.update(self)

    def resume_reading(self) -> None:
        if not self.flags & PAUSED or self.flags & DONE:
            return
        self.flags &= ~PAUSED
        self.hub.update(self)

    def _read_ready(self) -> None:
        hub = self.hub
        try:
            n = os.readv(self.fd, hub.bufs)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:  # ECONNRESET, ETIMEDOUT, ...
            self._force_close(exc)
            return
        if n:
            self.protocol.data_received(hub.view[:n].tobytes())
        else:
            self._eof()

    def _eof(self) -> None:
        """The peer's FIN: stop reading; the protocol decides whether to close (asyncio's
        rule: unless ``eof_received`` returns true)."""
        self.flags |= EOF_IN
        self.hub.update(self)
        if not self.protocol.eof_received():
            self.close()

    # -- writing -----------------------------------------------------------------------

    def can_write_eof(self) -> bool:
        return True

    def get_write_buffer_size(self) -> int:
        return len(self.wbuf) if self.wbuf is not None else 0

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self.hub.limits.get(self.fd, (LOW_WATER, HIGH_WATER))

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """asyncio's rule: ``high`` defaults to 4 x ``low`` (or 64 KiB), ``low`` to
        ``high`` / 4. Kept in the hub (keyed by fd): a transport that never sets its
        limits holds no room for them."""
        if high is None:
            high = HIGH_WATER if low is None else 4 * low
        if low is None:
            low = high // 4
        if not high >= low >= 0:
            raise ValueError(f"high ({high!r}) must be >= low ({low!r}) must be >= 0")
        self.hub.limits[self.fd] = (low, high)
        self._maybe_pause()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.flags & NOT_WRITING or self.wbuf is not None:
            self._write_more(data)
            return
        try:  # the common case: nothing pending, the kernel takes it all
            n = _write(self.fd, data)
        except (BlockingIOError, InterruptedError):
            n = 0
        except OSError as exc:  # EPIPE, ECONNRESET
            self._force_close(exc)
            return
        if n != len(data):
            self._keep(data, n)

    def _keep(self, data: bytes | bytearray | memoryview, n: int) -> None:
        """The kernel took ``n`` bytes of ``data`` (nothing was pending): keep the rest
        and ask for EPOLLOUT."""
        self.wbuf = bytearray(memoryview(data)[n:])
        self.hub.update(self)  # + EPOLLOUT
        self._maybe_pause()

    def _write_more(self, data: bytes | bytearray | memoryview) -> None:
        flags = self.flags
        if flags & EOF_OUT:
            raise RuntimeError("Cannot call write() after write_eof()")
        if flags & (CLOSING | DONE) or not data:
            return  # asyncio ignores writes to a closing transport too
        buf = self.wbuf
        assert buf is not None
        buf += data
        self._maybe_pause()

    def writelines(self, chunks: Iterable[bytes | bytearray | memoryview]) -> None:
        self.write(b"".join(chunks))

    def _write_ready(self) -> None:
        buf = self.wbuf
        if buf is None:
            return
        try:
            n = os.write(self.fd, buf)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._force_close(exc)
            return
        del buf[:n]
        if buf:
            self._maybe_resume()
            return
        self.wbuf = None
        self.hub.update(self)  # - EPOLLOUT
        self._maybe_resume()
        if self.get_write_buffer_size():  # resume_writing wrote again
            return
        if self.flags & CLOSING:
            self._finish(None)
        elif self.flags & EOF_OUT:
            self._shutdown_write()

    def _maybe_pause(self) -> None:
        buf = self.wbuf
        if buf is None or self.flags & WRITE_PAUSED:
            return
        if len(buf) > self.get_write_buffer_limits()[1]:
            self.flags |= WRITE_PAUSED
            try:
                self.protocol.pause_writing()
            except Exception:
                log.exception("protocol.pause_writing() failed")

    def _maybe_resume(self) -> None:
        if not self.flags & WRITE_PAUSED or self.get_write_buffer_size() > (
            self.get_write_buffer_limits()[0]
        ):
            return
        self.flags &= ~WRITE_PAUSED
        if self.flags & (CLOSING | DONE):
            return
        try:
            self.protocol.resume_writing()
        except Exception:
            log.exception("protocol.resume_writing() failed")

    def write_eof(self) -> None:
        """Half-close: FIN after what is pending; reading goes on."""
        if self.flags & (CLOSING | EOF_OUT | DONE):
            return
        self.flags |= EOF_OUT
        if self.wbuf is None:
            self._shutdown_write()

    def _shutdown_write(self) -> None:
        s = _sock(self.fd)
        try:
            s.shutdown(socket.SHUT_WR)
        finally:
            s.detach()

    # -- closing -----------------------------------------------------------------------

    def is_closing(self) -> bool:
        return bool(self.flags & (CLOSING | DONE))

    def close(self) -> None:
        """Stop reading; close once pending output is sent."""
        if self.flags & (CLOSING | DONE):
            return
        self.flags |= CLOSING
        if self.wbuf is None:
            self._finish(None)
        else:
            self.hub.update(self)  # - EPOLLIN

    def abort(self) -> None:
        """Close now; pending output is dropped."""
        self._force_close(None)

    def _force_close(self, exc: BaseException | None) -> None:
        if self.flags & DONE:
            return
        if exc is not None and log.isEnabledFor(logging.DEBUG):
            log.debug("connection fd %d lost: %r", self.fd, exc)
        self.flags |= CLOSING
        self.wbuf = None
        self._finish(exc)

    def _finish(self, exc: BaseException | None) -> None:
        """Out of the epoll and the table now; ``connection_lost`` and the fd's close in
        a later callback (as asyncio does)."""
        self.flags |= DONE
        self.hub.forget(self)
        self.hub.loop.call_soon(self._lost, exc)

    def _lost(self, exc: BaseException | None) -> None:
        protocol, self.protocol = self.protocol, None
        try:
            if protocol is not None:
                protocol.connection_lost(exc)
        finally:
            fd, self.fd = self.fd, -1
            os.close(fd)
            self.hub.gone()

    # -- information -------------------------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """``peername``, ``sockname`` (from the fd), ``socket`` (a duplicate of it:
        closing that leaves this connection open); anything else is ``default``."""
        hub = self.hub
        if name == "peername" and hub.accepting == self.fd:
            return hub.accepted_addr  # during connection_made: no system call
        if self.fd < 0 or name not in ("peername", "sockname", "socket"):
            return default
        if name == "socket":
            return socket.socket(fileno=os.dup(self.fd))
        s = _sock(self.fd)
        try:
            return s.getpeername() if name == "peername" else s.getsockname()
        except OSError:
            return default
        finally:
            s.detach()

    def get_protocol(self) -> Any:
        return self.protocol

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol


class Hub:
    """One listener's epoll, its fd table and its listening sockets.

    ``table[fd]`` is the connection on ``fd`` (a list: fds are small dense integers,
    8 bytes a slot instead of a dict entry and an int object). The epoll stays
    registered with the loop until the listener is closed and its last connection is
    gone."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, factory: Callable[[], Any], backlog: int
    ) -> None:
        self.loop = loop
        self.factory = factory
        self.backlog = backlog
        self.ep = select.epoll()
        self.table: list[LeanTransport | None] = []
        self.count = 0  # connections whose connection_lost has not run
        self.buf = bytearray(READ_SIZE)
        self.view = memoryview(self.buf)
        self.bufs = [self.buf]
        self.limits: dict[int, tuple[int, int]] = {}  # fd -> (low, high), if set
        self.accepting = -1  # the fd whose connection_made runs now
        self.accepted_addr: Any = None
        self.listening: list[socket.socket] = []
        self.serving = True
        loop.add_reader(self.ep.fileno(), self._ready)

    def mask(self, t: LeanTransport) -> int:
        return (0 if t.flags & NOT_READING else EPOLLIN) | (EPOLLOUT if t.wbuf is not None else 0)

    def update(self, t: LeanTransport) -> None:
        if t.flags & DONE:
            return
        mask = self.mask(t)
        if t.flags & UNWATCHED:
            if not mask:
                return
            t.flags &= ~UNWATCHED
            self.ep.register(t.fd, mask)
            return
        self.ep.modify(t.fd, mask)

    def forget(self, t: LeanTransport) -> None:
        fd = t.fd
        if not t.flags & UNWATCHED:
            with contextlib.suppress(OSError, ValueError):  # already gone
                self.ep.unregister(fd)
        self.table[fd] = None
        self.limits.pop(fd, None)

    def gone(self) -> None:
        self.count -= 1
        if not self.serving and self.count == 0:
            self._close_epoll()

    # -- the loop's callback -------------------------------------------------------------

    def _ready(self) -> None:
        table = self.table
        for fd, ev in self.ep.poll(0, MAX_EVENTS):
            t = table[fd]
            if t is None:  # closed earlier in this batch
                continue
            try:
                if ev & (EPOLLIN | HANGUP) and not t.flags & NOT_READING:
                    t._read_ready()
                if t.wbuf is not None and ev & (EPOLLOUT | HANGUP):
                    t._write_ready()
                if ev & HANGUP and not t.flags & DONE and not self.mask(t):
                    # hung up while paused: out of the epoll until reading resumes
                    self.ep.unregister(fd)
                    t.flags |= UNWATCHED
            except Exception as exc:  # a protocol's bug must not stop the others
                log.exception("protocol callback failed on fd %d; connection aborted", fd)
                t._force_close(exc)

    # -- accepting -----------------------------------------------------------------------

    def listen_on(self, sock: socket.socket) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            # Linux copies TCP_NODELAY from the listening socket to every accepted one
            # (tests/gateway/net/test_lean.py checks it): no setsockopt per connection
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.listening.append(sock)
        self.loop.add_reader(sock.fileno(), self._accept, sock)

    def _accept(self, lsock: socket.socket) -> None:
        # the C accept, (fd, address): socket.accept() would wrap the fd in a socket
        # object (two enum conversions, a timeout check) only for it to be detached
        accept = lsock._accept  # type: ignore[attr-defined]
        for _ in range(self.backlog):
            try:
                fd, addr = accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in ACCEPT_RESOURCE_ERRORS:
                    raise
                log.error("accept on %s failed: %s; retrying in %gs",
                          lsock.getsockname(), exc, ACCEPT_RETRY)
                self.loop.remove_reader(lsock.fileno())
                self.loop.call_later(ACCEPT_RETRY, self._resume_accept, lsock)
                return
            os.set_blocking(fd, False)  # O_NONBLOCK is not inherited
            self._connected(fd, addr)

    def _resume_accept(self, lsock: socket.socket) -> None:
        if self.serving and lsock.fileno() >= 0:
            self.loop.add_reader(lsock.fileno(), self._accept, lsock)

    def _connected(self, fd: int, addr: Any) -> None:
        table = self.table
        if fd >= len(table):
            table.extend([None] * (fd + 1 - len(table)))
        t = LeanTransport(fd, self)
        table[fd] = t
        self.count += 1
        self.ep.register(fd, EPOLLIN)
        self.accepting, self.accepted_addr = fd, addr
        try:
            t.protocol = protocol = self.factory()
            protocol.connection_made(t)
        except Exception as exc:
            log.exception("connection_made failed; connection aborted")
            t._force_close(exc)
        finally:
            self.accepting, self.accepted_addr = -1, None

    # -- closing -------------------------------------------------------------------------

    def close(self) -> None:
        """Stop accepting (open connections go on); the epoll goes with the last one."""
        if not self.serving:
            return
        self.serving = False
        for sock in self.listening:
            if sock.fileno() >= 0:
                self.loop.remove_reader(sock.fileno())
            sock.close()
        if self.count == 0:
            self._close_epoll()

    def _close_epoll(self) -> None:
        if self.ep.closed:
            return
        if not self.loop.is_closed():
            self.loop.remove_reader(self.ep.fileno())
        self.ep.close()


class LeanServer:
    """What :func:`start_lean_server` returns: the part of ``asyncio.Server`` the gateway
    uses (``sockets``, ``close``, ``wait_closed``, ``is_serving``, ``get_loop``)."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return tuple(self.hub.listening) if self.hub.serving else ()

    def is_serving(self) -> bool:
        return self.hub.serving

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self.hub.loop

    def connections(self) -> int:
        """Connections not yet lost (for tests and the admin views)."""
        return self.hub.count

    def close(self) -> None:
        self.hub.close()

    async def wait_closed(self) -> None:
        """As asyncio's (Python 3.11) and uvloop's: returns once ``close()`` was
        called; open connections are the caller's to close."""
        return None


async def start_lean_server(
    factory: Callable[[], Any],
    host: str,
    port: int,
    *,
    backlog: int = 4096,
    reuse_address: bool = True,
    reuse_port: bool = False,
) -> LeanServer:
    """Listen on every address ``host`` resolves to (as ``loop.create_server``: IPv6
    sockets are v6-only, each address its own socket) with a listen(2) queue of
    ``backlog``; every accepted connection gets ``factory()`` as its protocol."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(
        host, port, family=socket.AF_UNSPEC, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    socks: list[socket.socket] = []
    try:
        for af, kind, proto, _, addr in dict.fromkeys(infos):
            sock = socket.socket(af, kind, proto)
            socks.append(sock)
            if reuse_address:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if af == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(addr)
            except OSError as err:
                raise OSError(
                    err.errno, f"error while attempting to bind on address {addr!r}: "
                    f"{err.strerror.lower() if err.strerror else err}"
                ) from None
            sock.listen(backlog)
            sock.setblocking(False)
        if not socks:
            raise OSError(f"{host!r} resolves to no address")
    except BaseException:
        for sock in socks:
            sock.close()
        raise
    hub = Hub(loop, factory, backlog)
    for sock in socks:
        hub.listen_on(sock)
    return LeanServer(hub)
