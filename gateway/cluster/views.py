"""Views: the cluster as ``gatewayctl cluster status`` and ``GET /api/v5/cluster`` show it.

Owns nothing: :func:`cluster_view` reads the parts it is given.

Invariants:
- Views only read; building one never changes the cluster's state.
"""

from __future__ import annotations

from typing import Any

from gateway.cluster.attach import Attach
from gateway.cluster.raftglue import RaftGlue
from gateway.cluster.replication import RouteReplication
from gateway.cluster.state import Context
from gateway.cluster.tables import TableSync


def cluster_view(ctx: Context, replication: RouteReplication, attach: Attach, raft: RaftGlue,
                 tables: TableSync, connections: int) -> dict[str, Any]:
    settings = ctx.settings
    routes = replication.routes
    me = {
        "node": ctx.name,
        "addr": settings.advertise,
        "status": "running",
        "role": settings.role,
        "version": settings.version,
        "self": True,
        "connections": connections,
        "routes": len(replication.local_keys),
    }
    members: list[dict[str, Any]] = [me]
    for peer in sorted(ctx.peers.values(), key=lambda p: p.name):
        v = peer.view()
        v["routes"] = routes.count(peer.name)
        v["parked_routes"] = replication.parked.count(peer.name)
        members.append(v)
    up = sum(1 for p in ctx.peers.values() if p.state == "up")
    return {
        "enabled": True,
        "status": "running",
        "name": settings.cluster_name,
        "role": settings.role,
        "self": ctx.name,
        "members": members,
        "nodes_up": up + 1,
        "nodes_total": len(ctx.peers) + 1,
        "routes": {"local": len(replication.local_keys), "remote": len(routes)},
        "raft": raft.status(attach.core),
        "replicant": replicant_view(ctx, attach, raft) if ctx.replicant else None,
        "replicants": None if ctx.replicant else ctx.reps(),
        "tables": tables.view(),
    }


def replicant_view(ctx: Context, attach: Attach, raft: RaftGlue) -> dict[str, Any]:
    """Which core this replicant is attached to, its state and lag: with Raft those
    of the session table streamed by the core; without, ``bootstrap`` until the
    core's route snapshot arrived, then ``normal`` (lag: route revisions this
    node sent its core and the core has not acknowledged)."""
    core = ctx.peers.get(attach.core) if attach.core is not None else None
    if raft.view is not None:
        st = raft.view.status()
        state, lag = st["state"], st["lag"]
    else:
        state = "normal" if attach.routes_bootstrapped else "bootstrap"
        lag = 0 if core is None else core.rev_sent - core.rev_acked
    return {"core": attach.core, "state": state if core is not None else "bootstrap",
            "lag": lag, "since": attach.core_since, "switches": attach.core_switches}
