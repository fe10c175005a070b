"""Forwarding: publishes to the nodes whose routes match, QoS 0 in memory and QoS 1/2
through each peer's durable outbox; DATA batches in and out.

:class:`Sender` owns the flushing of a peer's queues to its data link (every part that
queues a record for a peer asks it to flush). :class:`Forwarding` owns the inbox marks
(``inbox``: per peer, the epoch and the highest sequence applied here).

Given: the :class:`~gateway.cluster.state.Context`, the route tables it reads (``routes``
and ``parked``, owned by :mod:`gateway.cluster.replication`), ``core()`` (a replicant's
core), ``relay_to(fwd)`` (a record for a replicant attached here, :mod:`.attach`), the
shared-subscription part (a :class:`Shares`) and ``injecting(sends_tables)`` (the
tables' guard around a forwarded retained message, :mod:`gateway.cluster.tables`).

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
from contextlib import AbstractContextManager
from typing import Protocol

from gateway.cluster import frames as F
from gateway.cluster.link import Link
from gateway.cluster.peer import Peer
from gateway.cluster.routes import RouteTable
from gateway.cluster.state import HIGH_WATER, MAX_QOS0_PENDING, Context
from protocols.context import Message


class Shares(Protocol):
    """What forwarding asks of :class:`gateway.cluster.sharing.SharedSubscriptions`."""

    def forward(self, message: Message) -> int: ...
    def reshare(self, message: Message, group: str, real: str,
                exclude: tuple[str, ...] | set[str] = ()) -> bool: ...
    def dispatch(self, message: Message, group: str, real: str, nodes: set[str],
                 exclude: tuple[str, ...] | set[str]) -> bool: ...


class Sender:
    """Each peer's queued records (QoS 0 in memory, the outbox's unsent ones) written to
    its data link in batches, once per loop turn, holding back above ``HIGH_WATER``."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def schedule(self, peer: Peer) -> None:
        if not peer.flush_scheduled and self.ctx.loop is not None:
            peer.flush_scheduled = True
            self.ctx.loop.call_soon(self._flush, peer)

    def _flush(self, peer: Peer) -> None:
        peer.flush_scheduled = False
        link = peer.data_out
        if link is None or link.closed:
            peer.dropped += len(peer.qos0)
            peer.qos0.clear()
            return
        if peer.blocked:
            return
        batch = self.ctx.settings.forward_batch
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
            self.ctx.spawn(self._unblock(peer, link))

    async def _unblock(self, peer: Peer, link: Link) -> None:
        try:
            await link.drain()
        finally:
            peer.blocked = False
            self.schedule(peer)

    def queue(self, peer: Peer, body: bytes, qos: int) -> None:
        """One record for ``peer``: QoS 0 in memory, else through its outbox."""
        if qos == 0:
            peer.qos0.append(F.record(0, body))
            self.schedule(peer)
        else:
            peer.outbox.append(body, lambda p=peer: self.schedule(p))  # type: ignore[misc]


class Forwarding:
    """Forwards out (route lookup, outboxes) and DATA in."""

    def __init__(self, ctx: Context, sender: Sender, routes: RouteTable, parked: RouteTable,
                 shares: Shares, *, core: Callable[[], str | None],
                 relay_to: Callable[[F.Forwarded], None],
                 injecting: Callable[[bool], AbstractContextManager[None]]) -> None:
        self.ctx = ctx
        self.sender = sender
        self.routes = routes
        self.parked = parked
        self.shares = shares
        self._core = core
        self._relay_to = relay_to
        self._injecting = injecting
        self.inbox: dict[str, tuple[str, int]] = ctx.store.inbox()

    def on_data(self, peer: Peer, link: Link, body: bytes) -> None:
        ctx = self.ctx
        batch = F.decode_batch(body)
        epoch = str(link.info.get("epoch", ""))
        mark = self.inbox.get(peer.name)
        applied = mark[1] if mark is not None and mark[0] == epoch else 0
        top = 0
        inject = ctx.node.inject
        # a core relays: from a replicant to every other node with routes, from a core
        # to the replicants attached here (relay.py); never further
        reps = set(ctx.reps())
        allow: Callable[[str], bool] | None = None
        if not ctx.replicant:
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
            if fwd.target is not None and fwd.target != ctx.name:
                self._relay_to(fwd)  # queued by its former core for a replicant of ours
            elif fwd.share is None:
                with self._injecting(bool(link.info.get("tables"))):
                    inject(fwd.message)
                if allow is not None:
                    self.forward_plain(fwd.message, allow)
            elif not inject(fwd.message, fwd.share):  # no member here: another node
                group, real = fwd.share
                if peer.role == "replicant" and not ctx.replicant:
                    self.shares.reshare(fwd.message, group, real, {ctx.name, peer.name})
                    continue
                nodes = reps & set(self.routes.groups.get(real, {}).get(group, ()))
                if not (nodes and self.shares.dispatch(fwd.message, group, real, nodes, ())):
                    self.shares.reshare(fwd.message, group, real, {ctx.name})
        if top:
            self.inbox[peer.name] = (epoch, applied)
            ctx.store.applied_saved(peer.name, epoch, applied)
            ack = F.control(F.ACK, {"seq": applied})
            ctx.store.after_commit(lambda: link.send(ack))

    def on_ack(self, peer: Peer, link: Link, body: bytes) -> None:
        """ACK: the peer committed our forwards up to ``seq``."""
        seq = F.parse_control(body).get("seq")
        if isinstance(seq, int):
            peer.outbox.ack(seq)
            pending = peer.shared_pending
            while pending:
                first = next(iter(pending))
                if first > seq:
                    break
                del pending[first]

    def forward(self, message: Message) -> int:
        """Queue ``message`` for every other node with a matching plain route, and give it
        to one node (this one included) per matching shared group; how many."""
        n = self.forward_plain(message)
        if self.routes.groups or self.ctx.node.broker.shared:
            n += self.shares.forward(message)
        return n

    def forward_plain(self, message: Message, allow: Callable[[str], bool] | None = None
                      ) -> int:
        """``allow``: the nodes a core relays to (see ``on_data``)."""
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
        peers = self.ctx.peers
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
            self.sender.queue(peer, body, message.qos)
        return n

    def _retain_targets(self) -> set[str]:
        """The peers a retained message goes to: a replicant's core; on a core, the
        cores and the replicants attached here (their core relays the rest)."""
        if self.ctx.replicant:
            core = self._core()
            return {core} if core is not None else set()
        return {n for n, p in self.ctx.peers.items()
                if p.role != "replicant" or p.ctl_in is not None}

    def link_up(self, peer: Peer, data: Link) -> None:
        """Our data link to ``peer`` is up: every unacknowledged forward it has not
        applied (its WELCOME says up to where) is sent again."""
        box = peer.outbox
        applied = data.info.get("applied")
        if isinstance(applied, int) and applied > 0:
            box.ack(applied)
        box.rewind()
        self.sender.schedule(peer)

    def applied_mark(self, name: str, epoch: str) -> int:
        """The highest sequence of ``name``'s epoch applied here (0: none)."""
        mark = self.inbox.get(name)
        return mark[1] if mark is not None and mark[0] == epoch else 0
