"""Sessions across nodes: this node's sessions announced to the others (and claimed in
Raft), and takeover of a session held elsewhere (:mod:`gateway.cluster.takeover`).

Invariants:
- A client id is announced by a node exactly while that node holds a session for it.
- A takeover asks every node that announced the client (and the Raft holder) and waits
  at most ``connect_timeout``; the old connection gets 0x8E.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.cluster import frames as F
from gateway.cluster.state import (
    ClusterState,
)
from protocols.context import ClientInfo

if TYPE_CHECKING:
    pass


class SessionsPart(ClusterState):
    """Session announcements and takeover."""

    def _session_created(self, client: ClientInfo) -> None:
        cid = client.client_id
        if self.raft_sessions is not None:
            self.raft_sessions.claim(cid, self.name, sync=False)
        if cid not in self.local_sessions:
            self.session_ann.change(cid, self._reps(), lambda: self.local_sessions.add(cid))
            self._schedule_routes()

    def session_ended(self, cid: str) -> None:
        """``Node._terminate``: this node no longer holds a session for ``cid``."""
        if self.raft_sessions is not None:
            self.raft_sessions.release(cid, self.name, sync=False)
        if cid in self.local_sessions:
            self.session_ann.change(cid, self._reps(),
                                    lambda: self.local_sessions.discard(cid))
            self._schedule_routes()

    def takeover(self, client: ClientInfo, clean_start: bool) -> bool:
        """``Node.open_session`` for a client id without a session here: ask every node
        holding one to hand it over (or end it, with clean start). True when the
        session will be present here."""
        holders = self.registry.holders(client.client_id) - {self.name}
        if self._raft_table() is not None:  # the agreed registry, when Raft is on
            agreed = self._raft_table().holder(client.client_id)
            if agreed is not None and agreed != self.name:
                holders = holders | {agreed}
        asked = 0
        for name in holders:
            peer = self.peers.get(name)
            if peer is None or peer.ctl_out is None or peer.ctl_out.closed:
                continue
            peer.ctl_out.send(F.control(F.CAST, {
                "op": "takeover", "cid": client.client_id, "clean": clean_start,
            }))
            asked += 1
        return asked > 0 and not clean_start
