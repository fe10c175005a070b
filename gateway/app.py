"""Assemble a node from its configuration and run it until SIGINT/SIGTERM.

SIGHUP reloads what can change under a running node without dropping connections: the
TLS certificates of the ssl listeners and the keys and certificates of the DTLS listeners
(new handshakes use the new files) and the authorization rules file. A reload that fails
logs an error and keeps what was in force.

This is where the core, its services (protection, authentication, cluster, bridges,
fleet archiver, management API) and the listeners are put together; the listeners come
from the front-end registry (:mod:`gateway.frontends`), one loop over its table.

As worker ``I`` of a multi-worker node (``gatewayd --worker I``, started by
:mod:`gateway.workers.supervisor`; docs/workers.md) the same gateway opens its stream
listeners with ``SO_REUSEPORT``, opens them only once its cluster links to the sibling
workers are up, runs the datagram front-ends and the bridges' subscriptions in worker 0
only, and reads the users and bans from the node's own ``data_dir``.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal
import sqlite3
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
from gateway.core.authz import Authorizer, from_config
from gateway.core.clock import LoopScheduler
from gateway.core.node import CoreSettings, Node
from gateway.ext.service import Extensions, start_extensions
from gateway.fleet.archiver import Archiver, settings_from_config
from gateway.frontends import FRONTENDS, Assembly
from gateway.frontends.listen import open_listener
from gateway.gcpolicy import GcPolicy
from gateway.net.datagram import DatagramShell
from gateway.net.dtls import DtlsServer
from gateway.net.lean import LeanServer
from gateway.net.tls import ReloadableContext, TlsError
from gateway.protect.banned import BanGuard
from gateway.protect.flapping import FlappingDetector, FlappingSettings
from gateway.rules.service import RulesService, start_rules
from gateway.security.crlwatch import FileWatch, watch_links
from gateway.security.linkcheck import LinkRevocation, cluster_revocation
from gateway.store import startup as store_startup
from gateway.store.banned import BannedStore
from gateway.store.db import db_path, ensure_schema, open_db
from gateway.store.faults import classify
from gateway.store.sessions import SCHEMA, SessionStore
from gateway.store.space import StoreGuard
from gateway.store.writer import GroupCommitter
from gateway.version import build
from gateway.workers.plan import node_data_dir

log = logging.getLogger("gateway")


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
        self.servers: list[asyncio.Server | LeanServer] = []
        self.tls: dict[str, ReloadableContext] = {}
        self.dtls: dict[str, DtlsServer] = {}  # DTLS listener id -> its reloadable keys
        self.datagrams: list[DatagramShell] = []  # UDP/DTLS listeners (MQTT-SN, CoAP, LwM2M)
        self.assembly: Assembly | None = None  # what the front-ends share; its timers
        self.stopped = asyncio.Event()
        self.cluster: Cluster | None = None  # gateway.cluster, when [cluster] is enabled
        self.bridges: Bridges | None = None  # gateway.bridge, when [bridges.mqtt.*] exist
        self.rules: RulesService | None = None  # gateway.rules: rule engine and webhooks
        self.ext: Extensions | None = None  # gateway.ext: auto-subscribe, delayed, rewrite...
        self.crl_watch: FileWatch | None = None  # cluster/bridge CRL files (crlwatch)
        self.link_revocation: LinkRevocation | None = None  # cluster peers: DPs / OCSP

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
        if self.cluster is not None:
            self.cluster.ctx.revocation = self.link_revocation = cluster_revocation(
                config, node.metrics.incr)  # distribution points / OCSP of peers
            if self.link_revocation is not None:
                self.link_revocation.start(loop)
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
            self.bridges = Bridges(node, bridging, store)
            self.bridges.start()
        self.rules = await start_rules(self)  # before the listeners: rules see every event
        self.ext = start_extensions(self)  # MQTT extensions, before the listeners too
        if self.cluster is not None and self.ext.delayed is not None:
            self.cluster.attach_delayed(self.ext.delayed)  # delayed messages cluster-wide
        await self._start_frontends(node, store)
        self._watch_link_crls(loop)
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
        self._reload_cluster_tls()
        if self.node is not None and (self.cluster is not None or self.bridges is not None):
            from gateway.bridge.tls import client_context
            from gateway.security.links import recheck_links  # live links: revoked ones cut

            recheck_links(self.config, self.cluster, self.bridges, self.node.metrics.incr,
                          client_context)
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

    def _reload_cluster_tls(self) -> bool:
        """New cluster links get the files (key, CA, CRLs) as they are now; False (and one
        ERROR line) when they cannot be used: the previous ones stay."""
        if self.cluster is None:
            return False
        from gateway.cluster.tls import from_config as cluster_tls

        try:
            self.cluster.tls = cluster_tls(self.config.cluster.tls)
        except TlsError as exc:
            log.error("cluster TLS not reloaded, keeping the previous files: %s", exc)
            return False
        log.info("cluster TLS reloaded (%d CRL files)", len(self.config.cluster.tls.crlfile))
        return True

    def _watch_link_crls(self, loop: asyncio.AbstractEventLoop) -> None:
        """The cluster's and bridges' CRL files, re-read when they change (as on SIGHUP)."""
        if self.node is None or (self.cluster is None and self.bridges is None):
            return
        from gateway.bridge.tls import client_context

        self.crl_watch = watch_links(loop, self.config, self.cluster, self.bridges,
                                     self.node.metrics.incr,
                                     reload_cluster_tls=self._reload_cluster_tls,
                                     bridge_context=client_context)

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

    async def _start_frontends(self, node: Node, node_store: SessionStore | None) -> None:
        """Every listener of every front-end of the registry, in its order (datagram
        front-ends in worker 0 only), each registered in :attr:`listeners`."""
        self.assembly = assembly = Assembly(node, self.config, node_store)
        for frontend in FRONTENDS:
            if frontend.transport == "datagram" and not self.primary:
                continue
            specs = frontend.listeners(self.config)
            if not specs:
                continue
            state = frontend.prepare(assembly)
            for spec in specs:
                try:
                    opened = await open_listener(
                        frontend, assembly, spec, state, self.committer, self._stream_options
                    )
                except OSError as exc:
                    if not self.config.node.skip_busy_ports:
                        raise
                    self._busy(spec.id, frontend.label(self.config, spec),
                               str(spec.config.bind), exc)
                    continue
                if opened.server is not None:
                    self.servers.append(opened.server)
                if opened.shell is not None:
                    self.datagrams.append(opened.shell)
                if opened.tls is not None:
                    self.tls[spec.id] = opened.tls
                if opened.dtls is not None:
                    self.dtls[spec.id] = opened.dtls
                log.info(
                    "listener %s (%s) on %s%s", spec.id, frontend.label(self.config, spec),
                    ", ".join(opened.addresses), f": {opened.detail}" if opened.detail else "",
                )
                self.listeners[spec.id] = ListenerEntry(
                    spec.kind, spec.name, frontend.protocol, spec.config.bind,
                    opened.limits, opened.addresses,
                )
                if frontend.opened is not None:
                    frontend.opened(assembly, spec, opened.shell or opened.server)

    def _busy(self, listener_id: str, label: str, bind: str, exc: OSError) -> None:
        """``node.skip_busy_ports``: one line and an alarm for a listener not opened."""
        why = "port already in use" if exc.errno == errno.EADDRINUSE else (
            exc.strerror or str(exc))
        log.warning("listener %s (%s) not opened on %s: %s", listener_id, label, bind, why)
        if self.admin is not None:
            self.admin.alarms.activate(
                f"listener_not_opened:{listener_id}",
                f"listener {listener_id} not opened on {bind}: {why}",
                {"listener": listener_id, "bind": bind},
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
        return SessionStore(reader, self.committer, self.admin)

    async def stop(self) -> None:
        """Stop accepting, tell connected clients we are going (0x8B), settle their
        sessions and commit everything to disk."""
        if self.admin is not None:
            await self.admin.stop()
        for tls in self.tls.values():  # revocation and stapling timers
            tls.close()
        for dtls in self.dtls.values():  # revocation timers
            dtls.close()
        if self.crl_watch is not None:
            self.crl_watch.close()
        if self.link_revocation is not None:
            self.link_revocation.close()
        for server in self.servers:
            server.close()
        node = self.node
        if node is not None:
            for session in list(node.sessions.values()):
                handle, info = session.handle, session.info
                if handle is not None and info is not None:
                    info.set_attr("disconnect_reason", "server_shutting_down")
                    node.close(info, handle, send_will=False)
                    handle.kick(0x8B)  # SERVER_SHUTTING_DOWN
        for server in self.servers:
            await server.wait_closed()
        self.servers.clear()
        if self.assembly is not None:  # the front-ends' timers (ADVERTISE, LwM2M sweep)
            self.assembly.close()
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
        if self.ext is not None:  # before the last commit (delayed rows already queued)
            self.ext.stop()
            self.ext = None
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
    log.info("gatewayd %s started (%s build)", config.node.name, build())
    # What start-up made lives as long as the process, and so do most objects that
    # survive a full collection: kept out of the next ones (gateway.gcpolicy)
    gc_policy = GcPolicy()
    gc_policy.install()
    admin = gateway.admin
    systemd = SystemdIntegration(admin.status_line if admin is not None else lambda: "running")
    systemd.ready()  # READY=1 now that every listener is open; watchdog pings from here
    await stop.wait()
    log.info("stopping")
    systemd.stopping()
    await gateway.stop()
    gc_policy.close()  # thawed: finalized at exit as before (the store's last checkpoint)
    return 0


def run(config: GatewayConfig, worker: int | None = None) -> int:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return asyncio.run(serve(config, worker))
    return uvloop.run(serve(config, worker))
