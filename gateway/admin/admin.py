"""The operations side of one running gateway: management API, Prometheus, ``$SYS``
topics, live trace, alarms and the open-file limit check.

:class:`Admin` is created by :class:`gateway.app.Gateway` (a
:class:`~gateway.admin.host.GatewayHost`) at the start of ``start()``
(raising the open-file limit before any listener opens) and started at its end, when
the core and the listeners exist; it is stopped first in ``stop()``. It reads the core
through :mod:`gateway.admin.introspect` and changes it only through the node's own
methods (kick, discard a session, delete a retained message).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import time
from typing import Any

from gateway.admin import introspect
from gateway.admin.alarms import Alarms
from gateway.admin.api import ManagementApi
from gateway.admin.appliance import image_info
from gateway.admin.host import GatewayHost
from gateway.admin.limits import (
    configured_max_connections,
    follow_file_limit,
    raise_nofile_limit,
)
from gateway.admin.prometheus import BASELINE_COUNTERS, make_registry
from gateway.admin.registry import ListenerEntry
from gateway.admin.stats import SAMPLE_INTERVAL, StatsTracker
from gateway.admin.stores import NOT_CONFIGURED, BannedAdapter, UsersAdapter
from gateway.admin.sys_topics import SysPublisher, sysdescr
from gateway.admin.tokens import ensure_token
from gateway.admin.trace import TraceHub
from gateway.config.schema import parse_bind
from gateway.core.node import Node
from gateway.version import version as installed_version
from protocols.mqtt.reason_codes import ReasonCode

log = logging.getLogger("gateway.admin")

FRONT_ENDS = ("mqtt", "mqttsn", "coap", "lwm2m")
ROLE = "standalone"  # until gateway.cluster exists: "core" or "replicant"


class Admin:
    def __init__(self, gateway: GatewayHost) -> None:
        self.gateway = gateway
        self.config = gateway.config
        self.node_name = self.config.node.name
        self.version = installed_version()
        self.started_at = time.time()
        self._started_mono = time.monotonic()
        self.alarms = Alarms()
        self.salvage_reports: list[dict[str, Any]] = []  # stores salvaged at start
        self.max_connections = configured_max_connections(self.config)
        self.nofile = raise_nofile_limit(self.max_connections)
        follow_file_limit(self.config, self.nofile.soft)  # listeners left at the default
        if not self.nofile.ok:
            self.alarms.activate(
                "nofile_limit",
                f"open-file limit {self.nofile.soft} is below the configured maximum "
                f"connections {self.max_connections} (+ reserve)",
                self.nofile.as_dict(),
            )
        # the users and bans: the node's data_dir, shared by the workers of a node
        data_dir = gateway.shared_dir
        self.users = UsersAdapter(data_dir)
        self.banned = BannedAdapter(data_dir)
        self.api: ManagementApi | None = None
        self.sys: SysPublisher | None = None
        self.tracker: StatsTracker | None = None
        self.trace_hub: TraceHub | None = None
        self._sampler: asyncio.TimerHandle | None = None
        self.prometheus_registry = make_registry(self.prometheus_snapshot)

    @property
    def node(self) -> Node:
        node = self.gateway.node
        assert node is not None, "the gateway has not started"
        return node

    # -- life cycle --------------------------------------------------------------------

    async def start(self) -> None:
        node = self.node
        loop = asyncio.get_running_loop()
        self.tracker = StatsTracker(node, time.monotonic)
        self.tracker.attach()
        self._sample()
        self.trace_hub = TraceHub(node.hooks, node.now)
        self.sys = SysPublisher(
            node,
            self.config.sys_topics,
            version=self.version,
            started_at=self.started_at,
            stats=self.stats,
            sockport=self._sockport,
        )
        self.sys.start()
        self.alarms.listeners.append(self.sys.alarm)
        api = self.config.api
        if api.enable:
            await self._start_api(loop)

    async def _start_api(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the API; a failure is an error and an alarm, not a reason to stop
        serving MQTT (the broker matters more than its management port)."""
        api = self.config.api
        try:
            token = await loop.run_in_executor(None, ensure_token, self.config)
            server = ManagementApi(self, token)
            await server.start(api.host, api.port)
        except OSError as exc:
            why = exc.strerror or str(exc)
            log.error("management API not started on %s: %s", api.bind, why)
            self.alarms.activate("api_unavailable", f"management API not started on "
                                 f"{api.bind}: {why}", {"bind": api.bind})
            return
        self.api = server
        log.info("management API on %s", ", ".join(server.addresses))

    async def stop(self) -> None:
        if self.trace_hub is not None:
            self.trace_hub.close_all()
        if self.api is not None:
            await self.api.stop()
            self.api = None
        if self.sys is not None:
            with contextlib.suppress(ValueError):
                self.alarms.listeners.remove(self.sys.alarm)
            self.sys.stop()
            self.sys = None
        if self.tracker is not None:
            self.tracker.detach()
        if self._sampler is not None:
            self._sampler.cancel()
            self._sampler = None

    def _sample(self) -> None:
        if self.tracker is not None:
            self.tracker.sample()
        self._sampler = asyncio.get_running_loop().call_later(SAMPLE_INTERVAL, self._sample)

    def _sockport(self, listener_id: str) -> int | None:
        entry = self.listener_entries().get(listener_id)
        if entry is None:
            return None
        for addr in entry.addresses:
            port = addr.rpartition(":")[2]
            if port.isdigit():
                return int(port)
        try:
            return parse_bind(entry.bind)[1]
        except ValueError:
            return None

    # -- views -------------------------------------------------------------------------

    @property
    def uptime(self) -> float:
        return time.monotonic() - self._started_mono

    def listener_entries(self) -> dict[str, ListenerEntry]:
        entries: dict[str, ListenerEntry] = getattr(self.gateway, "listeners", {})
        return entries

    def stats(self) -> dict[str, int]:
        if self.tracker is None:
            return {k: v for k, v in self.node.stats().items() if isinstance(v, int)}
        return self.tracker.stats()

    def metrics(self) -> dict[str, int]:
        """Every counter, the usual ones at 0 before their first event."""
        counters = dict.fromkeys(BASELINE_COUNTERS, 0)
        counters.update(self.node.metrics.snapshot())
        return dict(sorted(counters.items()))

    def node_view(self) -> dict[str, Any]:
        return {
            "node": self.node_name,
            "node_status": "running",
            "version": self.version,
            "role": ROLE,
            "uptime": round(self.uptime, 3),
            "started_at": self.started_at,
            "sysdescr": sysdescr(),
            "pid": os.getpid(),
            "python": platform.python_version(),
            "connections": self.node.connections,
            "memory_rss": _rss_bytes(),
            "load": _loadavg(),
            "open_fds": _open_fds(),
            "max_fds": self.nofile.soft,
            "data_dir": str(self.config.node.data_dir),
        }

    def listener_view(self, entry: ListenerEntry, status: str = "running") -> dict[str, Any]:
        return {
            "id": entry.id,
            "type": entry.type,
            "name": entry.name,
            "protocol": entry.protocol,
            "bind": entry.bind,
            "addresses": list(entry.addresses),
            "status": status,
            "current_connections": entry.current_connections,
            "max_connections": entry.max_connections,
            "refused_connections": entry.refused_connections,
        }

    def listeners_view(self) -> list[dict[str, Any]]:
        """Registered listeners, plus configured ones that are disabled (or that no
        front-end registered: status ``unknown``)."""
        registered = self.listener_entries()
        out = [self.listener_view(e) for e in registered.values()]
        listeners = self.config.listeners
        for kind in type(listeners).model_fields:
            table = getattr(listeners, kind)
            if not isinstance(table, dict):
                continue
            for name, conf in table.items():
                if f"{kind}:{name}" in registered:
                    continue
                entry = ListenerEntry(kind, name, "mqtt", str(getattr(conf, "bind", "")))
                view = self.listener_view(
                    entry, "disabled" if not getattr(conf, "enable", True) else "unknown"
                )
                view["max_connections"] = int(getattr(conf, "max_connections", 0) or 0)
                out.append(view)
        out.sort(key=lambda v: v["id"])
        return out

    def gateways_view(self) -> list[dict[str, Any]]:
        """The protocol front-ends, EMQX ``/gateways``-style."""
        counts = introspect.protocol_counts(self.node)
        counts["mqtt"] = counts.get("mqtt", 0) + counts.pop("ws", 0)
        entries = list(self.listener_entries().values())
        out = []
        for name in FRONT_ENDS:
            ids = sorted(e.id for e in entries if e.protocol == name)
            out.append(
                {
                    "name": name,
                    "status": "running" if ids else NOT_CONFIGURED,
                    "listeners": ids,
                    "current_connections": counts.get(name, 0),
                }
            )
        return out

    def cluster_view(self) -> dict[str, Any]:
        """The cluster (gateway.cluster's view), or this node alone when it is off."""
        cluster = self.gateway.cluster
        if cluster is not None:
            view: dict[str, Any] = cluster.view(self.node.connections)
            return view
        return {
            "enabled": False,
            "status": NOT_CONFIGURED,
            "name": None,
            "role": ROLE,
            "self": self.node_name,
            "members": [
                {
                    "node": self.node_name,
                    "status": "running",
                    "role": ROLE,
                    "version": self.version,
                    "self": True,
                    "connections": self.node.connections,
                }
            ],
        }

    def bridges_view(self) -> dict[str, Any]:
        """Upstream bridges (gateway.bridge's view): each is ``{name, type, upstream,
        status, connected, queue_len, queue_bytes, oldest_age, inflight, forwarded,
        received, dropped, rates, last_error, ...}``; none configured: ``enabled`` false."""
        bridges = getattr(self.gateway, "bridges", None)
        if bridges is not None:
            view: dict[str, Any] = bridges.view()
            return view
        return {"enabled": False, "status": NOT_CONFIGURED, "bridges": []}

    def connectors_view(self) -> list[dict[str, Any]]:
        """The data-integration sinks' health and buffers (gateway.rules.sinks)."""
        rules = getattr(self.gateway, "rules", None)
        return rules.connectors_view() if rules is not None else []

    def status(self) -> dict[str, Any]:
        node = self.node
        stats = self.stats()
        rates = self.tracker.rates() if self.tracker is not None else {}
        by_protocol = introspect.protocol_counts(node)
        durability = self.config.durability.enable
        return {
            "node": self.node_name,
            "version": self.version,
            "status": "running",
            "role": ROLE,
            "uptime": round(self.uptime, 3),
            "started_at": self.started_at,
            "cluster": self.cluster_view(),
            "listeners": self.listeners_view(),
            "gateways": self.gateways_view(),
            "connections": {"count": node.connections, "by_protocol": by_protocol},
            "sessions": stats.get("sessions.count", len(node.sessions)),
            "subscriptions": stats.get("subscriptions.count", 0),
            "topics": stats.get("topics.count", 0),
            "retained": stats.get("retained.count", 0),
            "stats": stats,
            "rates": rates,
            "bridges": self.bridges_view(),
            "connectors": self.connectors_view(),
            "alarms": [a.as_dict() for a in self.alarms.active()],
            "limits": {"max_connections": self.max_connections, "nofile": self.nofile.as_dict()},
            "durability": {
                "enabled": durability,
                "path": str(self.config.node.data_dir) if durability else None,
            },
            "store": self.store_view(),
            "image": image_info(),
            "fleet_shipper": self.shipper_view(),
        }

    def shipper_view(self) -> dict[str, Any] | None:
        """``gateway-fleet ship``'s state (its status file plus the spool now), None when
        ``[fleet.shipper]`` is off; past ``spool_alarm`` the ``fleet_spool_high`` alarm."""
        from gateway.fleet import shipper  # lazy: the archiver's package, not the admin's

        try:
            view = shipper.view(self.config)
        except OSError:
            return None
        if view is not None and view["spool_alarm"]:
            self.alarms.activate(
                "fleet_spool_high",
                f"fleet spool holds {view['pending_bytes']:,} bytes unshipped (alarm at "
                f"{view['spool_alarm_bytes']:,}, max {view['spool_max']:,})",
                {"pending_bytes": view["pending_bytes"], "last_success": view["last_success"]},
            )
        elif view is not None:
            self.alarms.deactivate("fleet_spool_high")
        return view

    def store_view(self) -> dict[str, Any] | None:
        """The store's space and health (gateway.store.space), None without durability."""
        guard = getattr(self.gateway, "store_guard", None)
        if guard is None:
            return None
        view: dict[str, Any] = guard.view()
        view["salvaged"] = self.salvage_reports
        return view

    def status_line(self) -> str:
        """One line for systemd's STATUS=: connections per listener, sessions."""
        node = self.node
        parts = [f"{e.id} {e.current_connections}" for e in self.listener_entries().values()]
        listeners = f" ({', '.join(parts)})" if parts else ""
        alarms = f"; {len(self.alarms)} alarm(s)" if len(self.alarms) else ""
        return (f"{node.connections} connections{listeners}; {len(node.sessions)} sessions"
                f"{alarms}")

    def prometheus_snapshot(self) -> dict[str, Any]:
        node = self.gateway.node
        listeners = [self.listener_view(e) for e in self.listener_entries().values()]
        return {
            "node": self.node_name,
            "version": self.version,
            "uptime": self.uptime,
            "stats": self.stats() if node is not None else {},
            "counters": node.metrics.snapshot() if node is not None else {},
            "listeners": listeners,
            "protocols": introspect.protocol_counts(node) if node is not None else {},
            "alarms": len(self.alarms),
            "rates": self.tracker.rates() if self.tracker is not None else {},
            "nofile": self.nofile.as_dict(),
            "bridges": self.bridges_view()["bridges"],
            "cluster": self.cluster_view() if node is not None else None,
            "alarm_names": [a.name for a in self.alarms.active()],
            "store": self.store_view(),
            "fleet_shipper": self.shipper_view(),
        }

    # -- actions -----------------------------------------------------------------------

    def kick(self, clientid: str, *, will: bool = True, discard: bool = False) -> str | None:
        """Disconnect a client with 0x98 (administrative action). Its will goes unless
        ``will`` is False (MQTT: only a client's DISCONNECT 0x00 removes a will); its
        session stays for its expiry interval unless ``discard``. An offline session is
        ended only with ``discard``. Returns None (no such client), ``"offline"``,
        ``"kicked"`` or ``"discarded"``."""
        node = self.node
        session = node.sessions.get(clientid)
        if session is None:
            return None
        handle, info = session.handle, session.info
        if handle is None or info is None:
            if not discard:
                return "offline"
            node.discard_session(clientid, send_will=will)
            log.info("admin discarded the session of %s", clientid)
            return "discarded"
        info.set_attr("disconnect_reason", "kicked")
        node.close(info, handle, send_will=will, expiry_interval=0 if discard else None)
        handle.kick(ReasonCode.ADMINISTRATIVE_ACTION)
        log.info("admin kicked %s%s", clientid, " and discarded its session" if discard else "")
        return "kicked"


def _rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _open_fds() -> int | None:
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return None


__all__ = ["Admin"]
