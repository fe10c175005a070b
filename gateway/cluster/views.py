"""Views: the cluster as ``gatewayctl cluster status`` and ``GET /api/v5/cluster`` show it.

Invariants:
- Views only read; building one never changes the cluster's state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.cluster.state import (
    ClusterState,
)

if TYPE_CHECKING:
    pass


class ViewsPart(ClusterState):
    """The status views."""

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
