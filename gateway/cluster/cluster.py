"""The cluster of one node: a small :class:`Cluster` that composes its parts.

How the pieces fit (docs/cluster.md, "The package in parts", has the full picture):

- :mod:`gateway.cluster.state`: the settings and the :class:`Context` every part shares
  (node, member table, loop);
- :mod:`gateway.cluster.membership`: members, discovery, leave/force-leave, heartbeats;
- :mod:`gateway.cluster.links`: the mutual-TLS control and data links, in and out;
- :mod:`gateway.cluster.attach`: replicants attached to one core, the core's relaying;
- :mod:`gateway.cluster.replication`: each node's routes, streamed to every peer;
- :mod:`gateway.cluster.forwarding`: publishes to matching nodes, durable outboxes;
- :mod:`gateway.cluster.sharing`: shared subscriptions across nodes;
- :mod:`gateway.cluster.sessions`: session announcements and takeover;
- :mod:`gateway.cluster.raftglue`: the Raft group of the cores (session registry);
- :mod:`gateway.cluster.tables`: retained messages, bans, users, rules cluster-wide
  (their rows in :mod:`gateway.cluster.rows`);
- :mod:`gateway.cluster.delayed`: delayed messages cluster-wide;
- :mod:`gateway.cluster.views`: status for gatewayctl and the API.

Invariants:
- A forwarded message is delivered to each node at most once per route match; it takes
  at most three hops (replicant -> core -> core -> replicant) and is never sent back
  towards where it came from.
- QoS 1/2 forwards are acknowledged to the publisher only when committed to the
  outbox (same group commit as its session writes), sent only once committed, and
  removed only when the receiver acknowledged after committing its own writes.
- Route updates to a peer arrive in the order they happened on this node.
- ``Cluster`` holds no state of its own: it builds the parts, gives each what it needs
  (callables and the parts' small Protocols), starts and stops them, and offers the
  public surface (``gateway.app``, the admin API, ``gateway.core.node``) as delegations.
  :class:`_Events` sequences what touches several parts (links up or lost, frames by
  kind).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.cluster import frames as F
from gateway.cluster.attach import Attach
from gateway.cluster.delayed import DelayedTable
from gateway.cluster.forwarding import Forwarding, Sender
from gateway.cluster.link import Link, split_addr
from gateway.cluster.links import Handler, Links, close_links
from gateway.cluster.membership import Membership
from gateway.cluster.outbox import ClusterStore
from gateway.cluster.peer import Peer
from gateway.cluster.raftglue import RaftGlue
from gateway.cluster.replication import RouteReplication
from gateway.cluster.routes import RouteTable
from gateway.cluster.sessions import Sessions
from gateway.cluster.sharing import SharedSubscriptions
from gateway.cluster.state import ClusterSettings, Context, _share_key, log, parse_seed
from gateway.cluster.tables import TableSync, open_tables
from gateway.cluster.tls import ClusterTls
from gateway.cluster.views import cluster_view
from protocols.context import ClientInfo, Message

if TYPE_CHECKING:
    from gateway.core.node import Node
    from gateway.ext.delayed import DelayedPublisher


__all__ = ["Cluster", "ClusterSettings", "Context", "parse_seed"]

LEAVE_DETACH_WAIT = 2.0  # seconds a leaving replicant waits for its core's links to close


class Cluster:
    """One node's cluster: the parts, wired, started and stopped together."""

    def __init__(self, settings: ClusterSettings, node: Node, tls: ClusterTls,
                 store: ClusterStore) -> None:
        self.ctx = ctx = Context(settings, node, tls, store)
        self.tables = TableSync(ctx.name, ctx.send_ctl, ctx.linked, poll=settings.table_poll)
        self.delayed: DelayedTable | None = None  # with tables: open_tables
        self.sender = sender = Sender(ctx)
        # late-bound callables: a part built later (the cycles are Raft <-> membership
        # for CALLs and links <-> attach/membership for dialling)
        self.replication = rep = RouteReplication(
            ctx, bootstrapped=lambda name: self.attach.bootstrapped(name),
            claims=lambda: self.raftglue.sessions)
        self.raftglue = raft = RaftGlue(
            ctx, call=lambda name, req, timeout: self.membership.call(name, req, timeout),
            sessions_of=lambda: (rep.local_sessions, rep.registry.by_node),
            candidate=lambda: self.attach.candidate)
        self.attach = attach = Attach(
            ctx, sender, rep.parked,
            dial_link=lambda addr, channel, expect: self.links.dial_link(addr, channel, expect),
            links_up=lambda peer, ctl, data: self.links.links_up(peer, ctl, data),
            detached=raft.detached)
        self.sharing = sharing = SharedSubscriptions(ctx, rep.routes, sender)
        self.forwarding = fwd = Forwarding(
            ctx, sender, rep.routes, rep.parked, sharing, core=lambda: attach.core,
            relay_to=attach.relay_to, injecting=self.tables.injecting)
        self.sessions = sessions = Sessions(ctx, rep, raft_table=raft.table,
                                            claims=lambda: raft.sessions)
        self.membership = mem = Membership(
            ctx, sender, raft,
            dial_link=lambda *a, **k: self.links.dial_link(*a, **k),
            start_dial=lambda peer: ctx.spawn(self.links.dial_loop(peer)),
            close_peer=close_links, drop_routes=rep.drop_node, wake_attach=attach.wake)
        mem.on_state.append(raft.peer_state)
        mem.on_state.append(lambda peer, new: sharing.reroute(peer) if new == "down" else None)
        mem.on_forgotten.append(sharing.reroute)
        mem.ticks.append(raft.tick)
        mem.ticks.append(sessions.tick)
        events = _Events(self)
        inbound: dict[int, Handler] = {
            F.RAFT: raft.on_frame,
            F.PING: mem.on_ping,
            F.ROUTES: rep.on_routes,
            F.TABLE: lambda peer, link, body: self.tables.received(
                peer.name, F.parse_control(body)),
            F.CALL: mem.on_call,
            F.MEMBERS: mem.on_members,
            F.LEAVE: mem.on_leave,
            F.CAST: events.cast,
        }
        outbound: dict[int, Handler] = {
            F.PONG: mem.on_pong,
            F.REPLY: mem.on_reply,
            F.ACK: fwd.on_ack,
            F.ROUTES_ACK: rep.on_ack,
            F.MEMBERS: mem.on_members,
            F.CAST: sessions.on_session,
        }
        self.links = Links(ctx, events, data=fwd.on_data, inbound=inbound, outbound=outbound)

    # -- life cycle ----------------------------------------------------------------------

    async def start(self) -> None:
        import asyncio

        ctx = self.ctx
        settings = ctx.settings
        ctx.loop = asyncio.get_running_loop()
        host, port = split_addr(settings.bind)
        bound = self.links.listen(host, port)
        if not settings.advertise:
            h = host if host not in ("0.0.0.0", "::", "") else ctx.name.partition("@")[2]
            settings.advertise = f"{h or '127.0.0.1'}:{bound[1]}"
        # the broker tells us of every route key of this node from now on
        node = ctx.node
        broker = node.broker
        keys = set(broker.plain)
        for real, groups in broker.shared.items():
            for group in groups:
                keys.add(_share_key(group, real))
        self.replication.start(keys, set(node.sessions))
        broker.on_route = self.replication.local_route
        node.hooks.add("session.created", self.sessions.session_created)
        node.attach_cluster(self)
        known = ctx.store.members()
        for name, addr in settings.seeds:
            if not name:
                self.membership.dial_address(addr)
            elif name != ctx.name:
                known.setdefault(name, addr)
        for peer_name in ctx.store.peers_with_outbox():
            if peer_name not in known and peer_name != ctx.name:
                log.warning("cluster: %s has queued messages but is no member", peer_name)
        for name, addr in known.items():
            if name and name != ctx.name:
                self.membership.member(name, addr, persist=False)
        if settings.tables:
            self.delayed = open_tables(ctx, self.tables)
        if settings.dns is not None:
            ctx.spawn(self.membership.dns_loop(settings.dns, bound[0], bound[1]))
        if ctx.replicant:
            ctx.spawn(self.attach.loop())
        elif settings.raft and (not ctx.peers or self.raftglue.journal_exists()):
            # the first node, or one with its own log; the others start on their first
            # peer up (its WELCOME has listed the members by then)
            self.raftglue.start()
        self.membership.start()
        log.info(
            "cluster %s: node %s (%s) on %s, advertised as %s, %d known members",
            settings.cluster_name, ctx.name, settings.role, f"{bound[0]}:{bound[1]}",
            settings.advertise, len(ctx.peers),
        )

    def attach_delayed(self, publisher: DelayedPublisher) -> None:
        """``gateway.app``, once the extensions started: this node's delayed messages
        become rows of the replicated ``delayed`` table (:mod:`gateway.cluster.delayed`)."""
        if self.delayed is not None:
            self.delayed.attach(publisher)

    async def stop(self) -> None:
        ctx = self.ctx
        ctx.stopping = True
        if self.delayed is not None:
            self.delayed.stop()
        self.tables.stop()
        self.raftglue.stop()
        self.membership.stop()
        self.links.close()
        ctx.node.broker.on_route = None
        ctx.node.hooks.remove("session.created", self.sessions.session_created)
        ctx.node.attach_cluster(None)
        for peer in ctx.peers.values():
            close_links(peer, "node stopping")
        await ctx.cancel_tasks()

    # -- the public surface (gateway.app, gateway.admin, gateway.core.node) ----------------

    @property
    def name(self) -> str:
        return self.ctx.name

    @property
    def settings(self) -> ClusterSettings:
        return self.ctx.settings

    @property
    def tls(self) -> ClusterTls:
        return self.ctx.tls

    @tls.setter
    def tls(self, tls: ClusterTls) -> None:  # SIGHUP: new links use the new files
        self.ctx.tls = tls

    @property
    def peers(self) -> dict[str, Peer]:
        return self.ctx.peers

    @property
    def routes(self) -> RouteTable:
        """The peers' routes (``gateway.ext.exclusive`` reads the markers in it)."""
        return self.replication.routes

    @property
    def replicant(self) -> bool:
        return self.ctx.replicant

    @property
    def bound(self) -> tuple[str, int] | None:
        return self.links.bound

    @property
    def raft(self) -> Any:
        return self.raftglue.raft

    @property
    def on_peer_down(self) -> list[Any]:
        return self.membership.on_peer_down

    def view(self, connections: int) -> dict[str, Any]:
        return cluster_view(self.ctx, self.replication, self.attach, self.raftglue,
                            self.tables, connections)

    def join(self, target: str) -> str:
        return self.membership.join(target)

    async def leave(self) -> int:
        """Leave the cluster; a replicant answers once it has let go of its core too
        (its links to it are closed), so its own status no longer names one."""
        told = await self.membership.leave()
        if not await self.attach.wait_detached(LEAVE_DETACH_WAIT):
            log.warning("cluster: left, but the links to core %s are still closing",
                        self.attach.core)
        return told

    def forget(self, name: str, why: str, *, claims: bool = True) -> bool:
        return self.membership.forget(name, why, claims=claims)

    async def call(self, name: str, request: dict[str, Any], timeout: float
                   ) -> dict[str, Any]:
        return await self.membership.call(name, request, timeout)

    def members_list(self) -> list[list[str]]:
        return self.membership.members_list()

    def forward(self, message: Message) -> int:
        return self.forwarding.forward(message)

    def reshare(self, message: Message, group: str, real: str,
                exclude: tuple[str, ...] | set[str] = ()) -> bool:
        return self.sharing.reshare(message, group, real, exclude)

    def takeover(self, client: ClientInfo, clean_start: bool) -> bool:
        return self.sessions.takeover(client, clean_start)

    def session_ended(self, cid: str) -> None:
        self.sessions.session_ended(cid)

    def live_links(self) -> list[Link]:
        """The open links to and from peers (for gateway.security.links: a SIGHUP checks
        their certificates against the CRLs again and closes revoked ones)."""
        return self.links.live()


