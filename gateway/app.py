"""Assemble a node from its configuration and run it until SIGINT/SIGTERM.

SIGHUP reloads what can change under a running node without dropping connections: the
TLS certificates of the ssl listeners and the keys and certificates of the DTLS listeners
(new handshakes use the new files) and the authorization rules file. A reload that fails
logs an error and keeps what was in force.

This is the only place that knows both the configuration schema and the constructors of
the core, the channels and the listeners.

As worker ``I`` of a multi-worker node (``gatewayd --worker I``, started by
:mod:`gateway.workers.supervisor`; docs/workers.md) the same gateway opens its stream
listeners with ``SO_REUSEPORT``, opens them only once its cluster links to the sibling
workers are up, runs the datagram front-ends and the bridges' subscriptions in worker 0
only, and reads the users and bans from the node's own ``data_dir``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sqlite3
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gateway.admin.admin import Admin
from gateway.admin.registry import ListenerEntry
from gateway.admin.sdnotify import SystemdIntegration
from gateway.auth.setup import AuthServices, install_auth
from gateway.bridge import Bridges
from gateway.cluster import Cluster
from gateway.cluster import from_config as cluster_from_config
from gateway.config import ConfigError, GatewayConfig
from gateway.config.schema import DtlsListener, UdpListener, WsListener, WssListener
from gateway.core.authz import Authorizer, from_config
from gateway.core.clock import LoopScheduler
from gateway.core.node import CoreSettings, Node
from gateway.fleet.archiver import Archiver, settings_from_config
from gateway.net.datagram import DatagramPeer, DatagramShell, start_datagram_listener
from gateway.net.dtls import (
    DtlsChannel,
    DtlsError,
    DtlsServer,
    IdentityBoundContext,
    bind_identity,
)
from gateway.net.stream import ListenerLimits, StreamShell, start_stream_listener
from gateway.net.tls import ReloadableContext, TlsError, describe, peer_identity
from gateway.net.websocket import WebSocketChannel, WebSocketSettings
from gateway.protect.banned import BanGuard
from gateway.protect.flapping import FlappingDetector, FlappingSettings
from gateway.rules.service import RulesService, start_rules
from gateway.store import startup as store_startup
from gateway.store.banned import BannedStore
from gateway.store.db import db_path, ensure_schema, open_db
from gateway.store.faults import classify
from gateway.store.lwm2m import Lwm2mStore
from gateway.store.sessions import SCHEMA, SessionStore
from gateway.store.space import StoreGuard
from gateway.store.writer import GroupCommitter
from gateway.workers.plan import node_data_dir
from protocols.coap.channel import CoapChannel, CoapSettings
from protocols.context import ConnectionHandle
from protocols.lwm2m.bootstrap import BootstrapPlan
from protocols.lwm2m.channel import Lwm2mChannel, Lwm2mSettings
from protocols.lwm2m.objects import ObjectModel
from protocols.lwm2m.registry import Registry
from protocols.mqtt.channel import MqttChannel, MqttSettings
from protocols.mqttsn.channel import MqttSnChannel, MqttSnSettings
from protocols.mqttsn.codec import encode as mqttsn_encode
from protocols.mqttsn.packets import Advertise

log = logging.getLogger("gateway")

LWM2M_SWEEP = 60.0  # seconds between sweeps of expired LwM2M registrations


def core_settings(config: GatewayConfig) -> CoreSettings:
    m = config.mqtt
    r = config.retainer
    return CoreSettings(
        node_name=config.node.name,
        max_mqueue_len=m.max_mqueue_len,
        mqueue_store_qos0=m.mqueue_store_qos0,
        mqueue_overflow=m.mqueue_overflow,
        shared_subscription_strategy=m.shared_subscription_strategy,
        upgrade_qos=m.upgrade_qos,
        ignore_loop_deliver=m.ignore_loop_deliver,
        allow_anonymous=config.authentication.allow_anonymous,
        retainer_enable=r.enable,
        max_retained_messages=r.max_retained_messages,
        max_retained_payload_size=r.max_payload_size,
        authz_cache_ttl=(
            config.authorization.cache.ttl if config.authorization.cache.enable else 0.0
        ),
        authz_cache_max=config.authorization.cache.max_size,
    )


def mqtt_settings(config: GatewayConfig, listener: str, mountpoint: str) -> MqttSettings:
    m = config.mqtt
    return MqttSettings(
        max_packet_size=m.max_packet_size,
        max_clientid_len=m.max_clientid_len,
        max_topic_levels=m.max_topic_levels,
        max_topic_alias=m.max_topic_alias,
        max_qos_allowed=m.max_qos_allowed,
        retain_available=m.retain_available,
        wildcard_subscription=m.wildcard_subscription,
        shared_subscription=m.shared_subscription,
        idle_timeout=m.idle_timeout,
        keepalive_multiplier=m.keepalive_multiplier,
        server_keepalive=m.server_keepalive,
        max_keepalive=m.max_keepalive,
        session_expiry_interval=int(m.session_expiry_interval),
        max_session_expiry_interval=int(m.max_session_expiry_interval),
        max_inflight=m.max_inflight,
        max_awaiting_rel=m.max_awaiting_rel,
        await_rel_timeout=m.await_rel_timeout,
        max_subscriptions=m.max_subscriptions,
        messages_rate=_listener_override(config, listener, "messages_rate", m.messages_rate),
        bytes_rate=_listener_override(config, listener, "bytes_rate", m.bytes_rate),
        packet_timeout=m.packet_timeout,
        response_information=m.response_information,
        deny_action_disconnect=config.authorization.deny_action == "disconnect",
        subscribe_deny_code=(
            0x87 if config.authorization.subscribe_deny_reason == "not_authorized" else 0x80
        ),
        mountpoint=mountpoint,
        listener=listener,
    )


def _listener_override(config: GatewayConfig, listener: str, key: str, default: float) -> float:
    """A per-client limit of listener ``"kind:name"``, or ``default`` when it has none."""
    kind, _, name = listener.partition(":")
    table = getattr(config.listeners, kind, None)
    value = getattr(table.get(name), key, None) if isinstance(table, dict) else None
    return default if value is None else float(value)


def build_authorizer(config: GatewayConfig) -> Authorizer:
    from gateway.config.loader import load_rules_file

    a = config.authorization
    rules = list(a.rules)
    if a.rules_file is not None:
        rules.extend(load_rules_file(a.rules_file))
    return Authorizer(from_config(rules), a.no_match)


class Gateway:
    """A running node: the core plus its listeners."""

    def __init__(self, config: GatewayConfig, worker: int | None = None) -> None:
        self.config = config
        # worker index of a multi-worker node (docs/workers.md), None for a single process:
        # workers share the stream listeners' ports (SO_REUSEPORT); datagram listeners run
        # in worker 0 only (a UDP peer needs one home), bridge subscriptions too (each
        # worker forwards its own clients' publishes: see egress_only)
        self.worker = worker
        self.primary = worker is None or worker == 0
        self._stream_options: dict[str, Any] = {"reuse_port": True} if worker is not None else {}
        # where the users and banned clients are: shared by the workers of a node
        self.shared_dir = node_data_dir(config.node.data_dir, worker)
        self.node: Node | None = None
        self.committer: GroupCommitter | None = None
        self.store_guard: StoreGuard | None = None  # space, write errors (gateway.store.space)
        self.archiver: Archiver | None = None
        self.bans: BanGuard | None = None
        self.flapping: FlappingDetector | None = None
        self.admin: Admin | None = None
        # listener id ("tcp:default") -> what it is; whoever opens a listener registers
        # it here so the management API, Prometheus and systemd STATUS see it
        self.listeners: dict[str, ListenerEntry] = {}
        self.auth: AuthServices | None = None
        self.servers: list[asyncio.Server] = []
        self.tls: dict[str, ReloadableContext] = {}
        self.dtls: dict[str, DtlsServer] = {}  # DTLS listener id -> its reloadable keys
        self.datagrams: list[DatagramShell] = []  # MQTT-SN (UDP) listeners
        self.lwm2m_sweeper: asyncio.TimerHandle | None = None
        self.advertisers: list[asyncio.TimerHandle] = []  # ssl listener name -> its contexts
        self.stopped = asyncio.Event()
        self.cluster: Cluster | None = None  # gateway.cluster, when [cluster] is enabled
        self.bridges: Bridges | None = None  # gateway.bridge, when [bridges.mqtt.*] exist
        self.rules: RulesService | None = None  # gateway.rules: rule engine and webhooks

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        config = self.config
        self.admin = Admin(self)  # first: raises the open-file limit, checks it
        store = self._open_store(loop)
        self.node = node = Node(
            core_settings(config),
            LoopScheduler(loop),
            authorizer=build_authorizer(config),
            store=store,
        )
        if store is not None:
            node.restore(*store.load())
            assert self.committer is not None
            self.store_guard = store_startup.guard(config, self.committer, node,
                                                  self.admin.alarms)
        self._start_protection(node)
        self.auth = install_auth(node, config, loop, data_dir=self.shared_dir)
        self.cluster = cluster_from_config(config, node, self.committer, self.admin.version)
        if self.cluster is not None:  # before the listeners: publishes are forwarded
            await self.cluster.start()
            if self.worker is not None:
                await self._await_siblings(self.cluster)
        if config.fleet.archiver.enable:
            self.archiver = Archiver(
                settings_from_config(config), node.scheduler, metrics=node.metrics
            )
            self.archiver.attach(node.hooks)
            log.info("fleet archiver writing to %s", self.archiver.settings.root)
        # before the listeners: forwards see the first publishes
        bridging = config if self.primary else egress_only(config, self.worker)
        if bridging.bridges.mqtt:
            self.bridges = Bridges(node, bridging)
            self.bridges.start()
        self.rules = await start_rules(self)  # before the listeners: rules see every event
        gate = self.committer
        monotonic = loop.time
        for name, lst in config.listeners.tcp.items():
            if not lst.enable:
                continue
            settings = mqtt_settings(config, f"tcp:{name}", lst.mountpoint)
            limits = ListenerLimits(
                f"tcp:{name}",
                max_connections=lst.max_connections,
                max_conn_rate=lst.max_conn_rate,
                send_timeout=lst.send_timeout,
                max_send_buffer=lst.max_send_buffer,
                allow=[str(n) for n in lst.allow],
                deny=[str(n) for n in lst.deny],
            )
            factory = _mqtt_factory(node, settings, monotonic)
            server = await start_stream_listener(
                lst.bind, limits, factory, gate, **self._stream_options
            )
            self.servers.append(server)
            addrs = ", ".join(_fmt(s.getsockname()) for s in server.sockets)
            log.info("listener tcp:%s (MQTT) on %s", name, addrs)
            self.listeners[limits.name] = ListenerEntry(
                "tcp", name, "mqtt", lst.bind, limits, addrs.split(", ")
            )
        for name, ssl_lst in config.listeners.ssl.items():
            if not ssl_lst.enable:
                continue
            tls = self.tls[f"ssl:{name}"] = ReloadableContext(f"ssl:{name}", ssl_lst)
            settings = mqtt_settings(config, f"ssl:{name}", ssl_lst.mountpoint)
            settings.peer_cert_as_clientid = ssl_lst.peer_cert_as_clientid
            settings.peer_cert_as_username = ssl_lst.peer_cert_as_username
            settings.peer_cert_authenticates = ssl_lst.peer_cert_authenticates
            limits = ListenerLimits(
                f"ssl:{name}",
                max_connections=ssl_lst.max_connections,
                max_conn_rate=ssl_lst.max_conn_rate,
                send_timeout=ssl_lst.send_timeout,
                max_send_buffer=ssl_lst.max_send_buffer,
                allow=[str(n) for n in ssl_lst.allow],
                deny=[str(n) for n in ssl_lst.deny],
            )
            server = await start_stream_listener(
                ssl_lst.bind,
                limits,
                _mqtts_factory(node, settings, monotonic),
                gate,
                ssl=tls.server_context,
                ssl_handshake_timeout=config.mqtt.idle_timeout,
                **self._stream_options,
            )
            self.servers.append(server)
            addrs = ", ".join(_fmt(s.getsockname()) for s in server.sockets)
            log.info("listener ssl:%s (MQTT over TLS) on %s: %s", name, addrs, describe(ssl_lst))
            self.listeners[limits.name] = ListenerEntry(
                "ssl", name, "mqtt", ssl_lst.bind, limits, addrs.split(", ")
            )
        await self._start_websocket_listeners(node, gate, monotonic)
        if self.primary:
            await self._start_mqttsn(node, gate, monotonic)
            await self._start_coap(node, gate, monotonic)
            await self._start_lwm2m(node, gate, monotonic)
        await self.admin.start()  # API, $SYS, trace: once the core and listeners exist

    async def _await_siblings(self, cluster: Cluster) -> None:
        """A worker opens its listeners once its links to every sibling are up (their
        routes and sessions known, so a client it accepts can take its session over), or
        after twice ``cluster.connect_timeout`` (a sibling that is down or restarting)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 2 * self.config.cluster.connect_timeout
        while loop.time() < deadline:
            if all(p.state == "up" for p in cluster.peers.values()):
                return
            await asyncio.sleep(0.05)  # bounded poll of the link states
        down = sorted(n for n, p in cluster.peers.items() if p.state != "up")
        log.warning("opening the listeners before the links to %s are up", ", ".join(down))

    def reload(self) -> None:
        """SIGHUP: re-read the ssl listeners' certificates and the authorization rules
        file. Established connections are untouched; failures keep the previous state."""
        for tls in self.tls.values():
            tls.reload()
        for dtls in self.dtls.values():
            dtls.reload()
        if self.node is None:
            return
        rules_file = self.config.authorization.rules_file
        try:
            self.node.authorizer = authorizer = build_authorizer(self.config)
        except ConfigError as exc:
            log.error("authorization rules not reloaded, keeping the previous ones: %s", exc)
            return
        log.info(
            "authorization reloaded: %d rules%s",
            len(authorizer.rules),
            f" (inline and {rules_file})" if rules_file is not None else "",
        )

    def _start_protection(self, node: Node) -> None:
        """Banned clients (from ``gateway.db`` whether or not durability is on, so that
        ``gatewayctl ban`` works; memory only if the file cannot be opened) and flapping
        detection."""
        path = db_path(self.shared_dir)
        try:
            bans: BannedStore | None = BannedStore.open(path, now=node.scheduler.time)
        except (OSError, sqlite3.Error) as exc:
            log.error("banned clients kept in memory only: cannot open %s: %s", path, exc)
            bans = None
        self.bans = BanGuard(node, bans)
        self.bans.attach()
        if len(self.bans.index):
            log.info("%d banned clients", len(self.bans.index))
        fd = self.config.flapping_detect
        if fd.enable:
            settings = FlappingSettings(fd.max_count, fd.window_time, fd.ban_time)
            self.flapping = FlappingDetector(node, self.bans, settings)
            self.flapping.attach()

    async def _start_websocket_listeners(
        self, node: Node, gate: GroupCommitter | None, monotonic: Callable[[], float]
    ) -> None:
        """``[listeners.ws.<name>]`` and ``[listeners.wss.<name>]``: MQTT over WebSocket on
        the stream shell (wss with the ssl listeners' TLS contexts, reloaded by SIGHUP)."""
        config = self.config
        kinds: list[tuple[str, dict[str, WsListener] | dict[str, WssListener]]] = [
            ("ws", config.listeners.ws),
            ("wss", config.listeners.wss),
        ]
        for kind, table in kinds:
            for name, lst in table.items():
                if not lst.enable:
                    continue
                lname = f"{kind}:{name}"
                settings = mqtt_settings(config, lname, lst.mountpoint)
                limits = ListenerLimits(
                    lname,
                    max_connections=lst.max_connections,
                    max_conn_rate=lst.max_conn_rate,
                    send_timeout=lst.send_timeout,
                    max_send_buffer=lst.max_send_buffer,
                    allow=[str(n) for n in lst.allow],
                    deny=[str(n) for n in lst.deny],
                )
                factory = _ws_factory(node, settings, websocket_settings(lst), monotonic)
                extra: dict[str, object] = {}
                if isinstance(lst, WssListener):
                    tls = self.tls[lname] = ReloadableContext(lname, lst)
                    extra = {
                        "ssl": tls.server_context,
                        "ssl_handshake_timeout": config.mqtt.idle_timeout,
                    }
                server = await start_stream_listener(
                    lst.bind, limits, factory, gate, **extra, **self._stream_options
                )
                self.servers.append(server)
                addrs = ", ".join(_fmt(s.getsockname()) for s in server.sockets)
                log.info(
                    "listener %s (MQTT over WebSocket%s) on %s, path %s",
                    lname, " and TLS" if extra else "", addrs, lst.websocket.mqtt_path,
                )
                self.listeners[lname] = ListenerEntry(
                    kind, name, "mqtt", lst.bind, limits, addrs.split(", ")
                )

    async def _start_mqttsn(
        self, node: Node, gate: GroupCommitter | None, monotonic: Callable[[], float]
    ) -> None:
        """``[gateway.mqttsn]``: MQTT-SN 1.2 on the datagram shell, one per UDP listener;
        ADVERTISE every ``advertise_interval`` when ``broadcast``."""
        sn = self.config.gateway.mqttsn
        if sn is None or not sn.enable:
            return
        loop = asyncio.get_running_loop()
        for name, lst in sn.listeners.udp.items():
            if not lst.enable:
                continue
            lname = f"mqttsn:udp:{name}"
            settings = mqttsn_settings(self.config, lname)
            limits = ListenerLimits(
                lname,
                max_connections=lst.max_connections,
                allow=[str(n) for n in lst.allow],
                deny=[str(n) for n in lst.deny],
            )
            shell = await start_datagram_listener(
                lst.bind, limits, _mqttsn_factory(node, settings, monotonic), gate,
                allow_broadcast=sn.broadcast,
            )
            self.datagrams.append(shell)
            assert shell.transport is not None
            local = shell.transport.get_extra_info("sockname")
            log.info("listener %s (MQTT-SN 1.2, gateway id %d) on %s",
                     lname, sn.gateway_id, _fmt(local))
            self.listeners[lname] = ListenerEntry(
                "udp", name, "mqttsn", lst.bind, limits, [_fmt(local)]
            )
            if sn.broadcast:
                target = (sn.broadcast_address, sn.broadcast_port or local[1])
                advertise = mqttsn_encode(
                    Advertise(sn.gateway_id, min(0xFFFF, int(sn.advertise_interval)))
                )
                self._advertise(loop, shell, advertise, target, sn.advertise_interval)

    async def _start_coap(
        self, node: Node, gate: GroupCommitter | None, monotonic: Callable[[], float]
    ) -> None:
        """``[gateway.coap]``: CoAP on the datagram shell, one per UDP listener."""
        coap = self.config.gateway.coap
        if coap is None or not coap.enable:
            return
        for name, lst in coap.listeners.udp.items():
            if not lst.enable:
                continue
            lname = f"coap:udp:{name}"
            settings = coap_settings(self.config, lname)
            limits = ListenerLimits(
                lname,
                max_connections=lst.max_connections,
                allow=[str(n) for n in lst.allow],
                deny=[str(n) for n in lst.deny],
            )
            shell = await start_datagram_listener(
                lst.bind, limits, _coap_factory(node, settings, monotonic), gate
            )
            self.datagrams.append(shell)
            assert shell.transport is not None
            local = shell.transport.get_extra_info("sockname")
            log.info("listener %s (CoAP) on %s", lname, _fmt(local))
            self.listeners[lname] = ListenerEntry(
                "udp", name, "coap", lst.bind, limits, [_fmt(local)]
            )
        for name, dl in coap.listeners.dtls.items():
            if not dl.enable:
                continue
            lname = f"coap:dtls:{name}"
            settings = coap_settings(self.config, lname)
            try:
                server = self.dtls[lname] = DtlsServer.from_listener(lname, dl)
            except DtlsError as exc:
                raise ConfigError(exc.where(f"gateway.coap.listeners.dtls.{name}")) from exc
            limits = ListenerLimits(
                lname,
                max_connections=dl.max_connections,
                allow=[str(n) for n in dl.allow],
                deny=[str(n) for n in dl.deny],
            )
            shell = await start_datagram_listener(
                dl.bind, limits,
                _dtls_factory(server, dl.handshake_timeout,
                              _coap_inner(node, settings, monotonic, dl)),
                gate,
            )
            self.datagrams.append(shell)
            assert shell.transport is not None
            local = shell.transport.get_extra_info("sockname")
            log.info("listener %s (CoAP over DTLS) on %s: %s", lname, _fmt(local),
                     server.current.description)
            self.listeners[lname] = ListenerEntry(
                "dtls", name, "coap", dl.bind, limits, [_fmt(local)]
            )

    async def _start_lwm2m(
        self, node: Node, gate: GroupCommitter | None, monotonic: Callable[[], float]
    ) -> None:
        """``[gateway.lwm2m]``: LwM2M on the datagram shell (UDP, and DTLS)."""
        cfg = self.config.gateway.lwm2m
        if cfg is None or not cfg.enable:
            return
        model = ObjectModel.shipped()
        if cfg.xml_dir:
            try:
                model.load_dir(cfg.xml_dir)
            except (OSError, ValueError) as exc:
                raise ConfigError(f"gateway.lwm2m.xml_dir: {exc}") from exc
        registry = self._lwm2m_registry(node)
        listeners: list[tuple[str, str, UdpListener, DtlsListener | None]] = [
            ("udp", n, lst, None) for n, lst in cfg.listeners.udp.items()
        ] + [("dtls", n, dl, dl) for n, dl in cfg.listeners.dtls.items()]
        for kind, name, lst, dl in listeners:
            if not lst.enable:
                continue
            lname = f"lwm2m:{kind}:{name}"
            settings = lwm2m_settings(self.config, lname, model)
            settings.registry = registry

            inner = _lwm2m_inner(node, settings, monotonic, dl)
            factory: Callable[[DatagramPeer, tuple[str, int]], Any]
            description = ""
            if dl is None:
                factory = inner
            else:
                try:
                    server = self.dtls[lname] = DtlsServer.from_listener(lname, dl)
                except DtlsError as exc:
                    raise ConfigError(exc.where(f"gateway.lwm2m.listeners.dtls.{name}")) from exc
                factory = _dtls_factory(server, dl.handshake_timeout, inner)
                description = f": {server.current.description}"
            limits = ListenerLimits(
                lname,
                max_connections=lst.max_connections,
                allow=[str(n) for n in lst.allow],
                deny=[str(n) for n in lst.deny],
            )
            shell = await start_datagram_listener(lst.bind, limits, factory, gate)
            self.datagrams.append(shell)
            assert shell.transport is not None
            local = shell.transport.get_extra_info("sockname")
            log.info("listener %s (LwM2M%s) on %s%s", lname,
                     " over DTLS" if dl is not None else "", _fmt(local), description)
            self.listeners[lname] = ListenerEntry(
                kind, name, "lwm2m", lst.bind, limits, [_fmt(local)]
            )

    def _lwm2m_registry(self, node: Node) -> Registry:
        """LwM2M registrations and unanswered commands, journaled in ``gateway.db`` when
        durability is on (they survive a restart), in memory otherwise."""
        store = node.store
        if store is None:
            registry = Registry()
        else:
            journal = Lwm2mStore(store.conn, store.committer)
            registry = Registry(journal)
            endpoints, commands = registry.restore(journal.load(), node.now())
            if endpoints:
                log.info("lwm2m: %d registrations restored, %d commands waiting",
                         endpoints, commands)
        self._sweep_lwm2m(node, registry)
        return registry

    def _sweep_lwm2m(self, node: Node, registry: Registry) -> None:
        """Every minute: forget registrations whose lifetime ended with no channel left
        to notice (the device never came back after a kick or a restart)."""
        n = registry.sweep(node.now())
        if n:
            log.info("lwm2m: %d registrations expired (their waiting commands dropped)", n)
        self.lwm2m_sweeper = asyncio.get_running_loop().call_later(
            LWM2M_SWEEP, self._sweep_lwm2m, node, registry
        )

    def _advertise(
        self,
        loop: asyncio.AbstractEventLoop,
        shell: DatagramShell,
        datagram: bytes,
        target: tuple[str, int],
        interval: float,
    ) -> None:
        """Send ADVERTISE now and every ``interval`` seconds while the shell is open."""
        if not shell.open:
            return
        try:
            shell.send_to([datagram], target)
        except OSError as exc:  # e.g. no route for the broadcast address
            log.warning("ADVERTISE to %s:%d failed: %s", target[0], target[1], exc)
        self.advertisers = [t for t in self.advertisers if not t.cancelled()]
        self.advertisers.append(
            loop.call_later(interval, self._advertise, loop, shell, datagram, target, interval)
        )

    def _open_store(self, loop: asyncio.AbstractEventLoop) -> SessionStore | None:
        # before anything opens gateway.db (bans and users too): reserves freed, checked,
        # salvaged if malformed (docs/storage.md); worker 0 checks the shared users file
        data_dir = Path(self.config.node.data_dir)
        dirs = [data_dir, Path(self.shared_dir)] if self.primary else [data_dir]
        store_startup.prepare(data_dir, dirs, self.config.durability.check_on_start,
                              self.admin)
        if not self.config.durability.enable:
            log.warning("durability disabled: sessions and retained messages are memory-only")
            return None
        path = db_path(self.config.node.data_dir)
        try:
            reader = open_db(path)
            ensure_schema(reader, SCHEMA)
        except sqlite3.DatabaseError as exc:  # malformed past what quick_check saw
            if classify(exc).kind != "corrupt":
                raise
            store_startup.check(path, self.admin, [str(exc)])
            reader = open_db(path)
            ensure_schema(reader, SCHEMA)
        writer = open_db(path, check_same_thread=False)
        self.committer = GroupCommitter(writer, loop)
        log.info("store %s", path)
        return SessionStore(reader, self.committer)

    async def stop(self) -> None:
        """Stop accepting, tell connected clients we are going (0x8B), settle their
        sessions and commit everything to disk."""
        if self.admin is not None:
            await self.admin.stop()
        for server in self.servers:
            server.close()
        node = self.node
        if node is not None:
            for session in list(node.sessions.values()):
                handle, info = session.handle, session.info
                if handle is not None and info is not None:
                    node.close(info, handle, send_will=False)
                    handle.kick(0x8B)  # SERVER_SHUTTING_DOWN
        for server in self.servers:
            await server.wait_closed()
        self.servers.clear()
        if self.lwm2m_sweeper is not None:
            self.lwm2m_sweeper.cancel()
        for timer in self.advertisers:
            timer.cancel()
        self.advertisers.clear()
        for shell in self.datagrams:  # after the kicks above: their DISCONNECTs are out
            shell.close()
        self.datagrams.clear()
        if self.archiver is not None:  # after the disconnects above, so they are archived
            self.archiver.detach()
            await asyncio.to_thread(self.archiver.close)
            self.archiver = None
        if self.cluster is not None:  # after the sessions settled, before the last commit
            await self.cluster.stop()
            self.cluster = None
        if self.rules is not None:  # queued events reach the webhook queues
            await self.rules.stop()
            self.rules = None
        if self.bridges is not None:  # DISCONNECT upstream; outbox deletes get committed
            await self.bridges.stop()
            self.bridges = None
        if self.store_guard is not None:
            self.store_guard.stop()
            self.store_guard = None
        if self.committer is not None:
            self.committer.close()
            self.committer = None
        if self.flapping is not None:
            self.flapping.detach()
            self.flapping = None
        if self.bans is not None:
            self.bans.detach()
            if self.bans.store is not None:
                self.bans.store.close()
            self.bans = None
        if self.auth is not None:
            await self.auth.close()
            self.auth = None


