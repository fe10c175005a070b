"""The cluster of one node: membership, links, route replication and forwarding.

How the pieces fit (docs/cluster.md has the full picture):

- **Membership**: static ``seeds``, nodes joined by hand (``gatewayctl cluster join``)
  and nodes learnt from peers (every WELCOME and MEMBERS frame lists the members the
  sender knows) are dialled and kept in ``cluster_members``; ``leave`` tells every peer
  and forgets them all.
- **Links** (:mod:`gateway.cluster.link`): each node dials a control and a data link to
  every member, over mutual TLS on the one cluster port. Heartbeats (PING/PONG) run on
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
  batches. The receiving node routes the message locally only (``Node.inject``), never
  onwards.

Invariants:
- A forwarded message is delivered to each node at most once per route match, and a
  node that receives one never forwards it again.
- QoS 1/2 forwards are acknowledged to the publisher only when committed to the
  outbox (same group commit as its session writes), sent only once committed, and
  removed only when the receiver acknowledged after committing its own writes.
- Route updates to a peer arrive in the order they happened on this node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
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
from gateway.cluster.routes import RouteTable
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
        self._route_ops: list[list[str]] = []
        self.registry = SessionRegistry()  # client id -> other nodes holding a session
        self.local_sessions: set[str] = set()
        self._session_ops: list[list[str]] = []
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
        self.raft_view: Any = None  # the same, read-only, on a replicant
        self._share_order: dict[tuple[str, str], tuple[frozenset[str], SharedGroup[str]]] = {}

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
        if self.settings.dns is not None:
            self._spawn(self._dns_loop(self.settings.dns))
        if self.settings.raft and self.settings.role == "core" and not self.peers:
            self._start_raft()  # the first node; the others start on their first peer up
        self._tick = loop.call_later(self.settings.heartbeat_interval, self._heartbeat)
        log.info(
            "cluster %s: node %s (%s) on %s, advertised as %s, %d known members",
            self.settings.cluster_name, self.name, self.settings.role,
            f"{self.bound[0]}:{self.bound[1]}", self.settings.advertise, len(self.peers),
        )

    async def stop(self) -> None:
        self.stopping = True
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

    def _member(self, name: str, addr: str, *, persist: bool = True) -> Peer:
        peer = self.peers.get(name)
        if peer is not None:
            if addr and addr != peer.addr:
                peer.addr = addr
                if persist:
                    self.store.member_saved(name, addr)
            return peer
        peer = Peer(name, addr, self.store.outbox(name, self.settings.outbox_max))
        self.peers[name] = peer
        if persist:
            self.store.member_saved(name, addr)
        log.info("cluster: member %s at %s", name, addr)
        if not self.stopping:
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
            self._member(link.peer, addr)
            return

    def _start_raft(self) -> None:
        """Raft among this node and the members known at start (docs/cluster.md)."""
        from gateway.cluster.raft import RaftGroup, SessionTable

        sessions = SessionTable()
        replicant = self.settings.role == "replicant"
        others = sorted(n for n, p in self.peers.items() if p.role != "replicant")
        self.raft = RaftGroup(None if replicant else self.name, others, self._raft_send,
                              [sessions], is_up=self._raft_peer_up)
        self.raft.start()
        if replicant:  # it follows the log (read-only); its own sessions are announced
            self.raft_view = sessions
            log.info("cluster: replicant of the Raft group %s", ", ".join(others))
            return
        self.raft_sessions = sessions
        for cid in self.local_sessions:
            sessions.claim(cid, self.name, sync=False)
        log.info("cluster: Raft among %s", ", ".join([self.name, *others]))

    def _raft_table(self) -> Any:
        return self.raft_sessions if self.raft_sessions is not None else self.raft_view

    def _raft_peer_up(self, name: str) -> bool:
        peer = self.peers.get(name)
        return peer is not None and peer.state == "up"

    def _raft_membership(self) -> None:
        """On the leader: add one up core member the group lacks (one change at a time;
        the next heartbeat adds the next)."""
        raft = self.raft
        if raft is None or not raft.is_leader():
            return
        members = raft.members()
        for peer in self.peers.values():
            if peer.state == "up" and peer.role == "core" and peer.name not in members:
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
        """Tell every peer this node leaves, forget them all; how many were told."""
        told = 0
        for peer in list(self.peers.values()):
            link = peer.ctl_out
            if link is not None and not link.closed:
                link.send(F.control(F.LEAVE, {"name": self.name}))
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(link.drain(), 2)
                told += 1
            self.forget(peer.name, "this node left the cluster")
        log.info("cluster: left the cluster (%d peers told)", told)
        return told

    def forget(self, name: str, why: str) -> bool:
        """Remove a member (it left, ``force-leave``, or autoclean): links, routes,
        outbox (its unacknowledged messages are dropped, and counted in the log)."""
        peer = self.peers.pop(name, None)
        if peer is None:
            return False
        peer.state = "left"
        self._close_peer(peer, why)
        if peer.task is not None:
            peer.task.cancel()
        removed = self.routes.drop_node(name)
        self.parked.drop_node(name)
        if self.raft_sessions is not None:
            self.raft_sessions.forget(name, sync=False)
        if self.raft is not None and self.raft.is_leader() and name in self.raft.members():
            self.raft.remove(name)  # a voter that left: the majority shrinks with it
        self._reroute_shared(peer)
        pending = len(peer.outbox)
        self.store.outbox_deleted(name)
        self.store.member_deleted(name)
        log.warning(
            "cluster: %s removed (%s): %d routes removed%s", name, why, removed,
            f", {pending} unacknowledged forwarded messages dropped" if pending else "",
        )
        return True

    def _learn(self, members: Any) -> None:
        if not isinstance(members, list):
            return
        for item in members:
            if (
                isinstance(item, list) and len(item) == 2
                and isinstance(item[0], str) and isinstance(item[1], str)
                and item[0] and item[0] != self.name and item[0] not in self.peers
            ):
                self._member(item[0], item[1])
                self._announce_members()

    def members_list(self) -> list[list[str]]:
        out = [[self.name, self.settings.advertise]]
        out.extend([p.name, p.addr] for p in self.peers.values())
        return out

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
            ctl: Link | None = None
            try:
                ctl = await self._dial_link(peer.addr, "control", peer.name)
                data = await self._dial_link(peer.addr, "data", peer.name)
            except (TimeoutError, OSError, ssl.SSLError, HandshakeError) as exc:
                if ctl is not None:
                    ctl.close("data link failed")
                why = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                peer.failures += 1
                if why != peer.last_error or peer.failures == 1:
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

    def _links_up(self, peer: Peer, ctl: Link, data: Link) -> None:
        peer.ctl_out, peer.data_out = ctl, data
        peer.last_pong = time.monotonic()
        peer.role = str(ctl.info.get("role", "core"))
        peer.version = str(ctl.info.get("version", ""))
        ctl.start(self._on_out_frame, self._out_closed)
        data.start(self._on_out_frame, self._out_closed)
        # our routes, from scratch: the peer replaces whatever it had from us
        self._route_rev += 1
        ctl.send(F.control(F.ROUTES, {
            "snapshot": sorted(self.local_keys), "sessions_snapshot": sorted(self.local_sessions),
            "rev": self._route_rev,
        }))
        self._sent_rev(peer)
        self._learn(ctl.info.get("members", []))
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
            self._learn(F.parse_control(body).get("members"))
        elif kind == F.CAST:
            msg = F.parse_control(body)
            cid, export = msg.get("cid"), msg.get("export")
            if msg.get("op") == "session" and isinstance(cid, str) and isinstance(export, dict):
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
        if why is not None or self.stopping:
            why = why or "node stopping"
            log.warning("cluster: refused %s from %s: %s", name, remote, why)
            refuse(writer, why)
            return
        assert isinstance(name, str)
        addr = hello.get("addr")
        peer = self._member(name, addr if isinstance(addr, str) else "")
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
            peer.ctl_in = None
            self.parked.replace(peer.name, [
                k for k in self.routes.keys_of(peer.name) if not k.startswith(_SHARED_PREFIXES)
            ])
            removed = self.routes.drop_node(peer.name)
            self.registry.drop_node(peer.name)
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
            link.send(F.control(F.PONG, {"t": t, "connections": self.node.connections}))
        elif kind == F.ROUTES:
            msg = F.parse_control(body)
            snapshot = msg.get("snapshot")
            if isinstance(snapshot, list):
                self.parked.drop_node(peer.name)
                self.routes.replace(peer.name, [k for k in snapshot if isinstance(k, str)])
            for op, key in msg.get("ops", ()):
                if op == "+":
                    self.routes.add(peer.name, key)
                else:
                    self.routes.remove(peer.name, key)
            sessions = msg.get("sessions_snapshot")
            if isinstance(sessions, list):
                self.registry.replace(peer.name, [c for c in sessions if isinstance(c, str)])
            for op, cid in msg.get("sessions", ()):
                if op == "+":
                    self.registry.add(peer.name, cid)
                else:
                    self.registry.remove(peer.name, cid)
            link.send(F.control(F.ROUTES_ACK, {"rev": msg.get("rev", 0)}))
        elif kind == F.MEMBERS:
            self._learn(F.parse_control(body).get("members"))
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

    def _on_data(self, peer: Peer, link: Link, body: bytes) -> None:
        batch = F.decode_batch(body)
        epoch = str(link.info.get("epoch", ""))
        mark = self.inbox.get(peer.name)
        applied = mark[1] if mark is not None and mark[0] == epoch else 0
        top = 0
        inject = self.node.inject
        for fwd in batch:
            seq = fwd.seq
            if seq:
                top = max(top, seq)
                if seq <= applied:
                    peer.duplicates += 1
                    continue
                applied = seq
            peer.received += 1
            if fwd.share is None:
                inject(fwd.message)
            elif not inject(fwd.message, fwd.share):  # its member left: another one
                self.reshare(fwd.message, fwd.share[0], fwd.share[1], {self.name})
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
            self.local_sessions.add(cid)
            self._session_ops.append(["+", cid])
            self._schedule_routes()

    def session_ended(self, cid: str) -> None:
        """``Node._terminate``: this node no longer holds a session for ``cid``."""
        if self.raft_sessions is not None:
            self.raft_sessions.release(cid, self.name, sync=False)
        if cid in self.local_sessions:
            self.local_sessions.discard(cid)
            self._session_ops.append(["-", cid])
            self._schedule_routes()

    def takeover(self, client: ClientInfo, clean_start: bool) -> bool:
        """``Node.open_session`` for a client id without a session here: ask every node
        holding one to hand it over (or end it, with clean start). True when the
        session will be present here."""
        holders = self.registry.holders(client.client_id) - {self.name}
        if self.raft is not None:  # the agreed registry, when Raft is on
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
        if added:
            self.local_keys.add(key)
        else:
            self.local_keys.discard(key)
        self._route_ops.append(["+" if added else "-", key])
        self._schedule_routes()

    def _schedule_routes(self) -> None:
        if not self._routes_scheduled and self._loop is not None:
            self._routes_scheduled = True
            self._loop.call_soon(self._send_routes)

    def _send_routes(self) -> None:
        self._routes_scheduled = False
        ops, self._route_ops = self._route_ops, []
        sessions, self._session_ops = self._session_ops, []
        if not ops and not sessions:
            return
        self._route_rev += 1
        frame = F.control(F.ROUTES, {"ops": ops, "sessions": sessions, "rev": self._route_rev})
        for peer in self.peers.values():
            if peer.ctl_out is not None and not peer.ctl_out.closed:
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

    def _forward_plain(self, message: Message) -> int:
        nodes = self.routes.match(message.topic)
        if message.qos and self.parked.by_node:
            nodes = nodes | self.parked.match(message.topic)
        if message.retain:
            nodes = nodes | set(self.peers)  # every node keeps the retained messages
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
        self._tick = self._loop.call_later(self.settings.heartbeat_interval, self._heartbeat)

    def _autoclean(self, peer: Peer) -> None:
        limit = self.settings.autoclean
        down = peer.down_since
        if limit and peer.state == "down" and down is not None and time.time() - down > limit:
            self.forget(peer.name, f"down for more than {limit:g}s (autoclean)")

    def _state_changed(self, peer: Peer) -> None:
        new = peer.update_state()
        if new is None or self.stopping:
            return
        log.info("cluster: node %s is %s", peer.name, new)
        if self.settings.raft and self.raft is None and new == "up":
            self._start_raft()  # the members are known now (its WELCOME listed them)
        if self.raft is not None:
            if new != "up":
                self.raft.link_down(peer.name)
            elif peer.role == "replicant":
                if not self.raft.replicant:
                    self.raft.replica_up(peer.name)
            else:
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
            "raft": None if self.raft is None else {
                **self.raft.status(), "sessions": len(self._raft_table())},
        }


def _share_key(group: str, real: str) -> str:
    return f"$queue/{real}" if group == "$queue" else f"$share/{group}/{real}"
