"""Replicant attach (Mria's model): a replicant links to one core at a time; the core
stands in for it towards the cluster and relays for it (:mod:`gateway.cluster.relay`).

Owns: a replicant's core (``core``, ``candidate``: the core being dialled or attached
to, ``core_since``, ``core_switches``), whether that core's route snapshot arrived
(``routes_bootstrapped``) and the attach loop's wake-up event.

Given: the :class:`~gateway.cluster.state.Context`, ``dial_link`` and ``links_up`` (the
links part), the :class:`~gateway.cluster.forwarding.Sender`, ``parked`` (the parked
routes, :mod:`.replication`) and ``detached()`` (what else resets when the core goes:
the Raft copy).

Invariants:
- A replicant has at most one core (``core``); it dials the next one (name order, the
  one it just lost last) when the links to it go, and moves what was queued for the old
  one to the new one (at least once).
- ``detached`` is set exactly while ``core`` is None (:meth:`wait_detached`: a leave
  answers once the replicant's own view says it has no core).
- A core relays at most one hop each way (replicant -> core -> core -> replicant) and
  never back to where a message came from.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Awaitable, Callable

from gateway.cluster import frames as F
from gateway.cluster.forwarding import Sender
from gateway.cluster.link import HandshakeError, Link
from gateway.cluster.peer import Peer
from gateway.cluster.routes import RouteTable
from gateway.cluster.state import Context, log

DialLink = Callable[[str, str, str | None], Awaitable[Link]]


class Attach:
    """The replicant's attach loop, and a core's relaying for its replicants."""

    def __init__(self, ctx: Context, sender: Sender, parked: RouteTable, *,
                 dial_link: DialLink, links_up: Callable[[Peer, Link, Link], None],
                 detached: Callable[[], None]) -> None:
        self.ctx = ctx
        self.sender = sender
        self.parked = parked
        self._dial_link = dial_link
        self._links_up = links_up
        self._on_detached = detached
        self.core: str | None = None
        self.candidate: str | None = None  # the core being dialled or attached to
        self.core_since: float | None = None
        self.core_switches = 0
        self.routes_bootstrapped = False  # the core's route snapshot arrived
        self._wake = asyncio.Event()
        self.detached = asyncio.Event()
        self.detached.set()

    async def wait_detached(self, timeout: float) -> bool:
        """Until this replicant has no core (its links to it closed), at most
        ``timeout`` seconds; whether it has none."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.detached.wait(), timeout)
        return self.core is None

    def wake(self) -> None:
        """A member was added: the attach loop looks again at once."""
        self._wake.set()

    def bootstrapped(self, name: str) -> None:
        """A route snapshot from ``name`` arrived (our core's: we are bootstrapped)."""
        if self.ctx.replicant and name == self.candidate:
            self.routes_bootstrapped = True

    async def loop(self) -> None:
        """A replicant's links: to exactly one core at a time. The cores are tried in
        name order, the one just lost last; when the links to the core go, the next
        one is tried at once (docs/cluster.md, "Replicants")."""
        ctx = self.ctx
        settings = ctx.settings
        delay = 0.1
        last: str | None = None
        while not ctx.stopping:
            names = sorted(n for n, p in ctx.peers.items() if p.role != "replicant")
            if last in names:
                i = names.index(last)
                names = names[i + 1:] + names[:i + 1]
            attached = False
            for name in names:
                peer = ctx.peers.get(name)
                if peer is None or ctx.stopping:
                    continue
                self.candidate = name  # its links to us (it dials back) are accepted
                ctl: Link | None = None
                try:
                    ctl = await self._dial_link(peer.addr, "control", name)
                    data = await self._dial_link(peer.addr, "data", name)
                except (TimeoutError, OSError, ssl.SSLError, HandshakeError) as exc:
                    if ctl is not None:
                        ctl.close("data link failed")
                    self.candidate = None
                    why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                    if why != peer.last_error:
                        log.info("cluster: cannot attach to %s at %s: %s", name, peer.addr, why)
                    peer.last_error = why
                    continue
                if ctx.stopping or ctx.peers.get(name) is not peer:
                    ctl.close("stopping")
                    data.close("stopping")
                    break
                attached = True
                self._attached(peer, last)
                self._links_up(peer, ctl, data)
                # the core's snapshot comes on its link back to us: without it (it
                # cannot reach us) this core is no use; try the next one
                boot = 2 * max(settings.connect_timeout, settings.heartbeat_timeout)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(ctl.done.wait(), boot)
                if not ctl.closed and not self.routes_bootstrapped:
                    log.warning("cluster: no route snapshot from %s in %gs (can it reach "
                                "%s?)", name, boot, settings.advertise)
                    ctl.close("no route snapshot from the core")
                await ctl.done.wait()
                await data.done.wait()
                self._detached(peer)
                last = name
                break
            if attached:
                delay = 0.1
                continue
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            delay = min(delay * 2, settings.reconnect_max)

    def _attached(self, peer: Peer, previous: str | None) -> None:
        self.core = peer.name
        self.detached.clear()
        self.core_since = time.time()
        peer.failures = 0
        peer.last_error = ""
        if previous is not None:
            self.core_switches += 1
        log.info("cluster: replicant attached to core %s%s", peer.name,
                 f" (was {previous})" if previous and previous != peer.name else "")
        # what waited for another core (QoS 1/2 forwards and shared-group messages not
        # acknowledged) goes through this one now: at least once
        for other in self.ctx.peers.values():
            if other is peer:
                continue
            self.parked.drop_node(other.name)
            records = list(other.outbox.records)
            if records:
                other.outbox.take({seq for seq, _ in records})
                other.shared_pending.clear()
                for _, body in records:
                    self.sender.queue(peer, body, 1)
                log.warning("cluster: %d unacknowledged forwards for %s go through %s",
                            len(records), other.name, peer.name)

    def _detached(self, peer: Peer) -> None:
        log.warning("cluster: replicant lost its core %s", peer.name)
        self.core = self.candidate = None
        self.detached.set()
        self.core_since = None
        self.routes_bootstrapped = False
        self._on_detached()
        for link in (peer.ctl_in, peer.data_in):  # its dial-back
            if link is not None:
                link.close("not our core any more")

    def relay_to(self, fwd: F.Forwarded) -> None:
        """A record for one replicant attached here (its former core's queue)."""
        assert fwd.target is not None
        peer = self.ctx.peers.get(fwd.target)
        if peer is None or peer.role != "replicant" or peer.ctl_in is None:
            log.warning("cluster: a message for %s, which is not attached here, dropped",
                        fwd.target)
            return
        body = F.encode_message(fwd.message, fwd.share)
        peer.forwarded += 1
        self.sender.queue(peer, body, fwd.message.qos)
