"""Route (and session announcement) replication: each node is the only writer of its own
rows; it streams them to every peer, in order, a snapshot whenever a control link comes
up and deltas after.

Invariants:
- The routes of node N held here are exactly what N's current control link has said
  (plus, for a core, what it announces for its replicants).
- Route updates leave in the order the broker reported them, batched per loop turn; each
  batch has a revision the peer acknowledges (replication lag).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from gateway.cluster import frames as F
from gateway.cluster.link import Link
from gateway.cluster.peer import Peer
from gateway.cluster.relay import Announcer
from gateway.cluster.state import (
    ClusterState,
)

if TYPE_CHECKING:
    pass


class RouteReplicationPart(ClusterState):
    """This node's routes out, the peers' routes in."""

    def _on_routes(self, peer: Peer, link: Link, msg: dict[str, Any]) -> None:
        """A peer's routes and sessions (a snapshot and/or changes). On a core, what
        changes for its audiences is queued (relay.py); a replicant's sessions are
        claimed in Raft on its behalf."""
        reps = self._reps()
        name = peer.name
        snapshot = msg.get("snapshot")
        if isinstance(snapshot, list):
            self.parked.drop_node(name)
            self._replace(self.route_ann, self.routes, name,
                          [k for k in snapshot if isinstance(k, str)], reps)
            if self.replicant and name == self._candidate:
                self.routes_bootstrapped = True
        for op, key in msg.get("ops", ()):
            self._apply(self.route_ann, self.routes, name, key, op == "+", reps)
        table = self.raft_sessions if peer.role == "replicant" else None
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
            self._schedule_routes()
        link.send(F.control(F.ROUTES_ACK, {"rev": msg.get("rev", 0)}))

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

    def _local_route(self, key: str, added: bool) -> None:
        keys = self.local_keys
        self.route_ann.change(key, self._reps(),
                              (lambda: keys.add(key)) if added else (lambda: keys.discard(key)))
        self._schedule_routes()

    def _schedule_routes(self) -> None:
        if not self._routes_scheduled and self._loop is not None:
            self._routes_scheduled = True
            self._loop.call_soon(self._send_routes)

    def _send_routes(self) -> None:
        """Once per loop turn: each peer gets the changes of what it is told (a core's
        replicants their own view, everyone else this node's, relay.py)."""
        self._routes_scheduled = False
        ops, rep_ops = self.route_ann.take()
        sessions, rep_sessions = self.session_ann.take()
        if not (ops or sessions or rep_ops or rep_sessions):
            return
        self._route_rev += 1
        rev = self._route_rev
        frame: bytes | None = None
        for peer in self.peers.values():
            if peer.ctl_out is None or peer.ctl_out.closed:
                continue
            if peer.role == "replicant" and not self.replicant:
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
        peer.rev_sent = self._route_rev
        now = time.monotonic()
        peer.rev_times.append((self._route_rev, now))
        if peer.unacked_since is None:
            peer.unacked_since = now