def egress_only(config: GatewayConfig, worker: int | None) -> GatewayConfig:
    """The bridges of worker ``worker`` (not 0) of a multi-worker node: forwards only.

    A bridge forwards what the ``message.publish`` hook sees, the publishes of this
    worker's own clients, so every worker runs the forward rules; messages from upstream
    (subscriptions) come in through worker 0 only, which publishes them to the node (the
    cluster takes them to the other workers), or they would arrive once per worker. A
    configured ``clientid`` gets ``-w<I>``; the default one contains the worker's name.
    """
    bridges = {}
    for name, b in config.bridges.mqtt.items():
        if b.forwards:
            clientid = f"{b.clientid}-w{worker}" if b.clientid else ""
            bridges[name] = b.model_copy(update={"subscriptions": [], "clientid": clientid})
    return config.model_copy(
        update={"bridges": config.bridges.model_copy(update={"mqtt": bridges})}
    )


def _fmt(addr: tuple[str, int] | tuple[str, int, int, int]) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _mqtt_factory(
    node: Node, settings: MqttSettings, monotonic: Callable[[], float]
) -> Callable[[StreamShell, tuple[str, int] | None], MqttChannel]:
    def make(shell: StreamShell, peer: tuple[str, int] | None) -> MqttChannel:
        return MqttChannel(node, settings, shell, peer=peer, monotonic=monotonic)

    return make


