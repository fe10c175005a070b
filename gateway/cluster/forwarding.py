"""Forwarding: publishes to the nodes whose routes match, QoS 0 in memory and QoS 1/2
through each peer's durable outbox; DATA batches in and out.

Invariants:
- A QoS 1/2 forward is acknowledged to the publisher only once committed to the outbox,
  sent only once committed, and removed only when the receiver acknowledged after its own
  commit; a repeat at or below the receiver's mark for the sender's epoch is dropped.
- A forwarded message is routed locally by the receiver and never forwarded again, except
  by a core relaying for its replicants (at most three hops in all).
- A retained message forwarded by a peer is not stored from its DATA record: the stamped
  row of the replicated ``retained`` table is (:mod:`gateway.cluster.tables`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.cluster import frames as F
from gateway.cluster.link import Link
from gateway.cluster.peer import Peer
from gateway.cluster.state import (
    HIGH_WATER,
    MAX_QOS0_PENDING,
    ClusterState,
)
from protocols.context import Message

if TYPE_CHECKING:
    pass


class ForwardingPart(ClusterState):
    """Forwards out (route lookup, outboxes, flushing) and DATA in."""

    def _on_data(self, peer: Peer, link: Link, body: bytes) -> None:
        batch = F.decode_batch(body)
        epoch = str(link.info.get("epoch", ""))
        mark = self.inbox.get(peer.name)
        applied = mark[1] if mark is not None and mark[0] == epoch else 0
        top = 0
        inject = self.node.inject
        # a core relays: from a replicant to every other node with routes, from a core
        # to the replicants attached here (relay.py); never further
        reps = set(self._reps())
        allow: Callable[[str], bool] | None = None
        if not self.replicant:
            if peer.role == "replicant":
                allow = peer.name.__ne__
            elif reps:
                allow = reps.__contains__
        for fwd in batch:
            seq = fwd.seq
            if seq:
                top = max(top, seq)
                if seq <= applied:
                    peer.duplicates += 1
                    continue
                applied = seq
            peer.received += 1
            if fwd.target is not None and fwd.target != self.name:
                self._relay_to(fwd)  # queued by its former core for a replicant of ours
            elif fwd.share is None:
                with self.tables.injecting(bool(link.info.get("tables"))):
                    inject(fwd.message)
                if allow is not None:
                    self._forward_plain(fwd.message, allow)
            elif not inject(fwd.message, fwd.share):  # no member here: another node
                group, real = fwd.share
                if peer.role == "replicant" and not self.replicant:
                    self.reshare(fwd.message, group, real, {self.name, peer.name})
                    continue
                nodes = reps & set(self.routes.groups.get(real, {}).get(group, ()))
                if not (nodes and self._dispatch_shared(fwd.message, group, real, nodes, ())):
                    self.reshare(fwd.message, group, real, {self.name})
        if top:
            self.inbox[peer.name] = (epoch, applied)
            self.store.applied_saved(peer.name, epoch, applied)
            ack = F.control(F.ACK, {"seq": applied})
            self.store.after_commit(lambda: link.send(ack))

    def forward(self, message: Message) -> int:
        """Queue ``message`` for every other node with a matching plain route, and give it
        to one node (this one included) per matching shared group; how many."""
        n = self._forward_plain(message)
        if self.routes.groups or self.node.broker.shared:
            n += self._forward_shared(message)
        return n

    def _forward_plain(self, message: Message, allow: Callable[[str], bool] | None = None
                       ) -> int:
        """``allow``: the nodes a core relays to (see ``_on_data``)."""
        nodes = self.routes.match(message.topic)
        if message.qos and self.parked.by_node:
            nodes = nodes | self.parked.match(message.topic)
        if message.retain:  # every node keeps the retained messages
            nodes = nodes | self._retain_targets()
        if allow is not None:
            nodes = {n for n in nodes if allow(n)}
        if not nodes:
            return 0
        body = F.encode_message(message)
        n = 0
        peers = self.peers
        for name in nodes:
            peer = peers.get(name)
            if peer is None:
                continue
            n += 1
            peer.forwarded += 1
            if message.qos == 0:
                if peer.data_out is None:
                    peer.dropped += 1
                    continue
                if len(peer.qos0) >= MAX_QOS0_PENDING:
                    peer.dropped += 1
                    continue
                peer.qos0.append(F.record(0, body))
                self._schedule_flush(peer)
            else:
                peer.outbox.append(body, lambda p=peer: self._schedule_flush(p))  # type: ignore[misc]
        return n

    def _retain_targets(self) -> set[str]:
        """The peers a retained message goes to: a replicant's core; on a core, the
        cores and the replicants attached here (their core relays the rest)."""
        if self.replicant:
            return {self.core} if self.core is not None else set()
        return {n for n, p in self.peers.items()
                if p.role != "replicant" or p.ctl_in is not None}

    def _schedule_flush(self, peer: Peer) -> None:
        if not peer.flush_scheduled and self._loop is not None:
            peer.flush_scheduled = True
            self._loop.call_soon(self._flush, peer)

    def _flush(self, peer: Peer) -> None:
        peer.flush_scheduled = False
        link = peer.data_out
        if link is None or link.closed:
            peer.dropped += len(peer.qos0)
            peer.qos0.clear()
            return
        if peer.blocked:
            return
        batch = self.settings.forward_batch
        records, peer.qos0 = peer.qos0, []
        box = peer.outbox
        unsent = box.unsent()
        if unsent:
            records.extend(F.record(seq, body) for seq, body in unsent)
            box.sent = unsent[-1][0]
        for i in range(0, len(records), batch):
            link.send(F.encode_batch(records[i : i + batch]))
        if link.buffered() > HIGH_WATER:
            peer.blocked = True
            self._spawn(self._unblock(peer, link))

    async def _unblock(self, peer: Peer, link: Link) -> None:
        try:
            await link.drain()
        finally:
            peer.blocked = False
            self._schedule_flush(peer)
