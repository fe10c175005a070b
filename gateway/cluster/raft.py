"""Raft among core nodes through pysyncobj, carried by the cluster's own links (stage 5,
with ``cluster.raft`` on; docs/cluster.md says what remains). Replicants do not run Raft:
their core streams its applied session table to them (:mod:`gateway.cluster.relay`).
With a data directory the log is journalled there and compacted into a full dump, so a
restarted core resumes from its own log.

pysyncobj's own ``TCPTransport`` opens its own port without TLS. Here a
:class:`LinkTransport` (a pysyncobj ``Transport``) hands every Raft message to a
``send(node_name, payload)`` callable, which the cluster will put on the mutual-TLS
control link to that node as a RAFT frame; what arrives on a control link is handed back
with :meth:`RaftGroup.received`. Link state is reported with :meth:`RaftGroup.link_up` /
:meth:`RaftGroup.link_down`. pysyncobj runs with ``autoTick=False``: :meth:`RaftGroup.start`
ticks it from the asyncio loop (no thread of its own, so no locking between Raft and the
broker).

Invariants:
- Node ids are cluster node names; a payload is only ever accepted from a name the
  cluster authenticated (the TLS certificate's CN is the node name).
- Nothing a peer sends can make this node run code: pysyncobj pickles its messages, its
  log entries and its snapshots, so every unpickling (ours of a RAFT frame, and
  pysyncobj's own, patched by :func:`install_safe_pickle`) goes through
  :class:`SafeUnpickler`, which builds only plain data (numbers, strings, bytes, lists,
  tuples, dicts, sets) and pysyncobj's ``Node`` objects; a pickle naming any other
  global is refused (the frame is dropped and logged).
- A message for a node whose link is down is dropped (``send`` returns False); Raft
  retries by itself (heartbeats, append-entries resends).
"""

from __future__ import annotations

import asyncio
import io
import logging
import os
import pickle
from collections.abc import Callable
from typing import Any

from pysyncobj import (  # type: ignore[import-untyped]
    FAIL_REASON,
    SyncObj,
    SyncObjConf,
    SyncObjConsumer,
    replicated,
)
from pysyncobj.monotonic import monotonic as raft_clock  # type: ignore[import-untyped]
from pysyncobj.node import Node as RaftNode  # type: ignore[import-untyped]
from pysyncobj.transport import Transport  # type: ignore[import-untyped]

Send = Callable[[str, bytes], bool]
log = logging.getLogger("gateway.cluster")

_PLAIN = ("set", "frozenset", "bytearray", "bytes", "int", "float", "str", "list",
          "tuple", "dict", "bool", "complex", "object")
ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {(m, n) for m in ("builtins", "__builtin__") for n in _PLAIN}
    | {("_codecs", "encode"),  # protocol 2 pickles bytes as _codecs.encode(str, "latin1")
       ("copyreg", "_reconstructor"), ("copy_reg", "_reconstructor"),
       ("collections", "OrderedDict"), ("collections", "deque"),
       ("pysyncobj.node", "Node"), ("pysyncobj.node", "TCPNode")})


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals in :data:`ALLOWED`."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


def safe_loads(data: bytes | str) -> Any:
    if isinstance(data, str):
        data = data.encode("utf-8")
    return SafeUnpickler(io.BytesIO(data)).load()


def safe_load(file: Any) -> Any:
    return SafeUnpickler(file).load()


def install_safe_pickle() -> None:
    """Route pysyncobj's own unpickling (log entries, membership commands, snapshots,
    journal) through :class:`SafeUnpickler` (idempotent)."""
    import pysyncobj.journal as pj  # type: ignore[import-untyped]
    import pysyncobj.pickle as pp  # type: ignore[import-untyped]

    pp.loads = safe_loads
    pp.load = safe_load
    pj.loads = safe_loads


install_safe_pickle()


