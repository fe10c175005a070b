"""The generic datagram transport shell (UDP): the only code that touches datagram sockets.

A :class:`DatagramShell` is an asyncio datagram protocol built from a channel factory,
keyed by peer address: the first datagram from an address creates a
:class:`DatagramPeer` and its channel (the codec lives in the channel, which takes and
returns whole datagrams). Each peer runs the effect loop every shell shares
(:class:`gateway.net.shell.EffectLoop`): a ``bytes`` effect is one datagram to that peer,
timers are per peer, and Close forgets the peer. The peer is also its channel's
:class:`~protocols.context.ConnectionHandle`.

Idle cleanup is the channel's business, through its own timers (a peer that never
connects, a keepalive that lapses, a sleeping client that does not wake up): it returns
Close and the shell drops the peer. ``ListenerLimits.max_connections`` caps the number
of peers, so a flood of spoofed source addresses cannot grow the table without bound;
CIDR allow/deny applies to the first datagram of a peer.

Invariants:
- One peer (one channel) per remote address; a Close removes it from the table before
  its channel's ``connection_lost`` runs, so a datagram arriving later starts afresh.
- Datagrams from a refused address are dropped without creating anything.
- A bug in one channel (an exception) drops that peer only, never the listener.
- Closing the shell ends every channel (``connection_lost``) exactly once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol, cast

from gateway.net.shell import CommitGate, EffectLoop, Site
from gateway.net.stream import ListenerLimits, split_bind
from protocols.context import Delivery
from protocols.effects import Effect

log = logging.getLogger("gateway.net.datagram")

Address = tuple[str, int]


class DatagramChannel(Protocol):
    def connection_made(self) -> list[Effect]: ...
    def handle_datagram(self, data: bytes) -> list[Effect]: ...
    def on_timer(self, name: str) -> list[Effect]: ...
    def connection_lost(self) -> None: ...
    def deliver(self, deliveries: list[Delivery]) -> list[Effect]: ...
    def release(self, packet_id: int) -> list[Effect]: ...
    def kick(self, reason_code: int) -> list[Effect]: ...


DatagramFactory = Callable[["DatagramPeer", Address], DatagramChannel]


class DatagramPeer(EffectLoop):
    """One remote address of a datagram listener: its channel (a ``DatagramChannel``;
    typed as EffectLoop's, since a compiled subclass may not narrow it) and its timers."""

    def __init__(self, shell: DatagramShell, addr: Address) -> None:
        super().__init__(shell.site)
        self.shell = shell
        self.addr = addr

    def _writable(self) -> bool:
        return self.shell.open

    def sockname(self) -> str | None:
        """The listener's local address, ``host:port`` (the rules' ``sockname``; a
        listener on ``0.0.0.0`` shows that: a datagram socket has no per-peer address)."""
        transport = self.shell.transport
        try:
            addr = transport.get_extra_info("sockname") if transport is not None else None
        except Exception:  # a closed socket, on some event loops
            return None
        return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else None

    def _write_all(self, writes: list[bytes]) -> None:
        self.shell.send_to(writes, self.addr)

    def _shutdown(self, reason: str) -> None:
        log.debug("peer %s:%d closed: %s", self.addr[0], self.addr[1], reason)
        self.shell.forget(self)


class DatagramShell(asyncio.DatagramProtocol):
    def __init__(
        self,
        limits: ListenerLimits,
        factory: DatagramFactory,
        gate: CommitGate | None = None,
    ) -> None:
        self.limits = limits
        self.factory = factory
        self.gate = gate
        self.loop = asyncio.get_running_loop()
        self.site = Site(gate, self.loop)  # shared by the peers
        self.transport: asyncio.DatagramTransport | None = None
        self.peers: dict[Address, DatagramPeer] = {}
        self.open = False
        self.dropped = 0  # datagrams from refused addresses

    # -- asyncio.DatagramProtocol -------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)
        self.open = True

    def datagram_received(self, data: bytes, addr: Any) -> None:
        key: Address = (addr[0], addr[1])
        peer = self.peers.get(key)
        if peer is None:
            peer = self._new_peer(key)
            if peer is None:
                return
        channel = cast("DatagramChannel | None", peer.channel)
        if channel is None or peer.closed:
            return
        try:
            effects = channel.handle_datagram(data)
        except Exception:
            log.exception("channel of %s:%d failed; dropping the peer", key[0], key[1])
            self._drop(peer)
            return
        peer._run(effects)

    def error_received(self, exc: Exception) -> None:
        # ICMP port unreachable and the like: the peer's channel finds out by its timers
        log.debug("listener %s: %s", self.limits.name, exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.open = False
        for peer in list(self.peers.values()):
            self._drop(peer)

    # -- peers ---------------------------------------------------------------------

    def _new_peer(self, addr: Address) -> DatagramPeer | None:
        refusal = self.limits.admit(addr[0])
        if refusal is not None:
            self.limits.refused += 1
            self.dropped += 1
            log.warning("listener %s refused %s:%d: %s", self.limits.name, *addr, refusal)
            return None
        peer = DatagramPeer(self, addr)
        self.peers[addr] = peer
        self.limits.current += 1
        try:
            peer.channel = channel = self.factory(peer, addr)
            effects = channel.connection_made()
        except Exception:
            log.exception("cannot make a channel for %s:%d", *addr)
            self._drop(peer)
            return None
        peer._execute(effects)  # no input answered yet: nothing here waits for the store
        return None if peer.closed else peer

    def forget(self, peer: DatagramPeer) -> None:
        """The peer's channel closed: remove it, then tell the channel (once)."""
        if self.peers.get(peer.addr) is peer:
            del self.peers[peer.addr]
            self.limits.current -= 1
        channel, peer.channel = peer.channel, None
        if channel is not None:
            try:
                channel.connection_lost()
            except Exception:  # pragma: no cover - a bug in a channel must not kill the loop
                log.exception("channel failed in connection_lost")

    def _drop(self, peer: DatagramPeer) -> None:
        peer.closed = True
        peer._cancel_timers()
        self.forget(peer)

    # -- writing -------------------------------------------------------------------

    def send_to(self, datagrams: list[bytes], addr: Address) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        for d in datagrams:
            transport.sendto(d, addr)

    def close(self) -> None:
        """End every peer's channel and close the socket."""
        for peer in list(self.peers.values()):
            self._drop(peer)
        if self.transport is not None:
            self.transport.close()


async def start_datagram_listener(
    bind: str,
    limits: ListenerLimits,
    factory: DatagramFactory,
    gate: CommitGate | None = None,
    *,
    allow_broadcast: bool = False,
) -> DatagramShell:
    host, port = split_bind(bind)
    loop = asyncio.get_running_loop()
    _, protocol = await loop.create_datagram_endpoint(
        lambda: DatagramShell(limits, factory, gate),
        local_addr=(host, port),
        reuse_port=False,
        allow_broadcast=allow_broadcast,
    )
    return protocol
