"""The glue between the cluster and its Raft group (:mod:`gateway.cluster.raft`): starting
it, the session table consumer, membership changes through the leader, and the table a
core streams to its replicants.

Owns: the group (``raft``) and its session table (``sessions``) on a core; a replicant's
copy of its core's table (``view``); the voters removed here, forgotten here and being
asked about; the sequence of the entries streamed to replicants (``rlog_seq``).

Given: the :class:`~gateway.cluster.state.Context`, ``call(name, request, timeout)`` (a
CALL to a peer, :mod:`.membership`), ``sessions_of()`` (this node's sessions and those of
the peers, :mod:`.replication`) and ``candidate()`` (the core a replicant is attached or
attaching to, :mod:`.attach`).

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
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gateway.cluster import frames as F
from gateway.cluster.link import Link
from gateway.cluster.peer import Peer
from gateway.cluster.relay import ReplicaLog
from gateway.cluster.state import Context, log

Call = Callable[[str, dict[str, Any], float], Awaitable[dict[str, Any]]]


class RaftGlue:
    """Raft group life cycle, membership through the leader, replicant stream."""

    def __init__(self, ctx: Context, *, call: Call,
                 sessions_of: Callable[[], tuple[set[str], Mapping[str, Any]]],
                 candidate: Callable[[], str | None]) -> None:
        self.ctx = ctx
        self._call = call
        self._sessions_of = sessions_of
        self._candidate = candidate
        settings = ctx.settings
        self.raft: Any = None  # gateway.cluster.raft.RaftGroup with cluster.raft on a core
        self.sessions: Any = None  # its SessionTable (cores write it)
        # a replicant's copy of its core's table (streamed by the core, relay.py)
        self.view: ReplicaLog | None = ReplicaLog() if (
            settings.raft and settings.role == "replicant") else None
        self._removed: set[str] = set()  # voters removed here; not re-added while up
        self._forget: set[str] = set()  # voters forgotten here, for the leader to remove
        self._asking: set[str] = set()  # ... a CALL for them under way
        self.rlog_seq = 0  # entries of the Raft session table applied here (cores)

    # -- life cycle --------------------------------------------------------------------

    def journal_exists(self) -> bool:
        d = self.ctx.settings.data_dir
        return d is not None and os.path.isfile(os.path.join(d, "raft.journal"))

    def start(self) -> None:
        """Raft among this node and the members known at start (docs/cluster.md). Cores
        only: a replicant gets the table streamed by its core (relay.ReplicaLog)."""
        from gateway.cluster.raft import RaftGroup, SessionTable

        ctx = self.ctx
        sessions = SessionTable()
        others = sorted(n for n, p in ctx.peers.items() if p.role != "replicant")
        data_dir = ctx.settings.data_dir if ctx.store.durable else None
        if data_dir is not None:
            os.makedirs(data_dir, exist_ok=True)
        self.raft = RaftGroup(ctx.name, others, self._send, [sessions],
                              is_up=self._peer_up, data_dir=data_dir,
                              compact_entries=ctx.settings.raft_compact_entries)
        sessions.on_apply = self._applied
        self.sessions = sessions
        self.raft.start()
        local, registry = self._sessions_of()
        for cid in local:
            sessions.claim(cid, ctx.name, sync=False)
        for peer in ctx.peers.values():  # replicants attached before Raft started
            if peer.role == "replicant" and peer.ctl_in is not None:
                for cid in registry.get(peer.name, ()):
                    sessions.claim(cid, peer.name, sync=False)
        log.info("cluster: Raft among %s%s", ", ".join([ctx.name, *others]),
                 " (resumed from its journal)" if self.raft.resumed else "")

    def stop(self) -> None:
        if self.raft is not None:
            self.raft.stop()

    def table(self) -> Any:
        """The agreed session table: a core's own, a replicant's copy, or None."""
        return self.sessions if self.sessions is not None else self.view

    # -- the stream to replicants --------------------------------------------------------

    def _applied(self, op: str, args: tuple[str, ...]) -> None:
        """The Raft session table applied a change (or loaded a dump): stream it to the
        replicants attached here, in order."""
        self.rlog_seq += 1
        for peer in self.ctx.peers.values():
            if peer.role == "replicant" and peer.ctl_out is not None:
                if op == "snapshot":
                    self.snapshot(peer)
                else:
                    peer.ctl_out.send(F.control(F.CAST, {
                        "op": "rlog", "seq": self.rlog_seq, "e": [op, list(args)]}))

    def snapshot(self, peer: Peer) -> None:
        """The whole session table to a replicant whose link just came up."""
        table = self.sessions
        if table is None or peer.ctl_out is None:
            return
        peer.ctl_out.send(F.control(F.CAST, {
            "op": "rlog", "seq": self.rlog_seq, "snapshot": table.holders,
            "leader": self.raft.leader() if self.raft is not None else None}))

    def pong_extra(self, peer: Peer) -> dict[str, Any] | None:
        """What a PONG to a replicant carries: the sequence applied here, the leader."""
        if peer.role == "replicant" and self.raft is not None:
            return {"seq": self.rlog_seq, "leader": self.raft.leader()}
        return None

    def on_pong(self, peer: str, rlog: Any) -> None:
        """A PONG from our core with its ``rlog`` figures (a replicant's lag)."""
        view = self.view
        if view is not None and isinstance(rlog, dict) and peer == self._candidate():
            seq = rlog.get("seq")
            if isinstance(seq, int):
                view.core_seq = max(view.core_seq, seq)
            leader = rlog.get("leader")
            view.leader = leader if isinstance(leader, str) else None

    def on_rlog(self, peer: Peer, msg: dict[str, Any]) -> None:
        """A replicant: an entry or snapshot of its core's table."""
        view = self.view
        if view is None or peer.name != self._candidate():
            return
        seq = msg.get("seq")
        if not isinstance(seq, int):
            return
        snapshot = msg.get("snapshot")
        if isinstance(snapshot, dict):
            view.snapshot(seq, {str(k): str(v) for k, v in snapshot.items()})
            leader = msg.get("leader")
            view.leader = leader if isinstance(leader, str) else None
            log.info("cluster: replicant bootstrapped from %s: %d sessions at %d", peer.name,
                     len(view), seq)
            return
        entry = msg.get("e")
        if isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list):
            view.entry(seq, str(entry[0]), [str(a) for a in entry[1]])

    def detached(self) -> None:
        """A replicant lost its core: its copy starts over with the next one."""
        if self.view is not None:
            self.view.reset()

    # -- transport ----------------------------------------------------------------------

    def _peer_up(self, name: str) -> bool:
        peer = self.ctx.peers.get(name)
        return peer is not None and peer.state == "up"

    def _send(self, name: str, payload: bytes) -> bool:
        peer = self.ctx.peers.get(name)
        link = None if peer is None else peer.ctl_out
        if link is None or link.closed:
            return False
        link.send(F.frame(F.RAFT, payload))
        return True

    def on_frame(self, peer: Peer, link: Link, body: bytes) -> None:
        """A RAFT frame on the peer's control link."""
        if self.raft is not None:
            self.raft.received(peer.name, body)

    # -- membership ---------------------------------------------------------------------

    def member_added(self, name: str) -> None:
        self._forget.discard(name)  # a member again

    def peer_state(self, peer: Peer, new: str) -> None:
        """``peer``'s state changed to ``new`` (start Raft at the first peer up when the
        settings ask for it; the group's connectivity follows the links)."""
        ctx = self.ctx
        if ctx.settings.raft and self.raft is None and new == "up" and not ctx.replicant:
            self.start()  # the members are known now (its WELCOME listed them)
        if new == "up":
            self._removed.discard(peer.name)  # back: the leader may add it again
        if self.raft is not None:
            if new != "up":
                self.raft.link_down(peer.name)
            elif peer.role != "replicant":
                self.raft.link_up(peer.name)

    def forgotten(self, name: str, *, claims: bool, leaving: bool) -> None:
        """A member was removed: its claims go (unless a replicant that moved), and a
        voter is removed from the group (here when leading, else by the leader)."""
        if self.sessions is not None and claims:
            self.sessions.forget(name, sync=False)
        raft = self.raft
        if raft is not None and name in raft.members():
            if raft.is_leader():
                raft.remove(name)  # a voter that left: the majority shrinks with it
            elif not leaving:  # the leader removes it (next heartbeat, a CALL)
                self._forget.add(name)

    def on_remove_call(self, link: Link, node: str, reply: Callable[[bool, str], None]
                       ) -> None:
        """CALL ``raft_remove``: remove ``node`` from the group when leading."""
        raft = self.raft
        if raft is None or not raft.is_leader():
            reply(False, "not the Raft leader")
        elif node == self.ctx.name:
            reply(False, "the leader cannot remove itself (it hands over when it leaves)")
        elif node not in raft.members():
            reply(True, "")
        else:
            log.info("cluster: removing %s from the Raft group (asked by %s)", node,
                     link.peer)
            self._removed.add(node)
            raft.remove(node, lambda ok: reply(ok, "" if ok else "not committed"))

    def tick(self, now: float) -> None:
        """Every heartbeat. On the leader: add one up core member the group lacks, or
        remove one voter that is no member any more (one change at a time; the next
        heartbeat does the next). Elsewhere: ask the leader (a CALL) to remove the
        voters this node forgot, until they are out of the group."""
        raft = self.raft
        if raft is None:
            return
        ctx = self.ctx
        members = raft.members()
        if not raft.is_leader():
            self._forget &= members
            leader = raft.leader()
            for name in self._forget - self._asking:
                if leader is not None and leader not in (name, ctx.name):
                    self._asking.add(name)
                    ctx.spawn(self._forward_removal(leader, name))
            return
        for name in sorted(members - {ctx.name}):
            if name not in ctx.peers:
                log.info("cluster: removing %s from the Raft group (no member)", name)
                raft.remove(name)
                return
        for peer in ctx.peers.values():
            if (peer.state == "up" and peer.role == "core" and peer.name not in members
                    and peer.name not in self._removed):
                log.info("cluster: adding %s to the Raft group", peer.name)
                raft.add(peer.name)
                return

    async def _forward_removal(self, leader: str, name: str) -> None:
        try:
            reply = await self._call(leader, {"op": "raft_remove", "node": name}, 5.0)
        finally:
            self._asking.discard(name)
        if reply.get("ok"):
            log.info("cluster: %s removed from the Raft group by the leader %s", name, leader)
        else:  # asked again at a later heartbeat while it is in the group
            log.warning("cluster: the Raft leader %s did not remove %s: %s", leader, name,
                        reply.get("error"))

    async def leave(self, timeout: float = 5.0) -> None:
        """This node leaves: the leader (after a hand-over when it is this node) removes
        it from the group, so the others' majority no longer counts it."""
        raft = self.raft
        if raft is None or raft.members() == {self.ctx.name}:
            return
        deadline = time.monotonic() + timeout
        asked = 0.0
        while time.monotonic() < deadline:  # bounded: a new leader, or give up
            leader = raft.leader()
            if leader is not None and leader != self.ctx.name:
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
        reply = await self._call(str(raft.leader()),
                                 {"op": "raft_remove", "node": self.ctx.name},
                                 max(left, 0.5))
        if reply.get("ok"):
            log.info("cluster: removed from the Raft group by %s", raft.leader())
        else:
            log.warning("cluster: the Raft leader did not remove this node: %s",
                        reply.get("error"))

    def status(self, core: str | None) -> dict[str, Any] | None:
        """The view's ``raft`` entry (``core``: a replicant's core)."""
        if self.raft is not None:
            return {**self.raft.status(), "sessions": len(self.sessions)}
        if self.view is not None:  # a replicant: its core's table, streamed
            return {**self.view.status(), "core": core, "sessions": len(self.view)}
        return None