class LinkTransport(Transport):  # type: ignore[misc]
    """A pysyncobj transport over the cluster's links (see module docstring)."""

    send_payload: Send  # set by RaftGroup on a subclass before SyncObj builds us
    is_up: Callable[[str], bool]  # the cluster's view of a peer's links

    def __init__(self, syncObj: Any, selfNode: Any, otherNodes: Any) -> None:
        super().__init__(syncObj, selfNode, otherNodes)
        self.nodes: dict[str, Any] = {n.id: n for n in otherNodes}
        self.connected: set[str] = set()

    def addNode(self, node: Any) -> None:
        """A membership change added ``node``: connected at once if its links are up."""
        self.nodes[node.id] = node
        if self.is_up(node.id) and node.id not in self.connected:
            self.connected.add(node.id)
            self._onNodeConnected(node)

    def dropNode(self, node: Any) -> None:
        self.nodes.pop(node.id, None)
        self.connected.discard(node.id)

    def send(self, node: Any, message: Any) -> bool:
        if node.id not in self.connected:
            return False
        return self.send_payload(node.id, pickle.dumps(message, protocol=5))

    def destroy(self) -> None:
        self.connected.clear()

    # -- from the cluster ------------------------------------------------------------

    def received(self, name: str, payload: bytes) -> None:
        node = self.nodes.get(name)
        if node is None:
            return
        try:
            message = safe_loads(payload)
        except Exception as exc:
            log.warning("cluster: refused a Raft message from %s: %s", name, exc)
            return
        if not isinstance(message, dict):
            log.warning("cluster: refused a Raft message from %s: not a dict", name)
            return
        try:
            self._onMessageReceived(node, message)
        except pickle.UnpicklingError as exc:
            log.warning("cluster: refused a Raft entry from %s: %s", name, exc)

    def link_up(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is not None and name not in self.connected:
            self.connected.add(name)
            self._onNodeConnected(node)

    def link_down(self, name: str) -> None:
        node = self.nodes.get(name)
        if node is not None and name in self.connected:
            self.connected.discard(name)
            self._onNodeDisconnected(node)


class RaftGroup:
    """One node's member of the core nodes' Raft group: a pysyncobj ``SyncObj`` over
    :class:`LinkTransport`, ticked from the event loop."""

    def __init__(self, name: str, others: list[str], send: Send,
                 consumers: list[SyncObjConsumer], *, tick: float = 0.02,
                 data_dir: str | None = None, compact_entries: int = 5000,
                 is_up: Callable[[str], bool] = lambda _name: False) -> None:
        """``data_dir``: journal (``raft.journal``) and full dump (``raft.dump``) there,
        so a restarted node resumes from its own log; None: memory only."""
        transport_class = type("BoundLinkTransport", (LinkTransport,), {
            "send_payload": staticmethod(send), "is_up": staticmethod(is_up)})
        journal = dump = None
        if data_dir is not None:
            journal = os.path.join(data_dir, "raft.journal")
            dump = os.path.join(data_dir, "raft.dump")
        self.resumed = journal is not None and os.path.isfile(journal)
        # useFork off: the node has threads (the group committer); the dump is written
        # from the tick (small tables); compaction by size, and at least hourly
        conf = SyncObjConf(autoTick=False, journalFile=journal, fullDumpFile=dump,
                           dynamicMembershipChange=True, useFork=False,
                           logCompactionMinEntries=compact_entries,
                           logCompactionMinTime=3600)
        self.name = name
        self.tick_interval = tick
        self.sync = SyncObj(RaftNode(name), [RaftNode(o) for o in others], conf=conf,
                            consumers=consumers, transportClass=transport_class)
        self._handle: asyncio.Handle | None = None

    @property
    def transport(self) -> LinkTransport:
        t: LinkTransport = self.sync._SyncObj__transport
        return t

    def start(self) -> None:
        loop = asyncio.get_running_loop()

        def tick() -> None:
            try:
                self.sync.doTick(0.0)
            except Exception:  # e.g. a refused pickle in an entry: keep ticking
                log.exception("cluster: Raft tick failed")
            self._handle = loop.call_later(self.tick_interval, tick)

        self._handle = loop.call_soon(tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self.sync.destroy()

    def received(self, name: str, payload: bytes) -> None:
        self.transport.received(name, payload)

    def is_leader(self) -> bool:
        return bool(self.sync._isLeader())

    def members(self) -> set[str]:
        return {self.name, *self.transport.nodes}

    def leader(self) -> str | None:
        leader = self.sync._getLeader()
        return None if leader is None else str(leader.id)

    def add(self, name: str) -> None:
        """On the leader: make ``name`` a voting member (one change at a time)."""
        self.sync.addNodeToCluster(RaftNode(name))

    def remove(self, name: str, done: Callable[[bool], None] | None = None) -> None:
        """On the leader: ``name`` is no longer a voter; ``done(ok)`` once committed."""
        cb = None if done is None else (lambda _res, err: done(err == FAIL_REASON.SUCCESS))
        self.sync.removeNodeFromCluster(RaftNode(name), callback=cb)

    def transfer_leadership(self) -> None:
        """On the leader: hand leadership to the most caught-up other voter."""
        self.sync.transferLeadership()

    def link_up(self, name: str) -> None:
        """The links to ``name`` are up. A follower then waits a whole election timeout
        from now before it may campaign, so the leader's next heartbeat reaches it
        first: pysyncobj set the election deadline when the group was built, and a
        core restarted with its journal whose links came up after that deadline
        (a loaded machine: TLS handshakes take a while) campaigned at once with the
        first peer linked, at a higher term. Its log being behind it could not win, but
        the higher term deposed the leader (pysyncobj has no pre-vote): the group
        changed leader for nothing (tests/gateway/cluster/test_raft.py,
        ``test_a_restarted_follower_does_not_depose_the_leader``)."""
        if name in self.transport.connected:
            return
        self.transport.link_up(name)
        if name in self.transport.connected and not self.sync._isLeader():
            deadline = raft_clock() + self.sync._SyncObj__generateRaftTimeout()
            if self.sync._SyncObj__raftElectionDeadline < deadline:
                self.sync._SyncObj__raftElectionDeadline = deadline

    def link_down(self, name: str) -> None:
        self.transport.link_down(name)

    def status(self) -> dict[str, Any]:
        """Leader, term, commit index and log size, as ``gatewayctl cluster status`` will
        show them."""
        s = self.sync.getStatus()
        leader = s.get("leader")
        return {
            "leader": None if leader is None else str(leader),
            "term": s.get("raft_term"),
            "commit_index": s.get("commit_idx"),
            "last_applied": s.get("last_applied"),
            "log_len": s.get("log_len"),
            "ready": bool(self.sync.isReady()),
            "members": sorted(self.members()),
            "journal": self.sync._SyncObj__conf.journalFile is not None,
        }


class SessionTable(SyncObjConsumer):  # type: ignore[misc]
    """The Raft-replicated session registry: client id -> the node holding its session.

    ``claim`` overwrites (the newest session wins: a takeover), ``release`` deletes only
    the releasing node's own claim (a late release never removes a newer claim),
    ``forget`` removes every claim of a node that left or was cleaned."""

    def __init__(self) -> None:
        # set before the base class records the attributes not to serialize
        self.on_apply: Callable[[str, tuple[str, ...]], None] | None = None
        super().__init__()
        self.holders: dict[str, str] = {}

    def _applied(self, op: str, *args: str) -> None:
        if self.on_apply is not None:
            self.on_apply(op, args)

    @replicated  # type: ignore[untyped-decorator]
    def claim(self, cid: str, node: str) -> None:
        self.holders[cid] = node
        self._applied("claim", cid, node)

    @replicated  # type: ignore[untyped-decorator]
    def release(self, cid: str, node: str) -> None:
        if self.holders.get(cid) == node:
            del self.holders[cid]
            self._applied("release", cid, node)

    @replicated  # type: ignore[untyped-decorator]
    def forget(self, node: str) -> None:
        self.holders = {c: n for c, n in self.holders.items() if n != node}
        self._applied("forget", node)

    def _deserialize(self, data: dict[str, Any]) -> None:
        """A full dump was loaded (ours at start, or the leader's snapshot)."""
        super()._deserialize(data)
        self._applied("snapshot")

    def holder(self, cid: str) -> str | None:
        return self.holders.get(cid)

    def __len__(self) -> int:
        return len(self.holders)