def _mqtts_factory(
    node: Node, settings: MqttSettings, monotonic: Callable[[], float]
) -> Callable[[StreamShell, tuple[str, int] | None], MqttChannel]:
    """Like :func:`_mqtt_factory`, handing the channel the client's TLS certificate."""

    def make(shell: StreamShell, peer: tuple[str, int] | None) -> MqttChannel:
        cert = peer_identity(shell.transport)
        return MqttChannel(node, settings, shell, peer=peer, monotonic=monotonic, peer_cert=cert)

    return make


def websocket_settings(lst: WsListener | WssListener) -> WebSocketSettings:
    w = lst.websocket
    return WebSocketSettings(
        path=w.mqtt_path,
        subprotocols=tuple(w.supported_subprotocols),
        fail_if_no_subprotocol=w.fail_if_no_subprotocol,
        check_origin=w.check_origin_enable,
        allow_origin_absence=w.allow_origin_absence,
        origins=tuple(w.check_origins),
        proxy_address_header=w.proxy_address_header,
        proxy_port_header=w.proxy_port_header,
        trusted_proxies=tuple(str(n) for n in w.trusted_proxies),
        max_frame_size=w.max_frame_size,
        handshake_timeout=w.handshake_timeout,
    )


def _ws_factory(
    node: Node,
    settings: MqttSettings,
    ws: WebSocketSettings,
    monotonic: Callable[[], float],
) -> Callable[[StreamShell, tuple[str, int] | None], WebSocketChannel]:
    """A WebSocket framing channel around an unchanged MQTT channel."""
    trusted = ws.networks()

    def inner(handle: ConnectionHandle, peer: tuple[str, int] | None) -> MqttChannel:
        return MqttChannel(node, settings, handle, peer=peer, monotonic=monotonic)

    def make(shell: StreamShell, peer: tuple[str, int] | None) -> WebSocketChannel:
        return WebSocketChannel(ws, shell, peer, inner, trusted)

    return make