class _Events:
    """What the links part asks of the rest (:class:`gateway.cluster.links.LinkEvents`):
    the sequences that touch several parts, in the order the invariants need."""

    def __init__(self, cluster: Cluster) -> None:
        self.c = cluster

    def member(self, name: str, addr: str, *, role: str) -> Peer:
        return self.c.membership.member(name, addr, role=role)

    def members_list(self) -> list[list[str]]:
        return self.c.membership.members_list()

    def announce_members(self) -> None:
        self.c.membership.announce_members()

    def state_changed(self, peer: Peer) -> None:
        self.c.membership.state_changed(peer)

    def candidate(self) -> str | None:
        return self.c.attach.candidate

    def applied_mark(self, name: str, epoch: str) -> int:
        return self.c.forwarding.applied_mark(name, epoch)

    def up(self, peer: Peer, ctl: Link, data: Link) -> None:
        """Our links to ``peer`` are up: our routes, sessions and tables from scratch
        (before any delta), the Raft table to a replicant, the members, then every
        unacknowledged forward it has not applied."""
        c = self.c
        c.replication.snapshot(peer)
        c.tables.link_up(peer.name)
        if peer.role == "replicant":
            c.raftglue.snapshot(peer)
        c.membership.learn(ctl.info.get("members", []), peer.name)
        if not c.ctx.replicant and peer.role != "replicant":  # incl. who is attached here
            ctl.send(F.control(F.MEMBERS, {"members": c.membership.members_list()}))
        c.forwarding.link_up(peer, data)
        c.membership.state_changed(peer)

    def ctl_out_lost(self, peer: Peer) -> None:
        self.c.tables.link_down(peer.name)

    def ctl_in_lost(self, peer: Peer, link: Link, reps: list[str]) -> None:
        """``peer``'s control link to us went: its routes go (its plain ones parked)."""
        c = self.c
        c.tables.link_down(peer.name)
        removed = c.replication.drop_node(peer.name, reps, park=True)
        if peer.role == "replicant" and peer.ctl_out is not None:
            peer.ctl_out.close("the replicant detached")  # it may attach elsewhere
        if (c.ctx.replicant and peer.name == c.attach.candidate
                and peer.ctl_out is not None):
            # its core's link back went: no routes come any more; attach afresh
            peer.ctl_out.close("the core's link to us closed")
        if not c.ctx.stopping:
            log.info("cluster: %r closed (%s): %d routes of %s removed",
                     link, link.reason, removed, peer.name)

    def cast(self, peer: Peer, link: Link, body: bytes) -> None:
        """A CAST on the peer's control link to us: a takeover, or a Raft entry."""
        msg = F.parse_control(body)
        op = msg.get("op")
        if op == "takeover":
            self.c.sessions.on_takeover(peer, link, msg)
        elif op == "rlog":
            self.c.raftglue.on_rlog(peer, msg)
