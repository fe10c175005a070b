"""The cluster of one node: membership, links, route replication and forwarding.

How the pieces fit (docs/cluster.md has the full picture):

- **Membership**: static ``seeds``, nodes joined by hand (``gatewayctl cluster join``)
  and nodes learnt from peers (every WELCOME and MEMBERS frame lists the members the
  sender knows) are dialled and kept in ``cluster_members``; ``leave`` tells every peer
  and forgets them all.
- **Links** (:mod:`gateway.cluster.link`): each core dials a control and a data link to
  every other core, over mutual TLS on the one cluster port. A replicant dials one core
  (its attach loop; the next core when those links go), which dials it back while it is
  attached and stands in for it (:mod:`gateway.cluster.relay`). Heartbeats (PING/PONG) run on
  the control links; a link silent for ``heartbeat_timeout`` is closed and redialled with
  backoff.
- **Routes** (:mod:`gateway.cluster.routes`): the broker reports every route key that
  appears or disappears on this node; the cluster sends them, in order, on its control
  link to each peer (a full snapshot whenever that link comes up). A peer's routes live
  exactly as long as its control link to us: when it goes, they are removed.
- **Forwarding**: ``Node.publish`` routes locally, then calls :meth:`Cluster.forward`,
  which looks the topic up in the route table and queues the message for each matching
  node: QoS 0 in memory, QoS 1/2 in the peer's durable outbox
  (:mod:`gateway.cluster.outbox`). Once per loop turn each peer's queue goes out as DATA
  batches. The receiving node routes the message locally (``Node.inject``); only a core
  relays: what a replicant sent it onwards to the other nodes with routes, what a core
  sent it to its attached replicants.

Invariants:
- A forwarded message is delivered to each node at most once per route match; it takes
  at most three hops (replicant -> core -> core -> replicant) and is never sent back
  towards where it came from.
- QoS 1/2 forwards are acknowledged to the publisher only when committed to the
  outbox (same group commit as its session writes), sent only once committed, and
  removed only when the receiver acknowledged after committing its own writes.
- Route updates to a peer arrive in the order they happened on this node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.cluster import frames as F
from gateway.cluster.discovery import DnsSettings, discover
from gateway.cluster.link import HandshakeError, Link, accept_tls, dial, refuse, split_addr
from gateway.cluster.outbox import ClusterStore
from gateway.cluster.peer import Peer
from gateway.cluster.relay import Announcer, ReplicaLog
from gateway.cluster.routes import RouteTable
from gateway.cluster.tables import TableSync
from gateway.cluster.takeover import SessionRegistry, export_session, import_session
from gateway.cluster.tls import ClusterTls, peer_common_name
from gateway.core.shared import SharedGroup
from protocols.context import ClientInfo, Message

if TYPE_CHECKING:
    from gateway.core.node import Node

log = logging.getLogger("gateway.cluster")

HIGH_WATER = 8 << 20  # bytes buffered on a data link before forwarding waits for it
_SHARED_PREFIXES = ("$share/", "$queue/")
MAX_QOS0_PENDING = 100_000  # QoS 0 records waiting per peer before the oldest are dropped
NOT_MY_CORE = "a replicant attached to another core"


@dataclass
class ClusterSettings:
    node_name: str
    cluster_name: str = "gateway"
    bind: str = "0.0.0.0:5370"
    advertise: str = ""
    role: str = "core"
    seeds: list[tuple[str, str]] = field(default_factory=list)  # (name, addr)
    heartbeat_interval: float = 1.0
    heartbeat_timeout: float = 5.0
    connect_timeout: float = 5.0
    reconnect_max: float = 5.0
    forward_batch: int = 1000
    outbox_max: int = 1_000_000
    autoclean: float = 300.0
    version: str = ""
    dns: DnsSettings | None = None  # discovery = "dns"
    raft: bool = False  # core nodes agree on the session registry through Raft
    raft_compact_entries: int = 5000
    data_dir: str | None = None  # where the Raft journal and dump live
    tables: bool = True  # replicate retained messages, bans, users, rules (tables.py)
    table_poll: float = 0.5  # seconds between looks at the database tables


def parse_seed(seed: str, default_port: int = 5370) -> tuple[str, str]:
    """``"b@10.0.0.2:5371"`` -> ``("b@10.0.0.2", "10.0.0.2:5371")``; without a port the
    default one; without ``@`` the text is an address and the name is learnt on connect
    (``("", addr)``)."""
    seed = seed.strip()
    if "@" not in seed:
        host, port = split_addr(seed, default_port)
        return "", f"{host}:{port}"
    name, _, rest = seed.partition("@")
    host, port = split_addr(rest, default_port)
    return f"{name}@{host}", f"{host}:{port}"


class Cluster:
    def __init__(
        self,
        settings: ClusterSettings,
        node: Node,
        tls: ClusterTls,
        store: ClusterStore,
    ) -> None:
        self.settings = settings
        self.name = settings.node_name
        self.node = node
        self.tls = tls
        self.store = store
        self.routes = RouteTable()
        # plain routes of peers whose control link went without a LEAVE (dead or cut
        # off): QoS 1/2 messages still queue durably for them until they return (their
        # snapshot replaces this) or are removed (autoclean, force-leave)
        self.parked = RouteTable()
        self.peers: dict[str, Peer] = {}
        self.local_keys: set[str] = set()
        self.registry = SessionRegistry()  # client id -> other nodes holding a session
        self.local_sessions: set[str] = set()
        # what to announce to whom (a core stands in for its replicants: relay.py)
        self.route_ann = Announcer(lambda: self.local_keys, lambda: self.routes.by_node,
                                   lambda k: self.routes.nodes_of.get(k, ()))
        self.session_ann = Announcer(lambda: self.local_sessions,
                                     lambda: self.registry.by_node, self.registry.holders)
        # cid -> (link a relayed takeover came on, when); forgotten after a minute
        self._takeovers: dict[str, tuple[Link, float]] = {}
        self._calls: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._call_id = 0
        self._raft_removed: set[str] = set()  # voters removed here; not re-added while up
        self._raft_forget: set[str] = set()  # voters forgotten here, for the leader to remove
        self._raft_asking: set[str] = set()  # ... a CALL for them under way
        self._rlog_seq = 0  # entries of the Raft session table applied here (cores)
        # a replicant: the one core it is attached to
        self.core: str | None = None
        self._candidate: str | None = None  # the core being dialled or attached to
        self.core_since: float | None = None
        self.core_switches = 0
        self.routes_bootstrapped = False  # the core's route snapshot arrived
        self._attach_wake = asyncio.Event()
        self._leaving = False
        self._route_rev = 0
        self._routes_scheduled = False
        self.inbox: dict[str, tuple[str, int]] = store.inbox()
        self.lsock: socket.socket | None = None
        self.bound: tuple[str, int] | None = None
        self.stopping = False
        self._tick: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.started_at = time.time()
        self.on_peer_down: list[Callable[[str], None]] = []
        # (group, filter) -> (the nodes with members, their order for the strategy)
        self.raft: Any = None  # gateway.cluster.raft.RaftGroup with cluster.raft on a core
        self.raft_sessions: Any = None  # its SessionTable (cores write it)
        # a replicant's copy of its core's table (streamed by the core, relay.py)
        self.raft_view: ReplicaLog | None = ReplicaLog() if (
            settings.raft and settings.role == "replicant") else None
        self._share_order: dict[tuple[str, str], tuple[frozenset[str], SharedGroup[str]]] = {}
        self.tables = TableSync(self.name, self._send_ctl, self._linked,
                                poll=settings.table_poll)

    # -- life cycle --------------------------------------------------------------------

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

    def _open_tables(self) -> None:
        from pathlib import Path

        from gateway.store.db import db_path, open_db
        from gateway.store.replicated import BannedRows, RuleRows, TableMeta, UserRows

        if self.node.settings.retainer_enable:
            self.tables.add_retained(self.node.retainer)
        if self.settings.data_dir is not None:
            conn = open_db(db_path(self.settings.data_dir))
            meta = TableMeta(conn)
            self.tables.add_db(BannedRows(conn), meta)
            self.tables.add_db(UserRows(conn), meta)
            self.tables.add_db(RuleRows(Path(self.settings.data_dir) / "rules.db"), meta,
                               deleted={"spec": None})
        self.tables.start()

    def _send_ctl(self, name: str, data: bytes) -> bool:
        peer = self.peers.get(name)
        if peer is None or peer.ctl_out is None:
            return False
        peer.ctl_out.send(data)
        return True

    def _linked(self) -> list[str]:
        return [p.name for p in self.peers.values() if p.ctl_out is not None]

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

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- membership --------------------------------------------------------------------

    @property
    def replicant(self) -> bool:
        return self.settings.role == "replicant"

    def _member(self, name: str, addr: str, *, persist: bool = True, role: str = "core"
                ) -> Peer:
        """A member (new or known). Replicants are not kept in ``cluster_members``: they
        dial their core, never the other way round."""
        persist = persist and role != "replicant"
        peer = self.peers.get(name)
        if peer is not None:
            if addr and addr != peer.addr:
                peer.addr = addr
                if persist:
                    self.store.member_saved(name, addr)
            return peer
        peer = Peer(name, addr, self.store.outbox(name, self.settings.outbox_max))
        peer.role = role
        self._raft_forget.discard(name)  # a member again
        self.peers[name] = peer
        if persist:
            self.store.member_saved(name, addr)
        log.info("cluster: member %s (%s) at %s", name, role, addr)
        if self.replicant:  # a replicant dials one core: its attach loop picks it
            self._attach_wake.set()
        elif not self.stopping:
            peer.task = self._spawn(self._dial_loop(peer))
        return peer

    def _dial_address(self, addr: str) -> None:
        """A seed or join target given by address only: learn its name, then add it."""
        self._spawn(self._probe(addr))

    async def _probe(self, addr: str) -> None:
        delay = 0.2
        while not self.stopping:
            try:
                link = await self._dial_link(addr, "control", None, probe=True)
            except (TimeoutError, OSError, ssl.SSLError, HandshakeError) as exc:
                log.debug("cluster: %s not reachable yet: %s", addr, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.reconnect_max)
                continue
            link.close("probe done")
            self._learn(link.info.get("members", []))
            role = str(link.info.get("role", "core"))
            if self.replicant and role == "replicant":
                log.warning("cluster: %s at %s is a replicant; a replicant attaches to a "
                            "core", link.peer, addr)
                return
            self._member(link.peer, addr, role=role)
            return

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

    async def _dns_loop(self, dns: DnsSettings) -> None:
        """Dial every address DNS gives that is not this node or a known member."""
        assert self.bound is not None
        tried: set[str] = set()
        while not self.stopping:
            addrs = await discover(dns, self.bound[1])
            own = {self.settings.advertise, f"{self.bound[0]}:{self.bound[1]}"}
            known = {p.addr for p in self.peers.values()}
            new = [a for a in addrs if a not in own and a not in known and a not in tried]
            if new:
                log.info("cluster: DNS %s gives %d new addresses: %s", dns.name, len(new),
                         ", ".join(new))
            for addr in new:
                tried.add(addr)
                self._dial_address(addr)
            await asyncio.sleep(dns.refresh)

    def join(self, target: str) -> str:
        """``gatewayctl cluster join``: ``name@host:port`` or ``host:port``."""
        name, addr = parse_seed(target)
        if name == self.name:
            raise ValueError("cannot join this node itself")
        if name:
            peer = self._member(name, addr)
            peer.wake.set()
            return name
        self._dial_address(addr)
        return addr

    async def leave(self) -> int:
        """Tell every peer this node leaves, forget them all; how many were told. With
        Raft, this node first has the leader remove it from the group (a leader first
        hands its leadership over), so the others' majority no longer counts it."""
        await self._raft_leave()
        self._leaving = True
        told = 0
        for peer in list(self.peers.values()):
            link = peer.ctl_out
            if link is not None and not link.closed:
                link.send(F.control(F.LEAVE, {"name": self.name}))
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(link.drain(), 2)
                told += 1
            self.forget(peer.name, "this node left the cluster")
        self._leaving = False
        log.info("cluster: left the cluster (%d peers told)", told)
        return told

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

    async def call(self, name: str, request: dict[str, Any], timeout: float
                   ) -> dict[str, Any]:
        """A CALL to a peer on our control link; its REPLY (``{"ok": False, "error"}``
        when the link is down or the time is up)."""
        peer = self.peers.get(name)
        if peer is None or peer.ctl_out is None or peer.ctl_out.closed:
            return {"ok": False, "error": f"no link to {name}"}
        assert self._loop is not None
        self._call_id += 1
        cid = self._call_id
        fut: asyncio.Future[dict[str, Any]] = self._loop.create_future()
        self._calls[cid] = fut
        peer.ctl_out.send(F.control(F.CALL, {**request, "id": cid}))
        try:
            return await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            return {"ok": False, "error": f"no reply from {name} in {timeout:g}s"}
        finally:
            self._calls.pop(cid, None)

    def _on_call(self, link: Link, msg: dict[str, Any]) -> None:
        """A CALL from a peer (on its control link to us); the REPLY goes back on it."""
        cid = msg.get("id")

        def reply(ok: bool, error: str = "") -> None:
            link.send(F.control(F.REPLY, {"id": cid, "ok": ok, "error": error}))

        node = msg.get("node")
        if msg.get("op") == "raft_remove" and isinstance(node, str):
            raft = self.raft
            if raft is None or not raft.is_leader():
                reply(False, "not the Raft leader")
            elif node == self.name:
                reply(False, "the leader cannot remove itself (it hands over when it leaves)")
            elif node not in raft.members():
                reply(True)
            else:
                log.info("cluster: removing %s from the Raft group (asked by %s)", node,
                         link.peer)
                self._raft_removed.add(node)
                raft.remove(node, lambda ok: reply(ok, "" if ok else "not committed"))
        else:
            reply(False, f"unknown call {msg.get('op')!r}")

    def forget(self, name: str, why: str, *, claims: bool = True) -> bool:
        """Remove a member (it left, ``force-leave``, or autoclean): links, routes,
        outbox (its unacknowledged messages are dropped, and counted in the log). With
        Raft, a voter is removed from the group: here when this node leads, else by a
        CALL to the leader."""
        reps = self._reps()  # before it goes: a replicant's keys are announced by us
        peer = self.peers.pop(name, None)
        if peer is None:
            return False
        peer.state = "left"
        self._close_peer(peer, why)
        if peer.task is not None:
            peer.task.cancel()
        removed = self._drop(self.route_ann, self.routes, name, reps)
        self._drop(self.session_ann, self.registry, name, reps)
        self._schedule_routes()
        self.parked.drop_node(name)
        if self.raft_sessions is not None and claims:
            self.raft_sessions.forget(name, sync=False)
        raft = self.raft
        if raft is not None and name in raft.members():
            if raft.is_leader():
                raft.remove(name)  # a voter that left: the majority shrinks with it
            elif not self._leaving:  # the leader removes it (next heartbeat, a CALL)
                self._raft_forget.add(name)
        self._reroute_shared(peer)
        pending = len(peer.outbox)
        self.store.outbox_deleted(name)
        self.store.member_deleted(name)
        log.warning(
            "cluster: %s removed (%s): %d routes removed%s", name, why, removed,
            f", {pending} unacknowledged forwarded messages dropped" if pending else "",
        )
        return True

    async def _forward_removal(self, leader: str, name: str) -> None:
        try:
            reply = await self.call(leader, {"op": "raft_remove", "node": name}, 5.0)
        finally:
            self._raft_asking.discard(name)
        if reply.get("ok"):
            log.info("cluster: %s removed from the Raft group by the leader %s", name, leader)
        else:  # asked again at a later heartbeat while it is in the group
            log.warning("cluster: the Raft leader %s did not remove %s: %s", leader, name,
                        reply.get("error"))

    def _learn(self, members: Any, sender: str | None = None) -> None:
        """Members a peer listed: ``[name, addr]``, ``[name, addr, role]``, or for a
        replicant attached to the sender ``[name, addr, "replicant", sender]``."""
        if not isinstance(members, list):
            return
        for item in members:
            if not (isinstance(item, list) and 2 <= len(item) <= 4
                    and all(isinstance(x, str) for x in item)
                    and item[0] and item[0] != self.name):
                continue
            if len(item) >= 3 and item[2] == "replicant":
                # a replicant is linked to its core only; the core learns it when it
                # dials in. One attached to the sender is no longer ours.
                if len(item) == 4 and sender is not None and item[3] == sender:
                    self._replicant_moved(item[0], sender)
                continue
            if item[0] not in self.peers:
                self._member(item[0], item[1])
                if not self.replicant:
                    self._announce_members()

    def members_list(self) -> list[list[str]]:
        """``[name, addr, role]`` of this node and every member it knows (and this node's
        name after its attached replicants)."""
        out = [[self.name, self.settings.advertise, self.settings.role]]
        for p in self.peers.values():
            if p.role == "replicant" and p.ctl_in is not None and not self.replicant:
                out.append([p.name, p.addr, p.role, self.name])
            else:
                out.append([p.name, p.addr, p.role])
        return out

    def _replicant_moved(self, name: str, core: str) -> None:
        """A replicant that was attached here is attached to ``core`` now: what this
        node still had queued for it goes to that core, marked for it (at least once),
        and it is forgotten here."""
        peer = self.peers.get(name)
        via = self.peers.get(core)
        if (self.replicant or peer is None or via is None or peer.role != "replicant"
                or peer.ctl_in is not None):
            return
        records = list(peer.outbox.records)
        if records:
            peer.outbox.take({seq for seq, _ in records})
            for _, body in records:
                fwd = F.decode_body(body)
                via.outbox.append(F.encode_message(fwd.message, fwd.share, target=name),
                                  lambda p=via: self._schedule_flush(p))  # type: ignore[misc]
            log.warning("cluster: %d unacknowledged forwards for %s go through its core %s",
                        len(records), name, core)
        self.forget(name, f"attached to {core}", claims=False)

    def _announce_members(self) -> None:
        frame = F.control(F.MEMBERS, {"members": self.members_list()})
        for peer in self.peers.values():
            if peer.ctl_out is not None:
                peer.ctl_out.send(frame)

    # -- outgoing links ----------------------------------------------------------------

    def _hello(self, channel: str, probe: bool = False) -> dict[str, Any]:
        return {
            "probe": probe,
            "name": self.name,
            "cluster": self.settings.cluster_name,
            "channel": channel,
            "addr": self.settings.advertise,
            "epoch": self.store.epoch,
            "role": self.settings.role,
            "version": self.settings.version,
        }

    async def _dial_link(self, addr: str, channel: str, expect: str | None, *,
                         probe: bool = False) -> Link:
        return await dial(
            addr, self.tls.client, self._hello(channel, probe), expect=expect,
            verify_name=self.tls.verify_node_name, timeout=self.settings.connect_timeout,
        )

    async def _dial_loop(self, peer: Peer) -> None:
        delay = 0.1
        while not self.stopping and self.peers.get(peer.name) is peer:
            if peer.role == "replicant" and peer.ctl_in is None:
                # a replicant dials its core; we dial it back only while it is attached
                peer.wake.clear()
                await peer.wake.wait()
                continue
            ctl: Link | None = None
            try:
                ctl = await self._dial_link(peer.addr, "control", peer.name)
                data = await self._dial_link(peer.addr, "data", peer.name)
            except (TimeoutError, OSError, ssl.SSLError, HandshakeError) as exc:
                if ctl is not None:
                    ctl.close("data link failed")
                not_ours = isinstance(exc, HandshakeError) and NOT_MY_CORE in str(exc)
                if not_ours and peer.role != "replicant":
                    peer.role = "replicant"  # it is attached to another core: we wait
                    self.store.member_deleted(peer.name)  # until it dials us (loop top)
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                peer.failures += 1
                if (why != peer.last_error or peer.failures == 1) and not not_ours:
                    level = logging.WARNING if isinstance(exc, HandshakeError) else logging.INFO
                    log.log(level, "cluster: cannot reach %s at %s: %s", peer.name, peer.addr, why)
                peer.last_error = why
                peer.wake.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(peer.wake.wait(), delay)
                delay = min(delay * 2, self.settings.reconnect_max)
                continue
            if self.stopping or self.peers.get(peer.name) is not peer:
                ctl.close("stopping")
                data.close("stopping")
                return
            delay = 0.1
            peer.failures = 0
            peer.last_error = ""
            self._links_up(peer, ctl, data)
            await ctl.done.wait()  # closing either link closes the other
            await data.done.wait()

    async def _attach_loop(self) -> None:
        """A replicant's links: to exactly one core at a time. The cores are tried in
        name order, the one just lost last; when the links to the core go, the next
        one is tried at once (docs/cluster.md, "Replicants")."""
        delay = 0.1
        last: str | None = None
        while not self.stopping:
            names = sorted(n for n, p in self.peers.items() if p.role != "replicant")
            if last in names:
                i = names.index(last)
                names = names[i + 1:] + names[:i + 1]
            attached = False
            for name in names:
                peer = self.peers.get(name)
                if peer is None or self.stopping:
                    continue
                self._candidate = name  # its links to us (it dials back) are accepted
                ctl: Link | None = None
                try:
                    ctl = await self._dial_link(peer.addr, "control", name)
                    data = await self._dial_link(peer.addr, "data", name)
                except (TimeoutError, OSError, ssl.SSLError, HandshakeError) as exc:
                    if ctl is not None:
                        ctl.close("data link failed")
                    self._candidate = None
                    why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                    if why != peer.last_error:
                        log.info("cluster: cannot attach to %s at %s: %s", name, peer.addr, why)
                    peer.last_error = why
                    continue
                if self.stopping or self.peers.get(name) is not peer:
                    ctl.close("stopping")
                    data.close("stopping")
                    break
                attached = True
                self._attached(peer, last)
                self._links_up(peer, ctl, data)
                # the core's snapshot comes on its link back to us: without it (it
                # cannot reach us) this core is no use; try the next one
                boot = 2 * max(self.settings.connect_timeout, self.settings.heartbeat_timeout)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(ctl.done.wait(), boot)
                if not ctl.closed and not self.routes_bootstrapped:
                    log.warning("cluster: no route snapshot from %s in %gs (can it reach "
                                "%s?)", name, boot, self.settings.advertise)
                    ctl.close("no route snapshot from the core")
                await ctl.done.wait()
                await data.done.wait()
                self._detached(peer)
                last = name
                break
            if attached:
                delay = 0.1
                continue
            self._attach_wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._attach_wake.wait(), delay)
            delay = min(delay * 2, self.settings.reconnect_max)

    def _attached(self, peer: Peer, previous: str | None) -> None:
        self.core = peer.name
        self.core_since = time.time()
        peer.failures = 0
        peer.last_error = ""
        if previous is not None:
            self.core_switches += 1
        log.info("cluster: replicant attached to core %s%s", peer.name,
                 f" (was {previous})" if previous and previous != peer.name else "")
        # what waited for another core (QoS 1/2 forwards and shared-group messages not
        # acknowledged) goes through this one now: at least once
        for other in self.peers.values():
            if other is peer:
                continue
            self.parked.drop_node(other.name)
            records = list(other.outbox.records)
            if records:
                other.outbox.take({seq for seq, _ in records})
                other.shared_pending.clear()
                for _, body in records:
                    peer.outbox.append(body, lambda p=peer: self._schedule_flush(p))  # type: ignore[misc]
                log.warning("cluster: %d unacknowledged forwards for %s go through %s",
                            len(records), other.name, peer.name)

    def _detached(self, peer: Peer) -> None:
        log.warning("cluster: replicant lost its core %s", peer.name)
        self.core = self._candidate = None
        self.core_since = None
        self.routes_bootstrapped = False
        if self.raft_view is not None:
            self.raft_view.reset()
        for link in (peer.ctl_in, peer.data_in):  # its dial-back
            if link is not None:
                link.close("not our core any more")

    def _reps(self) -> list[str]:
        """The replicants attached to this core (their control link to us is open)."""
        if self.replicant:
            return []
        return [p.name for p in self.peers.values()
                if p.role == "replicant" and p.ctl_in is not None]

    def _links_up(self, peer: Peer, ctl: Link, data: Link) -> None:
        peer.ctl_out, peer.data_out = ctl, data
        peer.last_pong = time.monotonic()
        peer.role = str(ctl.info.get("role", "core"))
        peer.version = str(ctl.info.get("version", ""))
        ctl.start(self._on_out_frame, self._out_closed)
        data.start(self._on_out_frame, self._out_closed)
        # our routes, from scratch: the peer replaces whatever it had from us (a core
        # stands in for its replicants, and for the cluster towards them: relay.py)
        self._route_rev += 1
        if peer.role == "replicant" and not self.replicant:
            keys = self.route_ann.replica_view(peer.name)
            cids = self.session_ann.replica_view(peer.name)
            self.route_ann.replica_ops.pop(peer.name, None)
            self.session_ann.replica_ops.pop(peer.name, None)
        else:
            reps = self._reps()
            keys = self.route_ann.core_view(reps)
            cids = self.session_ann.core_view(reps)
        ctl.send(F.control(F.ROUTES, {
            "snapshot": sorted(keys), "sessions_snapshot": sorted(cids),
            "rev": self._route_rev,
        }))
        self._sent_rev(peer)
        self.tables.link_up(peer.name)
        if peer.role == "replicant":
            self._rlog_snapshot(peer)
        self._learn(ctl.info.get("members", []), peer.name)
        if not self.replicant and peer.role != "replicant":  # incl. who is attached here
            ctl.send(F.control(F.MEMBERS, {"members": self.members_list()}))
        # resend every unacknowledged forward the peer has not applied
        box = peer.outbox
        applied = data.info.get("applied")
        if isinstance(applied, int) and applied > 0:
            box.ack(applied)
        box.rewind()
        self._schedule_flush(peer)
        self._state_changed(peer)

    def _out_closed(self, link: Link) -> None:
        peer = self.peers.get(link.peer)
        if peer is None:
            return
        if peer.ctl_out is link:
            peer.ctl_out = None
            self.tables.link_down(peer.name)
            if peer.data_out is not None:
                peer.data_out.close("control link closed")
        elif peer.data_out is link:
            peer.data_out = None
            if peer.ctl_out is not None:
                peer.ctl_out.close("data link closed")
        else:
            return
        if not self.stopping:
            log.info("cluster: %r closed: %s", link, link.reason)
        self._state_changed(peer)

    def _on_out_frame(self, link: Link, kind: int, body: bytes) -> None:
        peer = self.peers.get(link.peer)
        if peer is None:
            return
        if kind == F.PONG:
            now = time.monotonic()
            peer.last_pong = now
            pong = F.parse_control(body)
            t = pong.get("t")
            if isinstance(t, int | float):
                peer.rtt = max(0.0, now - t)
            conns = pong.get("connections")
            if isinstance(conns, int):
                peer.connections = conns
            rlog = pong.get("rlog")
            view = self.raft_view
            if view is not None and isinstance(rlog, dict) and link.peer == self._candidate:
                seq = rlog.get("seq")
                if isinstance(seq, int):
                    view.core_seq = max(view.core_seq, seq)
                leader = rlog.get("leader")
                view.leader = leader if isinstance(leader, str) else None
        elif kind == F.REPLY:
            msg = F.parse_control(body)
            fut = self._calls.get(msg.get("id"))  # type: ignore[arg-type]
            if fut is not None and not fut.done():
                fut.set_result(msg)
        elif kind == F.ACK:
            seq = F.parse_control(body).get("seq")
            if isinstance(seq, int):
                peer.outbox.ack(seq)
                pending = peer.shared_pending
                while pending:
                    first = next(iter(pending))
                    if first > seq:
                        break
                    del pending[first]
        elif kind == F.ROUTES_ACK:
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
        elif kind == F.MEMBERS:
            self._learn(F.parse_control(body).get("members"), link.peer)
        elif kind == F.CAST:
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
                n = import_session(self.node, cid, export)
                log.info("cluster: session %r taken over from %s (%d subscriptions, "
                         "%d messages)", cid, peer.name, len(export.get("subscriptions", ())), n)

    def _close_peer(self, peer: Peer, why: str) -> None:
        for link in (peer.ctl_out, peer.data_out, peer.ctl_in, peer.data_in):
            if link is not None:
                link.close(why)

    # -- incoming links ----------------------------------------------------------------

    async def _accept_loop(self, lsock: socket.socket) -> None:
        assert self._loop is not None
        while not self.stopping:
            try:
                sock, _ = await self._loop.sock_accept(lsock)
            except OSError as exc:
                if lsock.fileno() < 0:  # closed by stop()
                    return
                log.warning("cluster: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            self._spawn(self._accept(sock))

    async def _accept(self, sock: socket.socket) -> None:
        accepted = await accept_tls(sock, self.tls.server, self.settings.connect_timeout)
        if accepted is None:
            return
        reader, writer, hello = accepted
        remote = writer.get_extra_info("peername")
        name = hello.get("name")
        channel = hello.get("channel")
        why = None
        if hello.get("cluster") != self.settings.cluster_name:
            why = f"cluster {hello.get('cluster')!r} is not {self.settings.cluster_name!r}"
        elif not isinstance(name, str) or not name or name == self.name:
            why = f"bad node name {name!r}"
        elif channel not in ("control", "data"):
            why = f"bad channel {channel!r}"
        elif self.tls.verify_node_name:
            cn = peer_common_name(writer.get_extra_info("ssl_object"))
            if cn != name:
                why = f"certificate CN {cn!r} is not the node name {name!r}"
        if why is None and self.replicant and not hello.get("probe"):
            if hello.get("role") == "replicant":
                why = "a replicant attaches to a core, not to another replicant"
            elif name != self._candidate:
                why = f"{self.name} is {NOT_MY_CORE}"
        if why is not None and NOT_MY_CORE in why:
            log.debug("cluster: refused %s: %s", name, why)
            refuse(writer, why)
            return
        if why is not None or self.stopping:
            why = why or "node stopping"
            log.warning("cluster: refused %s from %s: %s", name, remote, why)
            refuse(writer, why)
            return
        assert isinstance(name, str)
        addr = hello.get("addr")
        role = "replicant" if hello.get("role") == "replicant" else "core"
        peer = self._member(name, addr if isinstance(addr, str) else "", role=role)
        if not hello.get("probe"):
            peer.role = role
        if hello.get("probe"):  # it only learns our name and members: not a link
            writer.write(F.control(F.WELCOME, {
                "name": self.name, "members": self.members_list(),
                "role": self.settings.role, "version": self.settings.version,
            }))
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.drain(), self.settings.connect_timeout)
            writer.close()
            return
        link = Link(name, str(channel), True, reader, writer)
        link.info = hello
        if channel == "control":
            old, peer.ctl_in = peer.ctl_in, link
            if old is not None:
                old.close("replaced by a new control link")
            peer.last_seen_in = time.monotonic()
            writer.write(F.control(F.WELCOME, {
                "name": self.name, "members": self.members_list(),
                "role": self.settings.role, "version": self.settings.version,
            }))
            if peer.state != "up" and peer.ctl_out is None:
                peer.wake.set()  # it is back: dial it now rather than at the next backoff
            if role == "replicant":
                log.info("cluster: replicant %s attached", name)
                self._announce_members()  # its former core hands over what it queued
        else:
            old, peer.data_in = peer.data_in, link
            if old is not None:
                old.close("replaced by a new data link")
            epoch = str(hello.get("epoch", ""))
            mark = self.inbox.get(name)
            applied = mark[1] if mark is not None and mark[0] == epoch else 0
            writer.write(F.control(F.WELCOME, {"name": self.name, "applied": applied}))
        link.start(self._on_in_frame, self._in_closed)
        self._state_changed(peer)

    def _in_closed(self, link: Link) -> None:
        peer = self.peers.get(link.peer)
        if peer is None:
            return
        if peer.ctl_in is link:
            reps = self._reps()
            peer.ctl_in = None
            self.tables.link_down(peer.name)
            self.parked.replace(peer.name, [
                k for k in self.routes.keys_of(peer.name) if not k.startswith(_SHARED_PREFIXES)
            ])
            removed = self._drop(self.route_ann, self.routes, peer.name, reps)
            self._drop(self.session_ann, self.registry, peer.name, reps)
            self._schedule_routes()
            if peer.role == "replicant" and peer.ctl_out is not None:
                peer.ctl_out.close("the replicant detached")  # it may attach elsewhere
            if self.replicant and peer.name == self._candidate and peer.ctl_out is not None:
                # its core's link back went: no routes come any more; attach afresh
                peer.ctl_out.close("the core's link to us closed")
            if not self.stopping:
                log.info("cluster: %r closed (%s): %d routes of %s removed",
                         link, link.reason, removed, peer.name)
        elif peer.data_in is link:
            peer.data_in = None
        self._state_changed(peer)

    def _on_in_frame(self, link: Link, kind: int, body: bytes) -> None:
        peer = self.peers.get(link.peer)
        if peer is None:
            link.close("not a member")
            return
        if kind == F.DATA:
            self._on_data(peer, link, body)
            return
        if link is not peer.ctl_in:
            return  # a control frame on a stale or data link
        peer.last_seen_in = time.monotonic()
        if kind == F.RAFT:
            if self.raft is not None:
                self.raft.received(peer.name, body)
        elif kind == F.PING:
            t = F.parse_control(body).get("t")
            pong: dict[str, Any] = {"t": t, "connections": self.node.connections}
            if peer.role == "replicant" and self.raft is not None:
                pong["rlog"] = {"seq": self._rlog_seq, "leader": self.raft.leader()}
            link.send(F.control(F.PONG, pong))
        elif kind == F.ROUTES:
            self._on_routes(peer, link, F.parse_control(body))
        elif kind == F.TABLE:
            self.tables.received(peer.name, F.parse_control(body))
        elif kind == F.CALL:
            self._on_call(link, F.parse_control(body))
        elif kind == F.MEMBERS:
            self._learn(F.parse_control(body).get("members"), peer.name)
        elif kind == F.LEAVE:
            self.forget(peer.name, "it left the cluster")
        elif kind == F.CAST:
            msg = F.parse_control(body)
            cid = msg.get("cid")
            if msg.get("op") == "takeover" and isinstance(cid, str):
                clean = bool(msg.get("clean"))
                export = export_session(self.node, cid, clean_start=clean)
                if export is not None:  # answered on this link: it reaches the new node
                    link.send(F.control(F.CAST, {"op": "session", "cid": cid, "export": export}))
                    log.info("cluster: session %r handed over to %s", cid, peer.name)
                elif not self.replicant:
                    self._relay_takeover(peer, link, cid, msg)
            elif msg.get("op") == "rlog" and self.raft_view is not None and (
                    peer.name == self._candidate):
                self._on_rlog(msg)

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

    def _relay_takeover(self, peer: Peer, link: Link, cid: str, msg: dict[str, Any]) -> None:
        """A takeover for a session this core does not hold: ask the nodes it stands in
        for (a replicant's request: every other holder; a core's: the replicants
        attached here); the session comes back to ``link``."""
        holders = self.registry.holders(cid) - {peer.name}
        if peer.role != "replicant":
            holders &= set(self._reps())
        asked = 0
        for name in holders:
            other = self.peers.get(name)
            if other is not None and other.ctl_out is not None and not other.ctl_out.closed:
                other.ctl_out.send(F.control(F.CAST, msg))
                asked += 1
        if asked and not msg.get("clean"):
            self._takeovers[cid] = (link, time.monotonic())

    def _relay_to(self, fwd: F.Forwarded) -> None:
        """A record for one replicant attached here (its former core's queue)."""
        assert fwd.target is not None
        peer = self.peers.get(fwd.target)
        if peer is None or peer.role != "replicant" or peer.ctl_in is None:
            log.warning("cluster: a message for %s, which is not attached here, dropped",
                        fwd.target)
            return
        body = F.encode_message(fwd.message, fwd.share)
        peer.forwarded += 1
        if fwd.message.qos == 0:
            peer.qos0.append(F.record(0, body))
            self._schedule_flush(peer)
        else:
            peer.outbox.append(body, lambda p=peer: self._schedule_flush(p))  # type: ignore[misc]

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

    def _on_data(self, peer: Peer, link: Link, body: bytes) -> None:
        batch = F.decode_batch(body)
        epoch = str(link.info.get("epoch", ""))
        mark = self.inbox.get(peer.name)
        applied = mark[1] if mark is not None and mark[0] == epoch else 0
        top = 0
        inject = self.node.inject
        # a core relays: from a replicant to every other node with routes, from a core
        # to the replicants attached here (relay.py); never further
        reps = set(self._reps())
        allow: Callable[[str], bool] | None = None
        if not self.replicant:
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
            if fwd.target is not None and fwd.target != self.name:
                self._relay_to(fwd)  # queued by its former core for a replicant of ours
            elif fwd.share is None:
                with self.tables.injecting():
                    inject(fwd.message)
                if allow is not None:
                    self._forward_plain(fwd.message, allow)
            elif not inject(fwd.message, fwd.share):  # no member here: another node
                group, real = fwd.share
                if peer.role == "replicant" and not self.replicant:
                    self.reshare(fwd.message, group, real, {self.name, peer.name})
                    continue
                nodes = reps & set(self.routes.groups.get(real, {}).get(group, ()))
                if not (nodes and self._dispatch_shared(fwd.message, group, real, nodes, ())):
                    self.reshare(fwd.message, group, real, {self.name})
        if top:
            self.inbox[peer.name] = (epoch, applied)
            self.store.applied_saved(peer.name, epoch, applied)
            ack = F.control(F.ACK, {"seq": applied})
            self.store.after_commit(lambda: link.send(ack))

    # -- routes of this node -----------------------------------------------------------

    # -- session registry and takeover -------------------------------------------------

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

    # -- routes of this node -----------------------------------------------------------

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

    # -- forwarding ----------------------------------------------------------------

    def forward(self, message: Message) -> int:
        """Queue ``message`` for every other node with a matching plain route, and give it
        to one node (this one included) per matching shared group; how many."""
        n = self._forward_plain(message)
        if self.routes.groups or self.node.broker.shared:
            n += self._forward_shared(message)
        return n

    def _forward_plain(self, message: Message, allow: Callable[[str], bool] | None = None
                       ) -> int:
        """``allow``: the nodes a core relays to (see ``_on_data``)."""
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
        peers = self.peers
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
                peer.qos0.append(F.record(0, body))
                self._schedule_flush(peer)
            else:
                peer.outbox.append(body, lambda p=peer: self._schedule_flush(p))  # type: ignore[misc]
        return n

    def _retain_targets(self) -> set[str]:
        """The peers a retained message goes to: a replicant's core; on a core, the
        cores and the replicants attached here (their core relays the rest)."""
        if self.replicant:
            return {self.core} if self.core is not None else set()
        return {n for n, p in self.peers.items()
                if p.role != "replicant" or p.ctl_in is not None}

    # -- shared subscriptions across nodes ---------------------------------------------

    def _forward_shared(self, message: Message) -> int:
        targets: dict[tuple[str, str], set[str]] = {}
        for group, real, nodes in self.routes.match_groups(message.topic):
            targets[(group, real)] = set(nodes)
        for key in self.node.broker.shared_groups(message.topic):
            targets.setdefault(key, set()).add(self.name)
        n = 0
        for (group, real), nodes in targets.items():
            if self._dispatch_shared(message, group, real, nodes, ()):
                n += 1
        return n

    def reshare(self, message: Message, group: str, real: str,
                exclude: tuple[str, ...] | set[str] = ()) -> bool:
        """A shared-group message whose chosen member or node is gone: give it to another
        node with members of the group (this one included unless excluded)."""
        nodes = set(self.routes.groups.get(real, {}).get(group, ()))
        if self.node.broker.shared.get(real, {}).get(group) is not None:
            nodes.add(self.name)
        return self._dispatch_shared(message, group, real, nodes, exclude)

    def _dispatch_shared(self, message: Message, group: str, real: str, nodes: set[str],
                         exclude: tuple[str, ...] | set[str]) -> bool:
        """One node for the group, tried in the strategy's order: this node delivers to a
        local member itself; a reachable peer gets a record marked with the group. With
        no reachable peer left, a QoS 1/2 message waits in the first candidate's outbox."""
        order = [n for n in self._node_order(group, real, nodes, message) if n not in exclude]
        broker = self.node.broker
        for name in order:
            if name == self.name:
                if broker.deliver_shared(message, real, group):
                    return True
                continue
            peer = self.peers.get(name)
            if peer is not None and peer.data_out is not None and not peer.data_out.closed:
                return self._send_shared(peer, message, group, real)
        if message.qos:
            for name in order:
                peer = self.peers.get(name)
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
            peer.qos0.append(F.record(0, body))
            self._schedule_flush(peer)
            return True
        seq = peer.outbox.append(body, lambda p=peer: self._schedule_flush(p))  # type: ignore[misc]
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
        strategy = self.node.broker.shared_strategy
        if strategy == "local":
            if self.name in members:
                return [self.name, *(n for n in order if n != self.name)]
            strategy = "random"
        return list(order.candidates(strategy, topic=message.topic,
                                     publisher=message.publisher, rng=self.node.broker.rng))

    def _reroute_shared(self, peer: Peer) -> None:
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

    def _schedule_flush(self, peer: Peer) -> None:
        if not peer.flush_scheduled and self._loop is not None:
            peer.flush_scheduled = True
            self._loop.call_soon(self._flush, peer)

    def _flush(self, peer: Peer) -> None:
        peer.flush_scheduled = False
        link = peer.data_out
        if link is None or link.closed:
            peer.dropped += len(peer.qos0)
            peer.qos0.clear()
            return
        if peer.blocked:
            return
        batch = self.settings.forward_batch
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
            self._spawn(self._unblock(peer, link))

    async def _unblock(self, peer: Peer, link: Link) -> None:
        try:
            await link.drain()
        finally:
            peer.blocked = False
            self._schedule_flush(peer)

    # -- heartbeats and state --------------------------------------------------------

    def _heartbeat(self) -> None:
        assert self._loop is not None
        now = time.monotonic()
        timeout = self.settings.heartbeat_timeout
        ping = F.control(F.PING, {"t": now})
        for peer in list(self.peers.values()):
            out = peer.ctl_out
            if out is not None:
                if now - peer.last_pong > timeout:
                    out.close(f"no heartbeat for {timeout:g}s")
                else:
                    out.send(ping)
            inn = peer.ctl_in
            if inn is not None and now - peer.last_seen_in > timeout:
                inn.close(f"no heartbeat for {timeout:g}s")
            if peer.unacked_since is not None:
                peer.route_lag_ms = max(peer.route_lag_ms, (now - peer.unacked_since) * 1000)
            self._autoclean(peer)
        if self.raft is not None:
            self._raft_membership()
        if self._takeovers:  # relayed takeovers nobody answered (no session there)
            self._takeovers = {c: v for c, v in self._takeovers.items() if now - v[1] < 60}
        self._tick = self._loop.call_later(self.settings.heartbeat_interval, self._heartbeat)

    def _autoclean(self, peer: Peer) -> None:
        limit = self.settings.autoclean
        down = peer.down_since
        if limit and peer.state == "down" and down is not None and time.time() - down > limit:
            # a replicant down here may be attached to another core: its sessions stay
            self.forget(peer.name, f"down for more than {limit:g}s (autoclean)",
                        claims=peer.role != "replicant")

    def _state_changed(self, peer: Peer) -> None:
        new = peer.update_state()
        if new is None or self.stopping:
            return
        log.info("cluster: node %s is %s", peer.name, new)
        if self.settings.raft and self.raft is None and new == "up" and not self.replicant:
            self._start_raft()  # the members are known now (its WELCOME listed them)
        if new == "up":
            self._raft_removed.discard(peer.name)  # back: the leader may add it again
        if self.raft is not None:
            if new != "up":
                self.raft.link_down(peer.name)
            elif peer.role != "replicant":
                self.raft.link_up(peer.name)
        if new == "down":
            self._reroute_shared(peer)
            for cb in self.on_peer_down:
                cb(peer.name)

    # -- introspection -----------------------------------------------------------------

    def view(self, connections: int) -> dict[str, Any]:
        me = {
            "node": self.name,
            "addr": self.settings.advertise,
            "status": "running",
            "role": self.settings.role,
            "version": self.settings.version,
            "self": True,
            "connections": connections,
            "routes": len(self.local_keys),
        }
        members: list[dict[str, Any]] = [me]
        for peer in sorted(self.peers.values(), key=lambda p: p.name):
            v = peer.view()
            v["routes"] = self.routes.count(peer.name)
            v["parked_routes"] = self.parked.count(peer.name)
            members.append(v)
        up = sum(1 for p in self.peers.values() if p.state == "up")
        return {
            "enabled": True,
            "status": "running",
            "name": self.settings.cluster_name,
            "role": self.settings.role,
            "self": self.name,
            "members": members,
            "nodes_up": up + 1,
            "nodes_total": len(self.peers) + 1,
            "routes": {"local": len(self.local_keys), "remote": len(self.routes)},
            "raft": self._raft_view(),
            "replicant": self._replicant_view() if self.replicant else None,
            "replicants": None if self.replicant else self._reps(),
            "tables": self.tables.view(),
        }

    def _raft_view(self) -> dict[str, Any] | None:
        if self.raft is not None:
            return {**self.raft.status(), "sessions": len(self.raft_sessions)}
        if self.raft_view is not None:  # a replicant: its core's table, streamed
            return {**self.raft_view.status(), "core": self.core,
                    "sessions": len(self.raft_view)}
        return None

    def _replicant_view(self) -> dict[str, Any]:
        """Which core this replicant is attached to, its state and lag: with Raft those
        of the session table streamed by the core; without, ``bootstrap`` until the
        core's route snapshot arrived, then ``normal`` (lag: route revisions this
        node sent its core and the core has not acknowledged)."""
        core = self.peers.get(self.core) if self.core is not None else None
        if self.raft_view is not None:
            st = self.raft_view.status()
            state, lag = st["state"], st["lag"]
        else:
            state = "normal" if self.routes_bootstrapped else "bootstrap"
            lag = 0 if core is None else core.rev_sent - core.rev_acked
        return {"core": self.core, "state": state if core is not None else "bootstrap",
                "lag": lag, "since": self.core_since, "switches": self.core_switches}


def _share_key(group: str, real: str) -> str:
    return f"$queue/{real}" if group == "$queue" else f"$share/{group}/{real}"
