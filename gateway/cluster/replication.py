"""Route (and session announcement) replication: each node is the only writer of its own
rows; it streams them to every peer, in order, a snapshot whenever a control link comes
up and deltas after.

Owns: the peers' routes (``routes``), the routes parked for peers gone without a LEAVE
(``parked``), this node's route keys (``local_keys``), the peers' sessions
(``registry``), this node's sessions (``local_sessions``), what to announce to whom
(``route_ann``, ``session_ann``, :mod:`gateway.cluster.relay`) and the route revision.

Given: the :class:`~gateway.cluster.state.Context`, ``bootstrapped(name)`` (a peer's
snapshot arrived: the attach part checks it is its core) and ``claims()`` (the Raft
session table a core claims its replicants' sessions in, or None).

Invariants:
- The routes of node N held here are exactly what N's current control link has said
  (plus, for a core, what it announces for its replicants).
- Route updates leave in the order the broker reported them, batched per loop turn; each
  batch has a revision the peer acknowledges (replication lag).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gateway.cluster import frames as F
from gateway.cluster.link import Link
from gateway.cluster.peer import Peer
from gateway.cluster.relay import Announcer
from gateway.cluster.routes import RouteTable
from gateway.cluster.state import _SHARED_PREFIXES, Context
from gateway.cluster.takeover import SessionRegistry


class RouteReplication:
    """This node's routes and sessions out, the peers' in."""

    def __init__(self, ctx: Context, *, bootstrapped: Callable[[str], None],
                 claims: Callable[[], Any]) -> None:
        self.ctx = ctx
        self._bootstrapped = bootstrapped
        self._claims = claims
        self.routes = RouteTable()
        # plain routes of peers whose control link went without a LEAVE (dead or cut
        # off): QoS 1/2 messages still queue durably for them until they return (their
        # snapshot replaces this) or are removed (autoclean, force-leave)
        self.parked = RouteTable()
        self.local_keys: set[str] = set()
        self.registry = SessionRegistry()  # client id -> other nodes holding a session
        self.local_sessions: set[str] = set()
        # what to announce to whom (a core stands in for its replicants: relay.py)
        self.route_ann = Announcer(lambda: self.local_keys, lambda: self.routes.by_node,
                                   lambda k: self.routes.nodes_of.get(k, ()))
        self.session_ann = Announcer(lambda: self.local_sessions,
                                     lambda: self.registry.by_node, self.registry.holders)
        self.rev = 0
        self._scheduled = False

    # -- in ----------------------------------------------------------------------------

    def on_routes(self, peer: Peer, link: Link, body: bytes) -> None:
        """A peer's routes and sessions (a snapshot and/or changes). On a core, what
        changes for its audiences is queued (relay.py); a replicant's sessions are
        claimed in Raft on its behalf."""
        msg = F.parse_control(body)
        reps = self.ctx.reps()
        name = peer.name
        snapshot = msg.get("snapshot")
        if isinstance(snapshot, list):
            self.parked.drop_node(name)
            self._replace(self.route_ann, self.routes, name,
                          [k for k in snapshot if isinstance(k, str)], reps)
            self._bootstrapped(name)
        for op, key in msg.get("ops", ()):
            self._apply(self.route_ann, self.routes, name, key, op == "+", reps)
        table = self._claims() if peer.role == "replicant" else None
        sessions = msg.get("sessions_snapshot")
        if isinstance(sessions, list):
            cids = [c for c in sessions if isinstance(c, str)]
            self._replace(self.session_ann, self.registry, name, cids, reps)
            if table is not None:
                for cid in cids:
                    if table.holder(cid) != name:
                        table.claim(cid, name, sync=False)
        for op, cid in msg.get("sessions", ()):
            self._apply(self.session_ann, self.registry, name, cid, op == "+", reps)
            if table is not None:
                if op == "+":
                    table.claim(cid, name, sync=False)
                else:
                    table.release(cid, name, sync=False)
        if reps:
            self.schedule()
        link.send(F.control(F.ROUTES_ACK, {"rev": msg.get("rev", 0)}))

    def on_ack(self, peer: Peer, link: Link, body: bytes) -> None:
        """ROUTES_ACK: the peer applied our revisions up to ``rev`` (replication lag)."""
        rev = F.parse_control(body).get("rev")
        if isinstance(rev, int) and rev > peer.rev_acked:
            peer.rev_acked = rev
            now = time.monotonic()
            times = peer.rev_times
            sent_at = None
            while times and times[0][0] <= rev:
                sent_at = times.popleft()[1]
            if sent_at is not None:  # lag: from sending this revision to its ack
                peer.route_lag_ms = (now - sent_at) * 1000
            peer.unacked_since = times[0][1] if times else None

    @staticmethod
    def _apply(ann: Announcer, table: Any, node: str, key: str, added: bool,
               reps: list[str]) -> None:
        def change() -> None:
            if added:
                table.add(node, key)
            else:
                table.remove(node, key)
        if reps:
            ann.change(key, reps, change)
        else:
            change()

    def _replace(self, ann: Announcer, table: Any, node: str, keys: list[str],
                 reps: list[str]) -> None:
        if not reps:
            table.replace(node, keys)
            return
        old = set(table.by_node.get(node, ()))
        new = set(keys)
        for key in old - new:
            self._apply(ann, table, node, key, False, reps)
        for key in new - old:
            self._apply(ann, table, node, key, True, reps)

    def _drop(self, ann: Announcer, table: Any, node: str, reps: list[str]) -> int:
        if not reps:
            return int(table.drop_node(node))
        keys = list(table.by_node.get(node, ()))
        for key in keys:
            self._apply(ann, table, node, key, False, reps)
        return len(keys)

    def drop_node(self, name: str, reps: list[str], *, park: bool = False) -> int:
        """``name``'s routes and sessions go (its control link to us closed, or it was
        removed); ``reps``: the replicants attached here before the change. With
        ``park`` its plain routes are kept in ``parked`` (QoS 1/2 still queue for it);
        without, its parked routes go too. How many routes went."""
        if park:
            self.parked.replace(name, [k for k in self.routes.keys_of(name)
                                       if not k.startswith(_SHARED_PREFIXES)])
        else:
            self.parked.drop_node(name)
        removed = self._drop(self.route_ann, self.routes, name, reps)
        self._drop(self.session_ann, self.registry, name, reps)
        self.schedule()
        return removed

    # -- out ---------------------------------------------------------------------------

    def start(self, keys: set[str], sessions: set[str]) -> None:
        """This node's route keys and sessions when the cluster starts."""
        self.local_keys = keys
        self.local_sessions = sessions

    def local_route(self, key: str, added: bool) -> None:
        """``Broker.on_route``: a route key of this node came or went."""
        keys = self.local_keys
        self.route_ann.change(key, self.ctx.reps(),
                              (lambda: keys.add(key)) if added else (lambda: keys.discard(key)))
        self.schedule()

    def local_session(self, cid: str, added: bool) -> None:
        """This node holds a session for ``cid`` now (or no longer)."""
        if added == (cid in self.local_sessions):
            return
        sessions = self.local_sessions
        self.session_ann.change(cid, self.ctx.reps(), (lambda: sessions.add(cid)) if added
                                else (lambda: sessions.discard(cid)))
        self.schedule()

    def snapshot(self, peer: Peer) -> None:
        """Our routes and sessions, from scratch, on our new control link to ``peer``: it
        replaces whatever it had from us (a core stands in for its replicants, and for
        the cluster towards them: relay.py)."""
        assert peer.ctl_out is not None
        self.rev += 1
        if peer.role == "replicant" and not self.ctx.replicant:
            keys = self.route_ann.replica_view(peer.name)
            cids = self.session_ann.replica_view(peer.name)
            self.route_ann.replica_ops.pop(peer.name, None)
            self.session_ann.replica_ops.pop(peer.name, None)
        else:
            reps = self.ctx.reps()
            keys = self.route_ann.core_view(reps)
            cids = self.session_ann.core_view(reps)
        peer.ctl_out.send(F.control(F.ROUTES, {
            "snapshot": sorted(keys), "sessions_snapshot": sorted(cids), "rev": self.rev,
        }))
        self._sent_rev(peer)

    def schedule(self) -> None:
        if not self._scheduled and self.ctx.loop is not None:
            self._scheduled = True
            self.ctx.loop.call_soon(self._send_routes)

    def _send_routes(self) -> None:
        """Once per loop turn: each peer gets the changes of what it is told (a core's
        replicants their own view, everyone else this node's, relay.py)."""
        self._scheduled = False
        ops, rep_ops = self.route_ann.take()
        sessions, rep_sessions = self.session_ann.take()
        if not (ops or sessions or rep_ops or rep_sessions):
            return
        self.rev += 1
        rev = self.rev
        frame: bytes | None = None
        replicant = self.ctx.replicant
        for peer in self.ctx.peers.values():
            if peer.ctl_out is None or peer.ctl_out.closed:
                continue
            if peer.role == "replicant" and not replicant:
                r_ops, r_sessions = rep_ops.get(peer.name), rep_sessions.get(peer.name)
                if not r_ops and not r_sessions:
                    continue
                peer.ctl_out.send(F.control(F.ROUTES, {
                    "ops": r_ops or [], "sessions": r_sessions or [], "rev": rev}))
            else:
                if not ops and not sessions:
                    continue
                if frame is None:
                    frame = F.control(F.ROUTES, {"ops": ops, "sessions": sessions, "rev": rev})
                peer.ctl_out.send(frame)
            self._sent_rev(peer)

    def _sent_rev(self, peer: Peer) -> None:
        peer.rev_sent = self.rev
        now = time.monotonic()
        peer.rev_times.append((self.rev, now))
        if peer.unacked_since is None:
            peer.unacked_since = now
