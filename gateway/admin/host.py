"""What the operations side needs from the gateway it runs in, and what the HTTP API
needs from :class:`gateway.admin.admin.Admin`, stated as protocols.

They keep the imports one way: :mod:`gateway.app` imports :mod:`gateway.admin` (it
creates ``Admin(self)``), never the reverse, and :mod:`gateway.admin.api` does not import
:mod:`gateway.admin.admin` (which creates the API). mypy checks that
:class:`gateway.app.Gateway` is a :class:`GatewayHost` and that ``Admin`` is an
:class:`AdminView` where each is handed over; a member used through either must be
declared here first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from gateway.admin.alarms import Alarms
from gateway.admin.registry import ListenerEntry
from gateway.admin.stores import BannedAdapter, UsersAdapter
from gateway.admin.trace import TraceHub
from gateway.config import GatewayConfig
from gateway.core.node import Node


class ClusterControl(Protocol):
    """The part of :class:`gateway.cluster.Cluster` the API drives."""

    def view(self, connections: int) -> dict[str, Any]: ...
    def join(self, target: str) -> str: ...
    async def leave(self) -> int: ...
    def forget(self, name: str, why: str) -> bool: ...


class BridgesView(Protocol):
    def view(self) -> dict[str, Any]: ...


class GatewayHost(Protocol):
    """The running gateway as :class:`~gateway.admin.admin.Admin` sees it."""

    config: GatewayConfig
    shared_dir: Path  # the node's data directory (users, bans), shared by its workers
    listeners: dict[str, ListenerEntry]  # whoever opens a listener registers it here

    @property
    def node(self) -> Node | None: ...
    @property
    def cluster(self) -> ClusterControl | None: ...
    @property
    def bridges(self) -> BridgesView | None: ...


class AdminView(Protocol):
    """:class:`~gateway.admin.admin.Admin` as the management API sees it."""

    gateway: GatewayHost
    config: GatewayConfig
    node_name: str
    version: str
    alarms: Alarms
    users: UsersAdapter
    banned: BannedAdapter
    trace_hub: TraceHub | None
    prometheus_registry: Any

    @property
    def node(self) -> Node: ...
    def stats(self) -> dict[str, int]: ...
    def metrics(self) -> dict[str, int]: ...
    def status(self) -> dict[str, Any]: ...
    def node_view(self) -> dict[str, Any]: ...
    def listeners_view(self) -> list[dict[str, Any]]: ...
    def gateways_view(self) -> list[dict[str, Any]]: ...
    def cluster_view(self) -> dict[str, Any]: ...
    def bridges_view(self) -> dict[str, Any]: ...
    def kick(self, clientid: str, *, will: bool = True, discard: bool = False) -> str | None: ...
