"""Replicant attach (Mria's model): a replicant links to one core at a time; the core
stands in for it towards the cluster and relays for it (:mod:`gateway.cluster.relay`).

Invariants:
- A replicant has at most one core (``core``); it dials the next one (name order, the
  one it just lost last) when the links to it go, and moves what was queued for the old
  one to the new one (at least once).
- A core relays at most one hop each way (replicant -> core -> core -> replicant) and
  never back to where a message came from.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from typing import TYPE_CHECKING, Any

from gateway.cluster import frames as F
from gateway.cluster.link import HandshakeError, Link
from gateway.cluster.peer import Peer
from gateway.cluster.state import (
    ClusterState,
    log,
)

if TYPE_CHECKING:
    pass


class AttachPart(ClusterState):
    """The replicant's attach loop, and a core's relaying for its replicants."""

    async def _attach_loop(self) -> None:
        """A replicant's links: to exactly one core at a time. The cores are tried in
        name order, the one just lost last; when the links to the core go, the next
        one is tried at once (docs/cluster.md, "Replicants")."""
        delay = 0.1
        last: str | None = None
        while not self.stopping:
            names = sorted(n for n, p in self.peers.items() if p.role != "replicant")
            if last in names:
                i = names.index(last)
                names = names[i + 1:] + names[:i + 1]
            attached = False
            for name in names:
                peer = self.peers.get(name)
                if peer is None or self.stopping:
                    continue
                self._candidate = name  # its links to us (it dials back) are accepted
                ctl: Link | None = None
                try:
                    ctl = await self._dial_link(peer.addr, "control", name)
                    data = await self._dial_link(peer.addr, "data", name)
                except (TimeoutError, OSError, ssl.SSLError, HandshakeError) as exc:
                    if ctl is not None:
                        ctl.close("data link failed")
                    self._candidate = None
                    why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                    if why != peer.last_error:
                        log.info("cluster: cannot attach to %s at %s: %s", name, peer.addr, why)
                    peer.last_error = why
                    continue
                if self.stopping or self.peers.get(name) is not peer:
                    ctl.close("stopping")
                    data.close("stopping")
                    break
                attached = True
                self._attached(peer, last)
                self._links_up(peer, ctl, data)
                # the core's snapshot comes on its link back to us: without it (it
                # cannot reach us) this core is no use; try the next one
                boot = 2 * max(self.settings.connect_timeout, self.settings.heartbeat_timeout)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(ctl.done.wait(), boot)
                if not ctl.closed and not self.routes_bootstrapped:
                    log.warning("cluster: no route snapshot from %s in %gs (can it reach "
                                "%s?)", name, boot, self.settings.advertise)
                    ctl.close("no route snapshot from the core")
                await ctl.done.wait()
                await data.done.wait()
                self._detached(peer)
                last = name
                break
            if attached:
                delay = 0.1
                continue
            self._attach_wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._attach_wake.wait(), delay)
            delay = min(delay * 2, self.settings.reconnect_max)

    def _attached(self, peer: Peer, previous: str | None) -> None:
        self.core = peer.name
        self.core_since = time.time()
        peer.failures = 0
        peer.last_error = ""
        if previous is not None:
            self.core_switches += 1
        log.info("cluster: replicant attached to core %s%s", peer.name,
                 f" (was {previous})" if previous and previous != peer.name else "")
        # what waited for another core (QoS 1/2 forwards and shared-group messages not
        # acknowledged) goes through this one now: at least once
        for other in self.peers.values():
            if other is peer:
                continue
            self.parked.drop_node(other.name)
            records = list(other.outbox.records)
            if records:
                other.outbox.take({seq for seq, _ in records})
                other.shared_pending.clear()
                for _, body in records:
                    peer.outbox.append(body, lambda p=peer: self._schedule_flush(p))  # type: ignore[misc]
                log.warning("cluster: %d unacknowledged forwards for %s go through %s",
                            len(records), other.name, peer.name)

    def _detached(self, peer: Peer) -> None:
        log.warning("cluster: replicant lost its core %s", peer.name)
        self.core = self._candidate = None
        self.core_since = None
        self.routes_bootstrapped = False
        if self.raft_view is not None:
            self.raft_view.reset()
        for link in (peer.ctl_in, peer.data_in):  # its dial-back
            if link is not None:
                link.close("not our core any more")

    def _reps(self) -> list[str]:
        """The replicants attached to this core (their control link to us is open)."""
        if self.replicant:
            return []
        return [p.name for p in self.peers.values()
                if p.role == "replicant" and p.ctl_in is not None]

    def _relay_takeover(self, peer: Peer, link: Link, cid: str, msg: dict[str, Any]) -> None:
        """A takeover for a session this core does not hold: ask the nodes it stands in
        for (a replicant's request: every other holder; a core's: the replicants
        attached here); the session comes back to ``link``."""
        holders = self.registry.holders(cid) - {peer.name}
        if peer.role != "replicant":
            holders &= set(self._reps())
        asked = 0
        for name in holders:
            other = self.peers.get(name)
            if other is not None and other.ctl_out is not None and not other.ctl_out.closed:
                other.ctl_out.send(F.control(F.CAST, msg))
                asked += 1
        if asked and not msg.get("clean"):
            self._takeovers[cid] = (link, time.monotonic())

    def _relay_to(self, fwd: F.Forwarded) -> None:
        """A record for one replicant attached here (its former core's queue)."""
        assert fwd.target is not None
        peer = self.peers.get(fwd.target)
        if peer is None or peer.role != "replicant" or peer.ctl_in is None:
            log.warning("cluster: a message for %s, which is not attached here, dropped",
                        fwd.target)
            return
        body = F.encode_message(fwd.message, fwd.share)
        peer.forwarded += 1
        if fwd.message.qos == 0:
            peer.qos0.append(F.record(0, body))
            self._schedule_flush(peer)
        else:
            peer.outbox.append(body, lambda p=peer: self._schedule_flush(p))  # type: ignore[misc]
