"""What every part of one node's cluster shares (:class:`Context`: the settings, the node,
the member table, the event loop and its tasks), and the settings (:class:`ClusterSettings`).

The cluster is a small :class:`gateway.cluster.cluster.Cluster` that composes separate
part objects, each in its own module, each owning its own state:

========================  ==========================================================
:mod:`.membership`        members, join/leave/forget, CALLs, heartbeats, peer states
:mod:`.links`             the mutual-TLS links (dial, accept, frames to handlers)
:mod:`.attach`            a replicant's one core; a core's relay to its replicants
:mod:`.replication`       routes and session announcements, out and in
:mod:`.forwarding`        forwards out (outboxes, flushing) and DATA in
:mod:`.sharing`           shared subscriptions across nodes
:mod:`.sessions`          session announcements and takeover
:mod:`.raftglue`          the cores' Raft group (session registry)
:mod:`.tables`            retained messages, bans, users, rules cluster-wide
:mod:`.rows`              their rows: the clock, the LWW table, the kinds
:mod:`.delayed`           delayed messages cluster-wide
:mod:`.views`             status for gatewayctl and the API
========================  ==========================================================

Parts talk to each other only through what they are given at construction (callables or
small Protocols); the ``Cluster`` wires them and sequences the events that touch several
parts (a link coming up or going, a member forgotten, a peer's state changing).

Invariants of :class:`Context`:
- It holds no part's state: only the settings, the node, the member table ``peers``,
  ``stopping``, the loop and the tasks started through :meth:`Context.spawn`.
- ``peers`` gains and loses members only through :mod:`.membership`; a
  :class:`~gateway.cluster.peer.Peer`'s link fields are set only by :mod:`.links`. The
  other parts read it and update the figures and queues of a ``Peer`` they are given.
- Everything runs on the event loop thread; no part blocks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gateway.cluster.discovery import DnsSettings
from gateway.cluster.link import split_addr
from gateway.cluster.outbox import ClusterStore
from gateway.cluster.peer import Peer
from gateway.cluster.tls import ClusterTls

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


class Context:
    """The node, its settings and the member table, shared read-mostly by every part."""

    def __init__(self, settings: ClusterSettings, node: Node, tls: ClusterTls,
                 store: ClusterStore) -> None:
        self.settings = settings
        self.name = settings.node_name
        self.node = node
        self.tls = tls
        self.store = store
        # distribution points / OCSP of peer certificates (gateway.security.linkcheck's
        # LinkRevocation, set by gateway.app when [cluster.tls] asks for them)
        self.revocation: Any = None
        self.peers: dict[str, Peer] = {}
        self.stopping = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks: set[asyncio.Task[Any]] = set()
        self.started_at = time.time()

    @property
    def replicant(self) -> bool:
        return self.settings.role == "replicant"

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        assert self.loop is not None
        task = self.loop.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    def reps(self) -> list[str]:
        """The replicants attached to this core (their control link to us is open)."""
        if self.replicant:
            return []
        return [p.name for p in self.peers.values()
                if p.role == "replicant" and p.ctl_in is not None]

    def send_ctl(self, name: str, data: bytes) -> bool:
        """``data`` on our control link to ``name``; False without one."""
        peer = self.peers.get(name)
        if peer is None or peer.ctl_out is None:
            return False
        peer.ctl_out.send(data)
        return True

    def linked(self) -> list[str]:
        """The members our control link goes to."""
        return [p.name for p in self.peers.values() if p.ctl_out is not None]

    async def cancel_tasks(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        for task in list(self.tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _share_key(group: str, real: str) -> str:
    return f"$queue/{real}" if group == "$queue" else f"$share/{group}/{real}"
