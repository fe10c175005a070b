"""What a core node announces to whom, with replicants attached to it (docs/cluster.md,
"Replicants").

A replicant links to one core only. That core stands in for it towards the rest of the
cluster and for the rest of the cluster towards it:

- to the other cores (and the nodes a core is not proxying for), a core announces its
  own keys plus the keys of the replicants attached to it, as if they were its own;
- to an attached replicant ``r``, a core announces its own keys plus every key any other
  node announced to it (cores and the other replicants), as if they were its own.

So a publish on any node reaches a replicant's subscribers through its core, and a
replicant's publish reaches every subscriber through its core (the core relays; see
:meth:`gateway.cluster.cluster.Cluster._relay`). The same holds for the session
registry (client ids), so a takeover finds a session held behind a core.

:class:`Announcer` keeps the pending add/remove operations per audience for one table
(routes or sessions). A change of one key (by this node or by a peer) is applied through
:meth:`Announcer.change`, which compares the key's presence for every audience before
and after and queues an operation where it differs.

Invariants:
- After the queued operations are sent, what an audience was told equals
  :meth:`Announcer.core_view` / :meth:`Announcer.replica_view` of the tables.
- With no replicant attached, the core audience sees exactly the local keys.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

Ops = list[list[str]]


class Announcer:
    def __init__(self, local: Callable[[], set[str]],
                 by_node: Callable[[], dict[str, set[str]]],
                 owners: Callable[[str], Iterable[str]]) -> None:
        self.local = local  # this node's own keys
        self.by_node = by_node  # node -> keys it announced to us
        self.owners = owners  # key -> nodes that announced it to us
        self.core_ops: Ops = []
        self.replica_ops: dict[str, Ops] = {}

    def _present(self, key: str, reps: Iterable[str]) -> tuple[bool, list[bool]]:
        local = key in self.local()
        owners = set(self.owners(key))
        core = local or bool(owners.intersection(reps))
        return core, [local or bool(owners - {r}) for r in reps]

    def change(self, key: str, reps: list[str], apply: Callable[[], object]) -> None:
        """Apply one change of ``key`` (``apply``) and queue what each audience must
        be told: the cores, and each attached replicant in ``reps``."""
        if not reps:
            before = key in self.local()
            apply()
            after = key in self.local()
            if before != after:
                self.core_ops.append(["+" if after else "-", key])
            return
        core0, rep0 = self._present(key, reps)
        apply()
        core1, rep1 = self._present(key, reps)
        if core0 != core1:
            self.core_ops.append(["+" if core1 else "-", key])
        for r, was, now in zip(reps, rep0, rep1, strict=True):
            if was != now:
                self.replica_ops.setdefault(r, []).append(["+" if now else "-", key])

    def core_view(self, reps: Iterable[str]) -> set[str]:
        out = set(self.local())
        tables = self.by_node()
        for r in reps:
            out |= tables.get(r, set())
        return out

    def replica_view(self, rep: str) -> set[str]:
        out = set(self.local())
        for node, keys in self.by_node().items():
            if node != rep:
                out |= keys
        return out

    def take(self) -> tuple[Ops, dict[str, Ops]]:
        core, self.core_ops = self.core_ops, []
        reps, self.replica_ops = self.replica_ops, {}
        return core, reps


class ReplicaLog:
    """A replicant's copy of its core's Raft session table (with ``cluster.raft``).

    The core streams what its table applies, in order, on its control link to the
    replicant: a snapshot (the whole table and the core's sequence number) when the
    link comes up or the core loaded a full dump, then one entry per applied change. The
    replicant never votes and never writes to Raft; its own sessions reach the table
    through its core. States: ``bootstrap`` (no snapshot from the current core yet),
    ``replay`` (behind the sequence number the core last reported), ``normal``.
    """

    def __init__(self) -> None:
        self.holders: dict[str, str] = {}
        self.applied = 0  # the core's sequence number of the last entry applied here
        self.core_seq = 0  # the newest sequence number the core reported
        self.bootstrapped = False
        self.leader: str | None = None
        self.snapshots = 0

    def reset(self) -> None:
        """The core went: a new one starts from its own snapshot."""
        self.bootstrapped = False
        self.applied = self.core_seq = 0

    def snapshot(self, seq: int, holders: dict[str, str]) -> None:
        self.holders = dict(holders)
        self.applied = seq
        self.core_seq = max(self.core_seq, seq)
        self.bootstrapped = True
        self.snapshots += 1

    def entry(self, seq: int, op: str, args: list[str]) -> None:
        if not self.bootstrapped or seq <= self.applied:
            return
        self.applied = seq
        self.core_seq = max(self.core_seq, seq)
        if op == "claim" and len(args) == 2:
            self.holders[args[0]] = args[1]
        elif op == "release" and len(args) == 2:
            if self.holders.get(args[0]) == args[1]:
                del self.holders[args[0]]
        elif op == "forget" and len(args) == 1:
            self.holders = {c: n for c, n in self.holders.items() if n != args[0]}

    def holder(self, cid: str) -> str | None:
        return self.holders.get(cid)

    def __len__(self) -> int:
        return len(self.holders)

    def status(self) -> dict[str, object]:
        lag = max(0, self.core_seq - self.applied)
        state = "bootstrap" if not self.bootstrapped else ("replay" if lag else "normal")
        return {"state": state, "lag": lag, "leader": self.leader, "applied": self.applied,
                "snapshots": self.snapshots}
