"""Sessions across nodes: this node's sessions announced to the others (and claimed in
Raft), and takeover of a session held elsewhere (:mod:`gateway.cluster.takeover`).

Owns: the takeovers a core relays (``_takeovers``: client id -> the link the session goes
back on, and when; forgotten after a minute).

Given: the :class:`~gateway.cluster.state.Context`, the route replication part (the
peers' ``registry``, ``local_session``) and ``raft_table()`` (the agreed session table:
a core's Raft table, a replicant's copy of its core's, or None) and ``claims()`` (the
table this node claims its own sessions in: a core's Raft table, or None).

Invariants:
- A client id is announced by a node exactly while that node holds a session for it.
- A takeover asks every node that announced the client (and the Raft holder) and waits
  at most ``connect_timeout``; the old connection gets 0x8E.
- A core relays a takeover one hop (a replicant's request to the other holders, a core's
  to the replicants attached here) and the session goes back on the asking link.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from gateway.cluster import frames as F
from gateway.cluster.link import Link
from gateway.cluster.peer import Peer
from gateway.cluster.replication import RouteReplication
from gateway.cluster.state import Context, log
from gateway.cluster.takeover import export_session, import_session
from protocols.context import ClientInfo

TAKEOVER_TTL = 60.0  # seconds a relayed takeover waits for its session


class Sessions:
    """Session announcements and takeover."""

    def __init__(self, ctx: Context, replication: RouteReplication, *,
                 raft_table: Callable[[], Any], claims: Callable[[], Any]) -> None:
        self.ctx = ctx
        self.replication = replication
        self._raft_table = raft_table
        self._claims = claims
        self._takeovers: dict[str, tuple[Link, float]] = {}

    def session_created(self, client: ClientInfo) -> None:
        """Hook ``session.created``."""
        cid = client.client_id
        table = self._claims()
        if table is not None:
            table.claim(cid, self.ctx.name, sync=False)
        self.replication.local_session(cid, True)

    def session_ended(self, cid: str) -> None:
        """``Node._terminate``: this node no longer holds a session for ``cid``."""
        table = self._claims()
        if table is not None:
            table.release(cid, self.ctx.name, sync=False)
        self.replication.local_session(cid, False)

    def takeover(self, client: ClientInfo, clean_start: bool) -> bool:
        """``Node.open_session`` for a client id without a session here: ask every node
        holding one to hand it over (or end it, with clean start). True when the
        session will be present here."""
        holders = self.replication.registry.holders(client.client_id) - {self.ctx.name}
        agreed_table = self._raft_table()
        if agreed_table is not None:  # the agreed registry, when Raft is on
            agreed = agreed_table.holder(client.client_id)
            if agreed is not None and agreed != self.ctx.name:
                holders = holders | {agreed}
        asked = 0
        for name in holders:
            peer = self.ctx.peers.get(name)
            if peer is None or peer.ctl_out is None or peer.ctl_out.closed:
                continue
            peer.ctl_out.send(F.control(F.CAST, {
                "op": "takeover", "cid": client.client_id, "clean": clean_start,
            }))
            asked += 1
        return asked > 0 and not clean_start

    def on_takeover(self, peer: Peer, link: Link, msg: dict[str, Any]) -> None:
        """A peer asks for (or ends) a session: handed over on ``link`` when held here,
        else relayed by a core."""
        cid = msg.get("cid")
        if not isinstance(cid, str):
            return
        export = export_session(self.ctx.node, cid, clean_start=bool(msg.get("clean")))
        if export is not None:  # answered on this link: it reaches the new node
            link.send(F.control(F.CAST, {"op": "session", "cid": cid, "export": export}))
            log.info("cluster: session %r handed over to %s", cid, peer.name)
        elif not self.ctx.replicant:
            self._relay_takeover(peer, link, cid, msg)

    def on_session(self, peer: Peer, link: Link, body: bytes) -> None:
        """A CAST on our control link: a session handed over (to us, or relayed)."""
        msg = F.parse_control(body)
        cid, export = msg.get("cid"), msg.get("export")
        if msg.get("op") == "session" and isinstance(cid, str) and isinstance(export, dict):
            via = self._takeovers.pop(cid, (None, 0.0))[0]
            if via is not None:  # a takeover relayed for a replicant or its peer
                if not via.closed:
                    via.send(F.control(F.CAST, msg))
                    log.info("cluster: session %r relayed from %s to %s", cid, peer.name,
                             via.peer)
                return
            n = import_session(self.ctx.node, cid, export)
            log.info("cluster: session %r taken over from %s (%d subscriptions, "
                     "%d messages)", cid, peer.name, len(export.get("subscriptions", ())), n)

    def _relay_takeover(self, peer: Peer, link: Link, cid: str, msg: dict[str, Any]) -> None:
        """A takeover for a session this core does not hold: ask the nodes it stands in
        for (a replicant's request: every other holder; a core's: the replicants
        attached here); the session comes back to ``link``."""
        holders = self.replication.registry.holders(cid) - {peer.name}
        if peer.role != "replicant":
            holders &= set(self.ctx.reps())
        asked = 0
        for name in holders:
            other = self.ctx.peers.get(name)
            if other is not None and other.ctl_out is not None and not other.ctl_out.closed:
                other.ctl_out.send(F.control(F.CAST, msg))
                asked += 1
        if asked and not msg.get("clean"):
            self._takeovers[cid] = (link, time.monotonic())

    def tick(self, now: float) -> None:
        """Every heartbeat: relayed takeovers nobody answered (no session there) go."""
        if self._takeovers:
            self._takeovers = {c: v for c, v in self._takeovers.items()
                               if now - v[1] < TAKEOVER_TTL}