def mqttsn_settings(config: GatewayConfig, listener: str) -> MqttSnSettings:
    sn = config.gateway.mqttsn
    assert sn is not None
    m = config.mqtt
    return MqttSnSettings(
        gateway_id=sn.gateway_id,
        predefined={p.id: p.topic for p in sn.predefined},
        enable_qos3=sn.enable_qos3,
        mountpoint=sn.mountpoint,
        listener=listener,
        idle_timeout=sn.idle_timeout,
        keepalive_multiplier=m.keepalive_multiplier,
        retry_interval=sn.retry_interval,
        max_retries=sn.max_retries,
        max_inflight=m.max_inflight,
        session_expiry_interval=int(m.session_expiry_interval),
        max_sleep_buffer=sn.max_sleep_buffer,
        max_clientid_len=m.max_clientid_len,
    )


def _mqttsn_factory(
    node: Node, settings: MqttSnSettings, monotonic: Callable[[], float]
) -> Callable[[DatagramPeer, tuple[str, int]], MqttSnChannel]:
    def make(peer: DatagramPeer, addr: tuple[str, int]) -> MqttSnChannel:
        return MqttSnChannel(node, settings, peer, peer=addr, monotonic=monotonic)

    return make


def coap_settings(config: GatewayConfig, listener: str) -> CoapSettings:
    c = config.gateway.coap
    assert c is not None
    return CoapSettings(
        mountpoint=c.mountpoint,
        listener=listener,
        connection_required=c.connection_required,
        heartbeat=c.heartbeat,
        idle_timeout=c.idle_timeout,
        ack_timeout=c.ack_timeout,
        max_retransmit=c.max_retransmit,
        block_size=c.block_size,
        max_body=c.max_body,
        max_inflight=config.mqtt.max_inflight,
        max_clientid_len=config.mqtt.max_clientid_len,
    )


