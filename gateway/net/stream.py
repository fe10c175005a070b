"""The generic stream transport shell: the only code that touches stream sockets.

A :class:`StreamShell` is an asyncio protocol built from a channel factory. It feeds the
channel bytes and timer expiries; the effect loop it shares with the other shells
(:class:`gateway.net.shell.EffectLoop`) carries out the effects the channel returns:
writes (joined into one ``transport.write`` per call), named timers, and close. It is
also the channel's :class:`~protocols.context.ConnectionHandle`, so deliveries pushed by
the core run through the same effect loop. TLS and WebSocket listeners use this same
shell (WebSocket framing is a channel wrapper, :mod:`gateway.net.websocket`).

Limits live in :class:`ListenerLimits`: maximum connections, CIDR allow/deny lists and
the connection rate (``max_conn_rate``), checked on accept, before any channel exists; a
refused connection is closed at once, counted by reason, and logged at most once a second.

Invariants:
- At most one timer per name; setting a name again replaces it.
- With a commit ``gate`` (a durable node), nothing a channel emits while the store has
  uncommitted writes leaves before they are committed: a PUBACK/PUBREC is never sent
  for a message that is not yet on disk. Held effects keep their order.
- After a Close effect no further effect is carried out. The shell writes what is
  pending, half-closes (FIN) and discards input until the peer closes or ``LINGER``
  seconds pass: closing outright with unread input makes the kernel send RST, and the
  peer may then lose our last packet (a DISCONNECT with its reason code).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

from gateway.net.lean import LeanServer, LeanTransport, start_lean_server
from gateway.net.shell import CommitGate, EffectLoop, Site
from protocols import ratelimit
from protocols.context import Delivery
from protocols.effects import Effect
from protocols.rare import rare_set

log = logging.getLogger("gateway.net")

LINGER = 5.0  # seconds to wait for the peer to close after our FIN
# An input of at most this many bytes (a few small packets: a lightly loaded publisher)
# has the deliveries it made written at its end instead of the loop turn's.
SMALL_INPUT = 512
SMALL_FANOUT = 2  # ... when they went to at most this many connections

# The shell whose data_received is running (the loop is one thread): what its own input
# writes to it is flushed when that input ends, with no call_soon of its own.
_reading: StreamShell | None = None


class StreamChannel(Protocol):
    def connection_made(self) -> list[Effect]: ...
    def handle_data(self, data: bytes) -> list[Effect]: ...
    def on_timer(self, name: str) -> list[Effect]: ...
    def connection_lost(self) -> None: ...
    def deliver(self, deliveries: list[Delivery]) -> list[Effect]: ...
    def release(self, packet_id: int) -> list[Effect]: ...
    def kick(self, reason_code: int) -> list[Effect]: ...


ChannelFactory = Callable[["StreamShell", tuple[str, int] | None], StreamChannel]


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class ListenerLimits:
    """Who may connect to one listener, and how many at once."""

    def __init__(
        self,
        name: str,
        *,
        max_connections: int = 0,
        allow: Sequence[str] = (),
        deny: Sequence[str] = (),
        max_conn_rate: float = 0.0,
        now: Callable[[], float] = time.monotonic,
        send_timeout: float = 0.0,
        max_send_buffer: int = 0,
    ) -> None:
        self.name = name
        self.max_connections = max_connections
        self.allow: list[Network] = [ipaddress.ip_network(c, strict=False) for c in allow]
        self.deny: list[Network] = [ipaddress.ip_network(c, strict=False) for c in deny]
        self.current = 0
        self.refused = 0
        # max_conn_rate: connections per second (0 = no limit), burst one second's worth
        self.max_conn_rate = max_conn_rate
        self._now = now
        self._conn_rate = (
            ratelimit.TokenBucket(max_conn_rate, max(1.0, max_conn_rate), now())
            if max_conn_rate
            else None
        )
        self.refused_by: dict[str, int] = {}  # refusals by reason
        # slow readers: how long a client may leave our writes blocked (seconds), and
        # how many bytes may wait for it meanwhile (0 = no limit); dropped clients
        self.send_timeout = send_timeout
        self.max_send_buffer = max_send_buffer
        self.slow_readers = 0
        self._logged_at = float("-inf")
        self._unlogged = 0

    def admit(self, host: str | None) -> str | None:
        """None to accept, else why the connection is refused."""
        if self.max_connections and self.current >= self.max_connections:
            return "max_connections reached"
        if host is not None and (self.allow or self.deny):
            try:
                addr = ipaddress.ip_address(host.split("%", 1)[0])
            except ValueError:
                return None
            if any(addr in n for n in self.deny):
                return "address denied"
            if self.allow and not any(addr in n for n in self.allow):
                return "address not allowed"
        if self._conn_rate is not None and not self._conn_rate.admit(self._now()):
            return "max_conn_rate exceeded"
        return None

    def refuse(self, peer: tuple[str, int] | None, reason: str) -> None:
        """Count a refused connection; log it, at most once a second per listener (a
        flood of refusals must not become a flood of log lines)."""
        self.refused += 1
        self.refused_by[reason] = self.refused_by.get(reason, 0) + 1
        now = self._now()
        if now - self._logged_at < 1.0:
            self._unlogged += 1
            return
        more = f" (and {self._unlogged} more since the last report)" if self._unlogged else ""
        log.warning("listener %s refused %s: %s%s", self.name, peer, reason, more)
        self._logged_at = now
        self._unlogged = 0


class StreamSite(Site):
    """A stream listener's shared part of its connections: the gate and loop, the
    listener's limits and the factory of its channels."""

    __slots__ = ("factory", "limits")

    def __init__(
        self,
        limits: ListenerLimits,
        factory: ChannelFactory,
        gate: CommitGate | None,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        super().__init__(gate, loop)
        self.limits = limits
        self.factory = factory


class StreamShell(EffectLoop, asyncio.Protocol):
    # one per connection: slots (an instance dict would cost ~100 bytes more); the
    # timers of a closing, rate-limited or slow-reading connection are rare: kept out
    # (protocols.rare): linger, resume (reading paused until), send_timer

    __slots__ = ("transport", "wbuf", "write_blocked")

    @property
    def linger(self) -> asyncio.TimerHandle | None:
        r = self._rare
        v: asyncio.TimerHandle | None = None if r is None else r.get("linger")
        return v

    @linger.setter
    def linger(self, value: asyncio.TimerHandle | None) -> None:
        self._rare = rare_set(self._rare, "linger", value, None)

    @property
    def resume(self) -> asyncio.TimerHandle | None:
        r = self._rare
        v: asyncio.TimerHandle | None = None if r is None else r.get("resume")
        return v

    @resume.setter
    def resume(self, value: asyncio.TimerHandle | None) -> None:
        self._rare = rare_set(self._rare, "resume", value, None)

    @property
    def send_timer(self) -> asyncio.TimerHandle | None:
        r = self._rare
        v: asyncio.TimerHandle | None = None if r is None else r.get("send_timer")
        return v

    @send_timer.setter
    def send_timer(self, value: asyncio.TimerHandle | None) -> None:
        self._rare = rare_set(self._rare, "send_timer", value, None)

    def __init__(self, site: StreamSite) -> None:
        super().__init__(site)
        # first, beside EffectLoop's last (``closed``): compiled, the two bools share a
        # word of the object (docs/performance.md: 16 bytes less per connection)
        self.write_blocked = False  # the transport is above its high-water mark
        self.transport: asyncio.Transport | None = None
        # written this loop turn, flushed by _flush; None between turns (an idle
        # connection holds no list)
        self.wbuf: list[bytes] | None = None

    @property
    def limits(self) -> ListenerLimits:
        return cast(StreamSite, self.site).limits

    @property
    def factory(self) -> ChannelFactory:
        return cast(StreamSite, self.site).factory

    # -- asyncio.Protocol ------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        self.transport = transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        # (host, port), the host interned: clients behind one address share the string
        peer_t: tuple[str, int] | None = (sys.intern(peer[0]), peer[1]) if peer else None
        site = cast(StreamSite, self.site)  # the listener's: one slot, shared
        refusal = site.limits.admit(peer_t[0] if peer_t else None)
        if refusal is not None:
            site.limits.refuse(peer_t, refusal)
            self.closed = True
            transport.abort()
            return
        site.limits.current += 1
        self.channel = channel = site.factory(self, peer_t)
        # no input answered yet, so nothing here waits for the store (MQTT: the idle
        # timer, which would otherwise hold the CONNACK behind a commit, see Unheld)
        self._execute(channel.connection_made())

    def sockname(self) -> str | None:
        """The local address of the connection, ``host:port`` (None once closed)."""
        transport = self.transport
        try:
            addr = transport.get_extra_info("sockname") if transport is not None else None
        except Exception:  # a closed socket, on some event loops
            return None
        return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else None

    def _pause_reading(self, seconds: float) -> None:
        """A Pause effect (a rate limit): stop reading for ``seconds``; the kernel's
        buffers fill and TCP flow control slows the client down. A second Pause only
        extends the first."""
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        until = self.loop.time() + seconds
        if self.resume is not None:
            if self.resume.when() >= until:
                return
            self.resume.cancel()
        else:
            transport.pause_reading()
        self.resume = self.loop.call_at(until, self._resume_reading)

    def _resume_reading(self) -> None:
        self.resume = None
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.resume_reading()

    # -- slow readers: asyncio's write flow control ------------------------------------

    def pause_writing(self) -> None:
        """Our writes pile up (the client reads slower than it is sent to): allow it
        ``send_timeout`` seconds to catch up, and ``max_send_buffer`` bytes meanwhile."""
        self.write_blocked = True
        timeout = self.limits.send_timeout
        if timeout and self.send_timer is None and not self.closed:
            self.send_timer = self.loop.call_later(timeout, self._send_timed_out)

    def resume_writing(self) -> None:
        self.write_blocked = False
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None

    def _send_timed_out(self) -> None:
        self.send_timer = None
        self._drop_slow_reader(f"it read nothing for send_timeout ({self.limits.send_timeout:g}s)")

    def _drop_slow_reader(self, why: str) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        self.limits.slow_readers += 1
        size = transport.get_write_buffer_size()
        log.warning(
            "listener %s dropped slow reader %s: %s (%d bytes unsent)",
            self.limits.name,
            transport.get_extra_info("peername"),
            why,
            size,
        )
        self.closed = True
        self._cancel_timers()
        transport.abort()

    def data_received(self, data: bytes) -> None:
        global _reading
        channel = cast("StreamChannel | None", self.channel)
        if channel is not None and not self.closed:
            _reading = self
            others: dict[EffectLoop, list[Delivery]] = {}
            try:
                others = self._input(channel.handle_data, data)
            finally:
                _reading = None
                if others and len(data) <= SMALL_INPUT and len(others) <= SMALL_FANOUT:
                    # a lightly loaded connection: what its input delivered leaves now,
                    # not after every other connection ready in this turn is handled
                    for shell in others:
                        shell._flush()
                if self.wbuf is not None:
                    # This connection's own answers (its PUBACKs, the deliveries its
                    # acks freed) leave now, not after every other connection ready in
                    # this loop turn has been read: its peer may send again sooner.
                    # What other connections' input pushes here later in the turn is
                    # still gathered (and flushed by a call_soon, see _write_all).
                    self._flush()

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.linger is not None:
            self.linger.cancel()
        if self.resume is not None:
            self.resume.cancel()
            self.resume = None
        if self.send_timer is not None:
            self.send_timer.cancel()
            self.send_timer = None
        self._cancel_timers()
        if self.channel is not None:
            self.limits.current -= 1
            self.closed = True
            try:
                self.channel.connection_lost()
            except Exception:  # pragma: no cover - a bug in a channel must not kill the loop
                log.exception("channel failed in connection_lost")
            # The channel refers back to this shell: drop it now, so its buffers (up to
            # max_packet_size of a half-received packet) go at once, not at the next
            # full garbage collection.
            self.channel = None
            self.held = None

    # -- EffectLoop ------------------------------------------------------------------

    def _writable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def _write_all(self, writes: list[bytes]) -> None:
        """Writes are gathered and handed to the transport once per event-loop turn, or
        at the end of this connection's own input (``data_received``): a subscriber fed
        by many publishers, or a publisher answered with many acks, costs one send() per
        turn instead of one per packet."""
        buf = self.wbuf
        if buf is None:
            self.wbuf = buf = []
            if _reading is not self:  # else data_received flushes it
                self.site.loop.call_soon(self._flush)
        buf.extend(writes)

    def _flush(self) -> None:
        buf = self.wbuf
        self.wbuf = None
        transport = self.transport
        if not buf or transport is None or transport.is_closing():
            return
        transport.write(buf[0] if len(buf) == 1 else b"".join(buf))
        if self.write_blocked:
            cap = self.limits.max_send_buffer
            if cap and transport.get_write_buffer_size() > cap:
                self._drop_slow_reader(f"more than max_send_buffer ({cap} bytes) unsent")

    def _shutdown(self, reason: str) -> None:
        self._flush()
        transport = self.transport
        assert transport is not None
        if log.isEnabledFor(logging.DEBUG):  # the peer lookup is a call per close
            log.debug("closing %s: %s", transport.get_extra_info("peername"), reason)
        if transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:
                transport.abort()
                return
            self.linger = self.loop.call_later(LINGER, transport.abort)
        else:
            transport.close()


class LeanShell(StreamShell):
    """The stream shell on a lean transport (:mod:`gateway.net.lean`), which ignores
    writes once it is closing: the flush needs no ``is_closing()`` call first (asyncio's
    and uvloop's transports buffer a write made after ``close()``; this one does not)."""

    __slots__ = ()

    def _flush(self) -> None:
        buf = self.wbuf
        self.wbuf = None
        t = cast(LeanTransport | None, self.transport)
        if not buf or t is None:
            return
        t.write(buf[0] if len(buf) == 1 else b"".join(buf))
        if self.write_blocked:
            cap = self.limits.max_send_buffer
            if cap and t.get_write_buffer_size() > cap:
                self._drop_slow_reader(f"more than max_send_buffer ({cap} bytes) unsent")


def split_bind(bind: str) -> tuple[str, int]:
    """ "0.0.0.0:1883" / "[::1]:1883" / ":1883" -> (host, port)."""
    host, _, port = bind.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"
    return host, int(port)


# The transports a plain-TCP listener may use (``[listeners.tcp.<name>] transport``)
TRANSPORTS = ("lean", "asyncio")


async def start_stream_listener(
    bind: str,
    limits: ListenerLimits,
    factory: ChannelFactory,
    gate: CommitGate | None = None,
    *,
    backlog: int = 4096,
    transport: str = "asyncio",
    **kwargs: Any,
) -> asyncio.Server | LeanServer:
    """Listen on ``bind`` with a listen(2) queue of ``backlog`` (the kernel caps it at
    ``net.core.somaxconn``; asyncio's own default of 100 overflows under a reconnect
    storm, and an overflow costs the client a SYN retransmit: 1 s, then 2 s, ...).

    ``transport``: ``"lean"`` (:mod:`gateway.net.lean`, ~0.1 KiB per connection instead
    of uvloop's ~1.2 KiB) for plain TCP; ``"asyncio"`` the event loop's own transport.
    A TLS listener (``ssl=`` given) always uses the event loop's."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport must be one of {TRANSPORTS}, not {transport!r}")
    host, port = split_bind(bind)
    loop = asyncio.get_running_loop()
    site = StreamSite(limits, factory, gate, loop)
    if transport == "lean" and kwargs.get("ssl") is None:
        kwargs.pop("ssl", None)
        reuse_port = bool(kwargs.pop("reuse_port", False))
        if kwargs:
            raise TypeError(f"the lean transport takes no {sorted(kwargs)}")
        return await start_lean_server(
            lambda: LeanShell(site), host, port, backlog=backlog, reuse_port=reuse_port
        )
    return await loop.create_server(
        lambda: StreamShell(site), host, port, reuse_address=True, backlog=backlog, **kwargs
    )
