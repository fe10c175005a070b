"""The cluster of one node: a small :class:`Cluster` composed of its parts.

How the pieces fit (docs/cluster.md has the full picture):

- :mod:`gateway.cluster.state`: the shared state and the interface between the parts;
- :mod:`gateway.cluster.membership`: members, discovery, leave/force-leave, heartbeats;
- :mod:`gateway.cluster.links`: the mutual-TLS control and data links, in and out;
- :mod:`gateway.cluster.attach`: replicants attached to one core, the core's relaying;
- :mod:`gateway.cluster.replication`: each node's routes, streamed to every peer;
- :mod:`gateway.cluster.forwarding`: publishes to matching nodes, durable outboxes;
- :mod:`gateway.cluster.sharing`: shared subscriptions across nodes;
- :mod:`gateway.cluster.sessions`: session announcements and takeover;
- :mod:`gateway.cluster.raftglue`: the Raft group of the cores (session registry);
- :mod:`gateway.cluster.tables`: retained messages, bans, users, rules cluster-wide;
- :mod:`gateway.cluster.views`: status for gatewayctl and the API.

Invariants:
- A forwarded message is delivered to each node at most once per route match; it takes
  at most three hops (replicant -> core -> core -> replicant) and is never sent back
  towards where it came from.
- QoS 1/2 forwards are acknowledged to the publisher only when committed to the
  outbox (same group commit as its session writes), sent only once committed, and
  removed only when the receiver acknowledged after committing its own writes.
- Route updates to a peer arrive in the order they happened on this node.
- ``Cluster`` itself only starts and stops the parts.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import TYPE_CHECKING

from gateway.cluster.attach import AttachPart
from gateway.cluster.forwarding import ForwardingPart
from gateway.cluster.link import Link, split_addr
from gateway.cluster.links import LinksPart
from gateway.cluster.membership import MembershipPart
from gateway.cluster.outbox import ClusterStore
from gateway.cluster.raftglue import RaftGluePart
from gateway.cluster.replication import RouteReplicationPart
from gateway.cluster.sessions import SessionsPart
from gateway.cluster.sharing import SharedPart
from gateway.cluster.state import ClusterSettings, ClusterState, _share_key, log, parse_seed
from gateway.cluster.tls import ClusterTls
from gateway.cluster.views import ViewsPart

if TYPE_CHECKING:
    from gateway.core.node import Node


__all__ = ["Cluster", "ClusterSettings", "ClusterState", "parse_seed"]


class Cluster(
    MembershipPart,
    LinksPart,
    AttachPart,
    RouteReplicationPart,
    ForwardingPart,
    SharedPart,
    SessionsPart,
    RaftGluePart,
    ViewsPart,
):
    """One node's cluster: the parts, started and stopped together."""

    def __init__(self, settings: ClusterSettings, node: Node, tls: ClusterTls,
                 store: ClusterStore) -> None:
        super().__init__(settings, node, tls, store)

    async def start(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        host, port = split_addr(self.settings.bind)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.lsock = lsock = socket.create_server((host, port), family=family, backlog=128)
        lsock.setblocking(False)
        name = lsock.getsockname()
        self.bound = (name[0], name[1])
        self._spawn(self._accept_loop(lsock))
        if not self.settings.advertise:
            h = host if host not in ("0.0.0.0", "::", "") else self.name.partition("@")[2]
            self.settings.advertise = f"{h or '127.0.0.1'}:{self.bound[1]}"
        # the broker tells us of every route key of this node from now on
        broker = self.node.broker
        self.local_keys = set(broker.plain)
        for real, groups in broker.shared.items():
            for group in groups:
                self.local_keys.add(_share_key(group, real))
        broker.on_route = self._local_route
        self.local_sessions = set(self.node.sessions)
        self.node.hooks.add("session.created", self._session_created)
        self.node.attach_cluster(self)
        known = self.store.members()
        for name, addr in self.settings.seeds:
            if not name:
                self._dial_address(addr)
            elif name != self.name:
                known.setdefault(name, addr)
        for peer_name in self.store.peers_with_outbox():
            if peer_name not in known and peer_name != self.name:
                log.warning("cluster: %s has queued messages but is no member", peer_name)
        for name, addr in known.items():
            if name and name != self.name:
                self._member(name, addr, persist=False)
        if self.settings.tables:
            self._open_tables()
        if self.settings.dns is not None:
            self._spawn(self._dns_loop(self.settings.dns))
        if self.replicant:
            self._spawn(self._attach_loop())
        elif self.settings.raft and (not self.peers or self._raft_journal_exists()):
            # the first node, or one with its own log; the others start on their first
            # peer up (its WELCOME has listed the members by then)
            self._start_raft()
        self._tick = loop.call_later(self.settings.heartbeat_interval, self._heartbeat)
        log.info(
            "cluster %s: node %s (%s) on %s, advertised as %s, %d known members",
            self.settings.cluster_name, self.name, self.settings.role,
            f"{self.bound[0]}:{self.bound[1]}", self.settings.advertise, len(self.peers),
        )

    def live_links(self) -> list[Link]:
        """The open links to and from peers (for gateway.security.links: a SIGHUP checks
        their certificates against the CRLs again and closes revoked ones)."""
        links = (link for p in self.peers.values()
                 for link in (p.ctl_out, p.data_out, p.ctl_in, p.data_in))
        return [link for link in links if link is not None and not link.closed]

    def _open_tables(self) -> None:
        from pathlib import Path

        from gateway.store.db import db_path, open_db
        from gateway.store.replicated import (
            AutoSubscribeRows,
            BannedRows,
            RuleRows,
            TableMeta,
            UserRows,
        )

        if self.node.settings.retainer_enable:
            self.tables.add_retained(self.node.retainer)
        if self.settings.data_dir is not None:
            conn = open_db(db_path(self.settings.data_dir))
            meta = TableMeta(conn)
            self.tables.add_db(BannedRows(conn), meta)
            self.tables.add_db(UserRows(conn), meta)
            self.tables.add_db(AutoSubscribeRows(conn), meta)
            self.tables.add_db(RuleRows(Path(self.settings.data_dir) / "rules.db"), meta,
                               deleted={"spec": None})
        self.tables.start()

    async def stop(self) -> None:
        self.stopping = True
        self.tables.stop()
        if self.raft is not None:
            self.raft.stop()
        if self._tick is not None:
            self._tick.cancel()
        if self.lsock is not None:
            self.lsock.close()
        self.node.broker.on_route = None
        self.node.hooks.remove("session.created", self._session_created)
        self.node.attach_cluster(None)
        for peer in self.peers.values():
            self._close_peer(peer, "node stopping")
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
