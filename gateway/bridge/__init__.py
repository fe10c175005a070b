"""Upstream MQTT bridges with a durable store-and-forward outbox.

Local messages matching a bridge's forward rules queue in its outbox (SQLite, the node's
``gateway.db``) and drain in order to the upstream broker; upstream subscriptions are
published into the local broker. See docs/bridge.md.

Modules: :mod:`~gateway.bridge.settings` (plain settings from the configuration),
:mod:`~gateway.bridge.store` (the table), :mod:`~gateway.bridge.outbox` (the queue and its
limits), :mod:`~gateway.bridge.client` (the MQTT client state machine, no sockets),
:mod:`~gateway.bridge.link` (asyncio TCP/TLS), :mod:`~gateway.bridge.tls` (client TLS
contexts), :mod:`~gateway.bridge.bridge` (one bridge) and :class:`Bridges` here (all of
a node's bridges, as ``gateway.app`` starts and stops them).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gateway.bridge.bridge import HEADER, Bridge
from gateway.bridge.client import State, UpstreamClient
from gateway.bridge.link import AsyncioDialer
from gateway.bridge.outbox import Outbox
from gateway.bridge.settings import BridgeSettings, settings_from_config
from gateway.bridge.store import OutboxStore
from gateway.bridge.tls import client_context, link_check, server_hostname
from gateway.config.schema import GatewayConfig
from gateway.core.node import Node
from gateway.net.tls import TlsError
from gateway.security.linkcheck import LinkRevocation, link_guard_settings, wanted
from gateway.store.sessions import SessionStore

__all__ = [
    "HEADER",
    "Bridge",
    "BridgeSettings",
    "Bridges",
    "Outbox",
    "OutboxStore",
    "State",
    "UpstreamClient",
    "settings_from_config",
]

log = logging.getLogger("gateway.bridge")

STOP_TIMEOUT = 2.0  # seconds to let DISCONNECTs reach upstream at shutdown


class Bridges:
    """Every enabled ``[bridges.mqtt.<name>]`` of a node."""

    def __init__(
        self, node: Node, config: GatewayConfig, session_store: SessionStore | None = None
    ) -> None:
        self.node = node
        self.config = config
        self.session_store = session_store  # the node's gateway.db, when durability is on
        self.bridges: dict[str, Bridge] = {}
        self.dialers: list[AsyncioDialer] = []
        self.revocations: list[LinkRevocation] = []  # distribution points / OCSP, per bridge
        self.store: OutboxStore | None = None

    def start(self) -> None:
        """Build and start the bridges (call on the event loop). Raises
        :class:`~gateway.net.tls.TlsError` (its key names the bridge) for unusable TLS
        files."""
        node = self.node
        session_store = self.session_store
        if session_store is not None:
            self.store = OutboxStore(session_store.conn, session_store.committer)
        configured = self.config.bridges.mqtt
        for name, conf in configured.items():
            if not conf.enable:
                continue
            settings = settings_from_config(name, conf, self.config.node.name)
            ctx = None
            sni = None
            if settings.tls is not None:
                try:
                    ctx = client_context(settings.tls)
                except TlsError as exc:
                    raise TlsError(f"bridges.mqtt.{name}.tls.{exc.key}", exc.reason) from None
                sni = server_hostname(settings.tls, settings.host)
            dialer = AsyncioDialer(settings.host, settings.port, ctx, sni)
            self.dialers.append(dialer)
            gate = session_store.committer if session_store is not None else None
            bridge = Bridge(settings, node, self.store, dialer, gate=gate)
            self.bridges[name] = bridge
            if wanted(settings.tls):
                revocation = LinkRevocation(
                    f"bridge {name}", link_guard_settings(settings.tls, self.config.crl_cache),
                    incr=node.metrics.incr)
                revocation.start(asyncio.get_running_loop())
                self.revocations.append(revocation)
                dialer.check = link_check(revocation, bridge.client)
        if self.store is None and self.bridges:
            log.warning(
                "durability disabled: bridge outboxes are kept in memory only "
                "(a restart loses what is queued)"
            )
        if self.store is not None:
            for name, n in self.store.bridges().items():
                if name not in self.bridges:
                    log.warning(
                        "bridge %s is not configured (or disabled) but its outbox holds %d "
                        "messages; they are kept until it comes back",
                        name, n,
                    )
        for bridge in self.bridges.values():
            bridge.start()
            log.info(
                "bridge %s: forwarding %d rules to %s, %d subscriptions",
                bridge.name, len(bridge.settings.forwards), bridge.settings.upstream,
                len(bridge.settings.subscriptions),
            )

    async def stop(self) -> None:
        """Stop forwarding, DISCONNECT from every upstream (sessions stay there), and
        wait a little for the sockets to close."""
        for bridge in self.bridges.values():
            bridge.stop()
        for revocation in self.revocations:
            revocation.close()
        for dialer in self.dialers:
            await dialer.wait_closed(STOP_TIMEOUT)

    def view(self) -> dict[str, Any]:
        bridges = [b.view() for b in self.bridges.values()]
        return {
            "enabled": bool(bridges),
            "status": "running" if bridges else "not configured",
            "bridges": bridges,
        }
