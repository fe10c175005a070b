"""Shared subscriptions across nodes: the publishing node picks one node with members of
each matching group; that node picks the member.

Owns: the cached order of each group's nodes (``_share_order``).

Given: the :class:`~gateway.cluster.state.Context`, the peers' routes (``routes``, read
only, owned by :mod:`gateway.cluster.replication`) and the
:class:`~gateway.cluster.forwarding.Sender` that queues records for a peer.

Invariants:
- Each message goes to one member of a group in the whole cluster while a member exists;
  messages queued for a node that went down are given to other nodes with members (at
  least once).
- Nodes are ordered by the group's strategy over node names sorted by name, so the
  hash strategies choose the same node on every node.
"""

from __future__ import annotations

from gateway.cluster import frames as F
from gateway.cluster.forwarding import Sender
from gateway.cluster.peer import Peer
from gateway.cluster.routes import RouteTable
from gateway.cluster.state import MAX_QOS0_PENDING, Context, log
from gateway.core.shared import SharedGroup
from protocols.context import Message


class SharedSubscriptions:
    """Choosing a node per shared-group message, and rerouting."""

    def __init__(self, ctx: Context, routes: RouteTable, sender: Sender) -> None:
        self.ctx = ctx
        self.routes = routes
        self.sender = sender
        self._share_order: dict[tuple[str, str], tuple[frozenset[str], SharedGroup[str]]] = {}

    def forward(self, message: Message) -> int:
        targets: dict[tuple[str, str], set[str]] = {}
        for group, real, nodes in self.routes.match_groups(message.topic):
            targets[(group, real)] = set(nodes)
        for key in self.ctx.node.broker.shared_groups(message.topic):
            targets.setdefault(key, set()).add(self.ctx.name)
        n = 0
        for (group, real), nodes in targets.items():
            if self.dispatch(message, group, real, nodes, ()):
                n += 1
        return n

    def reshare(self, message: Message, group: str, real: str,
                exclude: tuple[str, ...] | set[str] = ()) -> bool:
        """A shared-group message whose chosen member or node is gone: give it to another
        node with members of the group (this one included unless excluded)."""
        nodes = set(self.routes.groups.get(real, {}).get(group, ()))
        if self.ctx.node.broker.shared.get(real, {}).get(group) is not None:
            nodes.add(self.ctx.name)
        return self.dispatch(message, group, real, nodes, exclude)

    def dispatch(self, message: Message, group: str, real: str, nodes: set[str],
                         exclude: tuple[str, ...] | set[str]) -> bool:
        """One node for the group, tried in the strategy's order: this node delivers to a
        local member itself; a reachable peer gets a record marked with the group. With
        no reachable peer left, a QoS 1/2 message waits in the first candidate's outbox."""
        order = [n for n in self._node_order(group, real, nodes, message) if n not in exclude]
        broker = self.ctx.node.broker
        for name in order:
            if name == self.ctx.name:
                if broker.deliver_shared(message, real, group):
                    return True
                continue
            peer = self.ctx.peers.get(name)
            if peer is not None and peer.data_out is not None and not peer.data_out.closed:
                return self._send_shared(peer, message, group, real)
        if message.qos:
            for name in order:
                peer = self.ctx.peers.get(name)
                if peer is not None:
                    return self._send_shared(peer, message, group, real)
        return False

    def _send_shared(self, peer: Peer, message: Message, group: str, real: str) -> bool:
        body = F.encode_message(message, (group, real))
        peer.forwarded += 1
        if message.qos == 0:
            if len(peer.qos0) >= MAX_QOS0_PENDING:
                peer.dropped += 1
                return False
            self.sender.queue(peer, body, 0)
            return True
        seq = peer.outbox.append(body, lambda p=peer: self.sender.schedule(p))  # type: ignore[misc]
        peer.shared_pending[seq] = (group, real, message)
        return True

    def _node_order(self, group: str, real: str, nodes: set[str], message: Message
                    ) -> list[str]:
        """The nodes of a group in the order to try them: the broker's strategy applied to
        nodes (sorted by name, so hashing strategies agree on every node); ``local``
        puts this node first when it has members."""
        key = (group, real)
        members = frozenset(nodes)
        entry = self._share_order.get(key)
        if entry is None or entry[0] != members:
            order: SharedGroup[str] = SharedGroup()
            for name in sorted(members):
                order.add(name)
            if not members:
                self._share_order.pop(key, None)
            else:
                self._share_order[key] = (members, order)
        else:
            order = entry[1]
        strategy = self.ctx.node.broker.shared_strategy
        if strategy == "local":
            if self.ctx.name in members:
                return [self.ctx.name, *(n for n in order if n != self.ctx.name)]
            strategy = "random"
        return list(order.candidates(strategy, topic=message.topic,
                                     publisher=message.publisher, rng=self.ctx.node.broker.rng))

    def reroute(self, peer: Peer) -> None:
        """``peer`` is down or removed: its unacknowledged shared-group messages go to
        other nodes with members (at least once: it may have applied some)."""
        pending = peer.shared_pending
        if not pending:
            return
        peer.shared_pending = {}
        taken = peer.outbox.take(set(pending))
        moved = sum(
            1 for seq in taken
            if self.reshare(pending[seq][2], pending[seq][0], pending[seq][1], {peer.name})
        )
        log.warning("cluster: %s is gone: %d of its %d unacknowledged shared-subscription "
                    "messages given to other members", peer.name, moved, len(taken))
