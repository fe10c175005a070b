"""The state of one node's cluster, shared by the parts that make up
:class:`gateway.cluster.cluster.Cluster`, and the interface the parts offer each other.

The cluster is one object built from parts, each in its own module and each holding one
concern (membership, links, replicant attach, route replication, forwarding, shared
subscriptions, sessions and takeover, Raft glue, views; the replicated tables in
:mod:`gateway.cluster.tables`). The parts are classes over this one :class:`ClusterState`;
the stubs at the end of it name every method one part calls on another, so each module
reads on its own and a type checker sees the whole interface.

Invariants:
- Every attribute of the node's cluster is created here, in ``__init__``; the parts add
  none.
- Every stub here is implemented by exactly one part (the part modules' ``*Part``
  classes come before ``ClusterState`` in ``Cluster``'s method order).
- Everything runs on the event loop thread; no part blocks it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.cluster import frames as F
from gateway.cluster.discovery import DnsSettings
from gateway.cluster.link import Link, split_addr
from gateway.cluster.outbox import ClusterStore
from gateway.cluster.peer import Peer
from gateway.cluster.relay import Announcer, ReplicaLog
from gateway.cluster.routes import RouteTable
from gateway.cluster.tables import TableSync
from gateway.cluster.takeover import SessionRegistry
from gateway.cluster.tls import ClusterTls
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


class ClusterState:
    """Attributes of the node's cluster, and the parts' shared interface."""

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

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _send_ctl(self, name: str, data: bytes) -> bool:
        peer = self.peers.get(name)
        if peer is None or peer.ctl_out is None:
            return False
        peer.ctl_out.send(data)
        return True

    def _linked(self) -> list[str]:
        return [p.name for p in self.peers.values() if p.ctl_out is not None]

    # -- what the parts offer each other (implemented in their modules) ----------

    async def _accept_loop(self, lsock: socket.socket) -> None:
        raise NotImplementedError

    def _announce_members(self) -> None:
        raise NotImplementedError

    async def _attach_loop(self) -> None:
        raise NotImplementedError

    def _close_peer(self, peer: Peer, why: str) -> None:
        raise NotImplementedError

    def _dial_address(self, addr: str) -> None:
        raise NotImplementedError

    async def _dial_link(self, addr: str, channel: str, expect: str | None, *,
                         probe: bool = False) -> Link:
        raise NotImplementedError

    async def _dial_loop(self, peer: Peer) -> None:
        raise NotImplementedError

    def _dispatch_shared(self, message: Message, group: str, real: str, nodes: set[str],
                         exclude: tuple[str, ...] | set[str]) -> bool:
        raise NotImplementedError

    async def _dns_loop(self, dns: DnsSettings) -> None:
        raise NotImplementedError

    def _drop(self, ann: Announcer, table: Any, node: str, reps: list[str]) -> int:
        raise NotImplementedError

    async def _forward_removal(self, leader: str, name: str) -> None:
        raise NotImplementedError

    def _forward_shared(self, message: Message) -> int:
        raise NotImplementedError

    def _heartbeat(self) -> None:
        raise NotImplementedError

    def _learn(self, members: Any, sender: str | None = None) -> None:
        raise NotImplementedError

    def _links_up(self, peer: Peer, ctl: Link, data: Link) -> None:
        raise NotImplementedError

    def _local_route(self, key: str, added: bool) -> None:
        raise NotImplementedError

    def _member(self, name: str, addr: str, *, persist: bool = True, role: str = "core"
                ) -> Peer:
        raise NotImplementedError

    def _on_call(self, link: Link, msg: dict[str, Any]) -> None:
        raise NotImplementedError

    def _on_data(self, peer: Peer, link: Link, body: bytes) -> None:
        raise NotImplementedError

    def _on_rlog(self, msg: dict[str, Any]) -> None:
        raise NotImplementedError

    def _on_routes(self, peer: Peer, link: Link, msg: dict[str, Any]) -> None:
        raise NotImplementedError

    def _raft_journal_exists(self) -> bool:
        raise NotImplementedError

    async def _raft_leave(self, timeout: float = 5.0) -> None:
        raise NotImplementedError

    def _raft_membership(self) -> None:
        raise NotImplementedError

    def _raft_table(self) -> Any:
        raise NotImplementedError

    def _relay_takeover(self, peer: Peer, link: Link, cid: str, msg: dict[str, Any]) -> None:
        raise NotImplementedError

    def _relay_to(self, fwd: F.Forwarded) -> None:
        raise NotImplementedError

    def _reps(self) -> list[str]:
        raise NotImplementedError

    def _reroute_shared(self, peer: Peer) -> None:
        raise NotImplementedError

    def _rlog_snapshot(self, peer: Peer) -> None:
        raise NotImplementedError

    def _schedule_flush(self, peer: Peer) -> None:
        raise NotImplementedError

    def _schedule_routes(self) -> None:
        raise NotImplementedError

    def _sent_rev(self, peer: Peer) -> None:
        raise NotImplementedError

    def _session_created(self, client: ClientInfo) -> None:
        raise NotImplementedError

    def _start_raft(self) -> None:
        raise NotImplementedError

    def _state_changed(self, peer: Peer) -> None:
        raise NotImplementedError

    async def call(self, name: str, request: dict[str, Any], timeout: float
                   ) -> dict[str, Any]:
        raise NotImplementedError

    def forget(self, name: str, why: str, *, claims: bool = True) -> bool:
        raise NotImplementedError

    def members_list(self) -> list[list[str]]:
        raise NotImplementedError

    @property
    def replicant(self) -> bool:
        raise NotImplementedError

    def reshare(self, message: Message, group: str, real: str,
                exclude: tuple[str, ...] | set[str] = ()) -> bool:
        raise NotImplementedError


def _share_key(group: str, real: str) -> str:
    return f"$queue/{real}" if group == "$queue" else f"$share/{group}/{real}"
