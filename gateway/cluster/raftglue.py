"""The glue between the cluster and its Raft group (:mod:`gateway.cluster.raft`): starting
it, the session table consumer, membership changes through the leader, and the table a
core streams to its replicants.

Invariants:
- Only cores run Raft; a replicant follows its core's applied session table.
- The leader alone adds and removes voters, one change per heartbeat; a node that forgets
  a voter while not leading asks the leader (a CALL) until the voter is out.
- Entries a core streams to a replicant are numbered in the order applied; a snapshot
  precedes them on every attach.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import TYPE_CHECKING, Any

from gateway.cluster import frames as F
from gateway.cluster.peer import Peer
from gateway.cluster.state import (
    ClusterState,
    log,
)

if TYPE_CHECKING:
    pass


class RaftGluePart(ClusterState):
    """Raft group life cycle, membership through the leader, replicant stream."""

    def _raft_journal_exists(self) -> bool:
        d = self.settings.data_dir
        return d is not None and os.path.isfile(os.path.join(d, "raft.journal"))

    def _start_raft(self) -> None:
        """Raft among this node and the members known at start (docs/cluster.md). Cores
        only: a replicant gets the table streamed by its core (relay.ReplicaLog)."""
        from gateway.cluster.raft import RaftGroup, SessionTable

        sessions = SessionTable()
        others = sorted(n for n, p in self.peers.items() if p.role != "replicant")
        data_dir = self.settings.data_dir if self.store.durable else None
        if data_dir is not None:
            os.makedirs(data_dir, exist_ok=True)
        self.raft = RaftGroup(self.name, others, self._raft_send, [sessions],
                              is_up=self._raft_peer_up, data_dir=data_dir,
                              compact_entries=self.settings.raft_compact_entries)
        sessions.on_apply = self._rlog_applied
        self.raft_sessions = sessions
        self.raft.start()
        for cid in self.local_sessions:
            sessions.claim(cid, self.name, sync=False)
        for peer in self.peers.values():  # replicants attached before Raft started
            if peer.role == "replicant" and peer.ctl_in is not None:
                for cid in self.registry.by_node.get(peer.name, ()):
                    sessions.claim(cid, peer.name, sync=False)
        log.info("cluster: Raft among %s%s", ", ".join([self.name, *others]),
                 " (resumed from its journal)" if self.raft.resumed else "")

    def _raft_table(self) -> Any:
        return self.raft_sessions if self.raft_sessions is not None else self.raft_view

    def _rlog_applied(self, op: str, args: tuple[str, ...]) -> None:
        """The Raft session table applied a change (or loaded a dump): stream it to the
        replicants attached here, in order."""
        self._rlog_seq += 1
        for peer in self.peers.values():
            if peer.role == "replicant" and peer.ctl_out is not None:
                if op == "snapshot":
                    self._rlog_snapshot(peer)
                else:
                    peer.ctl_out.send(F.control(F.CAST, {
                        "op": "rlog", "seq": self._rlog_seq, "e": [op, list(args)]}))

    def _rlog_snapshot(self, peer: Peer) -> None:
        table = self.raft_sessions
        if table is None or peer.ctl_out is None:
            return
        peer.ctl_out.send(F.control(F.CAST, {
            "op": "rlog", "seq": self._rlog_seq, "snapshot": table.holders,
            "leader": self.raft.leader() if self.raft is not None else None}))

    def _raft_peer_up(self, name: str) -> bool:
        peer = self.peers.get(name)
        return peer is not None and peer.state == "up"

    def _raft_membership(self) -> None:
        """Every heartbeat. On the leader: add one up core member the group lacks, or
        remove one voter that is no member any more (one change at a time; the next
        heartbeat does the next). Elsewhere: ask the leader (a CALL) to remove the
        voters this node forgot, until they are out of the group."""
        raft = self.raft
        if raft is None:
            return
        members = raft.members()
        if not raft.is_leader():
            self._raft_forget &= members
            leader = raft.leader()
            for name in self._raft_forget - self._raft_asking:
                if leader is not None and leader not in (name, self.name):
                    self._raft_asking.add(name)
                    self._spawn(self._forward_removal(leader, name))
            return
        for name in sorted(members - {self.name}):
            if name not in self.peers:
                log.info("cluster: removing %s from the Raft group (no member)", name)
                raft.remove(name)
                return
        for peer in self.peers.values():
            if (peer.state == "up" and peer.role == "core" and peer.name not in members
                    and peer.name not in self._raft_removed):
                log.info("cluster: adding %s to the Raft group", peer.name)
                raft.add(peer.name)
                return

    def _raft_send(self, name: str, payload: bytes) -> bool:
        peer = self.peers.get(name)
        link = None if peer is None else peer.ctl_out
        if link is None or link.closed:
            return False
        link.send(F.frame(F.RAFT, payload))
        return True

    async def _raft_leave(self, timeout: float = 5.0) -> None:
        raft = self.raft
        if raft is None or raft.members() == {self.name}:
            return
        deadline = time.monotonic() + timeout
        asked = 0.0
        while time.monotonic() < deadline:  # bounded: a new leader, or give up
            leader = raft.leader()
            if leader is not None and leader != self.name:
                break
            if raft.is_leader() and time.monotonic() - asked > 0.25:
                # denied while the other voters are not caught up: asked again
                asked = time.monotonic()
                raft.transfer_leadership()
            await asyncio.sleep(0.05)
        else:
            log.warning("cluster: leaving without leaving the Raft group (no other leader)")
            return
        left = deadline - time.monotonic()
        reply = await self.call(str(raft.leader()), {"op": "raft_remove", "node": self.name},
                                max(left, 0.5))
        if reply.get("ok"):
            log.info("cluster: removed from the Raft group by %s", raft.leader())
        else:
            log.warning("cluster: the Raft leader did not remove this node: %s",
                        reply.get("error"))

    def _on_rlog(self, msg: dict[str, Any]) -> None:
        view = self.raft_view
        assert view is not None
        seq = msg.get("seq")
        if not isinstance(seq, int):
            return
        snapshot = msg.get("snapshot")
        if isinstance(snapshot, dict):
            view.snapshot(seq, {str(k): str(v) for k, v in snapshot.items()})
            leader = msg.get("leader")
            view.leader = leader if isinstance(leader, str) else None
            log.info("cluster: replicant bootstrapped from %s: %d sessions at %d", self._candidate,
                     len(view), seq)
            return
        entry = msg.get("e")
        if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list):
            view.entry(seq, str(entry[0]), [str(a) for a in entry[1]])