def _coap_factory(
    node: Node, settings: CoapSettings, monotonic: Callable[[], float]
) -> Callable[[DatagramPeer, tuple[str, int]], CoapChannel]:
    def make(peer: DatagramPeer, addr: tuple[str, int]) -> CoapChannel:
        return CoapChannel(node, settings, peer, peer=addr, monotonic=monotonic)

    return make


def _coap_inner(
    node: Node, settings: CoapSettings, monotonic: Callable[[], float], dl: DtlsListener
) -> Callable[[ConnectionHandle, tuple[str, int], Mapping[str, str]], CoapChannel]:
    def make(
        handle: ConnectionHandle, addr: tuple[str, int], identity: Mapping[str, str]
    ) -> CoapChannel:
        return CoapChannel(node, settings, handle, peer=addr, monotonic=monotonic,
                           bound=bind_identity(dl, identity))

    return make


def _lwm2m_inner(
    node: Node, settings: Lwm2mSettings, monotonic: Callable[[], float], dl: DtlsListener | None
) -> Callable[..., Lwm2mChannel]:
    """``(handle, addr)`` on UDP; ``(handle, addr, identity)`` under DTLS, where a bound
    identity (``psk_identity_as_clientid``, ``peer_cert_as_clientid``...) must match the
    endpoint name the device registers with (checked by :class:`IdentityBoundContext`)."""

    def make(
        handle: ConnectionHandle,
        addr: tuple[str, int],
        identity: Mapping[str, str] | None = None,
    ) -> Lwm2mChannel:
        context: Any = node
        bound = bind_identity(dl, identity) if dl is not None and identity is not None else None
        if bound is not None:
            context = IdentityBoundContext(node, bound)
        return Lwm2mChannel(context, settings, handle, peer=addr, monotonic=monotonic)

    return make


