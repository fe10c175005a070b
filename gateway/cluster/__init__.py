"""Clustering: edge nodes that form one broker over mutually authenticated TLS.

Public surface: :class:`Cluster` (membership, links, route replication, forwarding) and
:func:`from_config`, which builds one from ``[node]``/``[cluster]`` for ``gateway.app``.
See docs/cluster.md.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gateway.cluster.cluster import Cluster, ClusterSettings, parse_seed
from gateway.cluster.discovery import DnsSettings
from gateway.cluster.outbox import ClusterStore
from gateway.cluster.tls import build as build_tls  # noqa: F401 - re-exported
from gateway.cluster.tls import from_config as tls_from_config

if TYPE_CHECKING:
    from gateway.config import GatewayConfig
    from gateway.core.node import Node
    from gateway.store.writer import GroupCommitter

__all__ = ["Cluster", "ClusterSettings", "ClusterStore", "from_config", "parse_seed"]

log = logging.getLogger("gateway.cluster")


def from_config(
    config: GatewayConfig, node: Node, committer: GroupCommitter | None, version: str = ""
) -> Cluster | None:
    """The cluster ``config`` asks for (None when clustering is off).

    Raises :class:`gateway.net.tls.TlsError` for unusable certificates. With durability
    on, the outboxes live in ``gateway.db`` next to the sessions, written through the
    same group committer.
    """
    c = config.cluster
    if not c.enable:
        return None
    from gateway.store.db import db_path, open_db

    tls = tls_from_config(c.tls)
    conn = open_db(db_path(config.node.data_dir)) if committer is not None else None
    if conn is None:
        log.warning("cluster: durability disabled: forwarded QoS 1/2 messages are memory-only")
    settings = ClusterSettings(
        node_name=config.node.name,
        cluster_name=c.name,
        bind=c.bind,
        advertise=c.advertise or "",
        role=config.node.role,
        seeds=[parse_seed(s) for s in c.seeds] if c.discovery != "manual" else [],
        heartbeat_interval=c.heartbeat_interval,
        heartbeat_timeout=c.heartbeat_timeout,
        connect_timeout=c.connect_timeout,
        reconnect_max=c.reconnect_max,
        forward_batch=c.forward_batch,
        outbox_max=c.outbox_max,
        autoclean=c.autoclean,
        version=version,
        dns=DnsSettings(
            name=c.dns.name, record_type=c.dns.record_type, nameservers=list(c.dns.nameservers),
            refresh=c.dns.refresh,
        ) if c.discovery == "dns" and c.dns.name else None,
        raft=c.raft,
        raft_compact_entries=c.raft_compact_entries,
        tables=c.tables,
        table_poll=c.table_poll,
        data_dir=str(config.node.data_dir),
    )
    return Cluster(settings, node, tls, ClusterStore(conn, committer))