def _dtls_factory(
    server: DtlsServer,
    handshake_timeout: float,
    inner: Callable[[ConnectionHandle, tuple[str, int], Mapping[str, str]], Any],
) -> Callable[[DatagramPeer, tuple[str, int]], DtlsChannel]:
    def make(peer: DatagramPeer, addr: tuple[str, int]) -> DtlsChannel:
        return DtlsChannel(server, peer, addr, inner, handshake_timeout=handshake_timeout)

    return make


def lwm2m_settings(config: GatewayConfig, listener: str, model: ObjectModel) -> Lwm2mSettings:
    c = config.gateway.lwm2m
    assert c is not None
    return Lwm2mSettings(
        mountpoint=c.mountpoint,
        listener=listener,
        lifetime_min=c.lifetime_min,
        lifetime_max=c.lifetime_max,
        qmode_time_window=c.qmode_time_window,
        response_timeout=c.response_timeout,
        idle_timeout=c.idle_timeout,
        publish_qos=c.publish_qos,
        max_queue=c.max_queue,
        model=model,
        bootstrap={
            ep: BootstrapPlan(plan.delete, [(w.path, list(w.content)) for w in plan.writes])
            for ep, plan in c.bootstrap.endpoints.items()
        } if c.bootstrap.enable else {},
    )


async def serve(config: GatewayConfig, worker: int | None = None) -> int:
    gateway = Gateway(config, worker)
    try:
        await gateway.start()
    except OSError as exc:
        log.error("cannot open listener: %s", exc)
        return 1
    except TlsError as exc:
        log.error("cannot load TLS certificates: %s", exc)
        return 1
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, gateway.reload)
    log.info("gatewayd %s started", config.node.name)
    admin = gateway.admin
    systemd = SystemdIntegration(admin.status_line if admin is not None else lambda: "running")
    systemd.ready()  # READY=1 now that every listener is open; watchdog pings from here
    await stop.wait()
    log.info("stopping")
    systemd.stopping()
    await gateway.stop()
    return 0


def run(config: GatewayConfig, worker: int | None = None) -> int:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(serve(config, worker))
    return uvloop.run(serve(config, worker))
