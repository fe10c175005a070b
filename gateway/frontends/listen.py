"""Open one listener of a front-end: the part that is the same for every front-end.

Limits from the listener's section (stream listeners add the connection rate and the
slow-reader limits), a TLS context (ssl, wss) or a DTLS server (dtls) that SIGHUP
reloads, the stream or datagram shell, and the addresses the socket got. The caller
(:class:`gateway.app.Gateway`) keeps what it must reload and close, and registers the
listener for the management API.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.config import ConfigError
from gateway.frontends.base import Assembly, FrontEnd, ListenerSpec
from gateway.net.datagram import DatagramPeer, DatagramShell, start_datagram_listener
from gateway.net.dtls import DtlsChannel, DtlsError, DtlsServer
from gateway.net.lean import LeanServer
from gateway.net.shell import CommitGate
from gateway.net.stream import ListenerLimits, start_stream_listener
from gateway.net.tls import ReloadableContext, describe
from gateway.security.revocation import GuardSettings, RevocationGuard
from gateway.security.stapling import OcspStapling
from protocols.context import ConnectionHandle


@dataclass(slots=True)
class Opened:
    """One open listener: exactly one of ``server`` (stream) and ``shell`` (datagram)."""

    spec: ListenerSpec
    limits: ListenerLimits
    addresses: list[str]
    server: asyncio.Server | LeanServer | None = None
    shell: DatagramShell | None = None
    tls: ReloadableContext | None = None
    dtls: DtlsServer | None = None
    detail: str = ""  # the TLS or DTLS keys in use, for the log line


def fmt_address(addr: tuple[str, int] | tuple[str, int, int, int]) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def limits_of(frontend: FrontEnd, spec: ListenerSpec) -> ListenerLimits:
    lst = spec.config
    allow, deny = [str(n) for n in lst.allow], [str(n) for n in lst.deny]
    if frontend.transport == "datagram":
        return ListenerLimits(spec.id, max_connections=lst.max_connections,
                              allow=allow, deny=deny)
    return ListenerLimits(
        spec.id,
        max_connections=lst.max_connections,
        max_conn_rate=lst.max_conn_rate,
        send_timeout=lst.send_timeout,
        max_send_buffer=lst.max_send_buffer,
        allow=allow,
        deny=deny,
    )


async def open_listener(
    frontend: FrontEnd,
    assembly: Assembly,
    spec: ListenerSpec,
    state: Any,
    gate: CommitGate | None,
    stream_options: Mapping[str, Any],
) -> Opened:
    """Open ``spec`` with the channel factory its front-end makes for it."""
    limits = limits_of(frontend, spec)
    factory = frontend.channel(assembly, spec, state)
    if frontend.transport == "stream":
        options = dict(stream_options)
        tls = None
        if spec.secure:
            tls = ReloadableContext(spec.id, spec.config)
            factory = guard_listener(assembly, spec, tls, factory)
            options["ssl"] = tls.server_context
            options["ssl_handshake_timeout"] = assembly.config.mqtt.idle_timeout
        server = await start_stream_listener(
            spec.config.bind, limits, factory, gate, backlog=spec.config.backlog,
            transport=spec.config.transport, **options,
        )
        addresses = [fmt_address(s.getsockname()) for s in server.sockets]
        detail = describe(spec.config) if spec.secure else ""
        return Opened(spec, limits, addresses, server=server, tls=tls, detail=detail)
    dtls = None
    detail = ""
    if spec.secure:
        try:
            dtls = DtlsServer.from_listener(spec.id, spec.config)
        except DtlsError as exc:
            raise ConfigError(exc.where(spec.where)) from exc
        guard_dtls(assembly, spec, dtls)
        factory = dtls_channel(dtls, spec.config.handshake_timeout, factory)
        detail = dtls.current.description
    shell = await start_datagram_listener(spec.config.bind, limits, factory, gate, **spec.options)
    assert shell.transport is not None
    addresses = [fmt_address(shell.transport.get_extra_info("sockname"))]
    return Opened(spec, limits, addresses, shell=shell, dtls=dtls, detail=detail)


def guard_listener(
    assembly: Assembly, spec: ListenerSpec, tls: ReloadableContext, factory: Any
) -> Any:
    """Revocation checks and OCSP stapling of a TLS listener, when configured
    (:mod:`gateway.security.revocation`, :mod:`gateway.security.stapling`): the factory
    to use instead of ``factory``."""
    lst = spec.config
    loop = asyncio.get_running_loop()
    if lst.ocsp.enable_ocsp_stapling:
        stapling = OcspStapling(spec.id, lst, tls)
        stapling.start(loop)
    if not (lst.crlfile or lst.enable_crl_check or lst.ocsp_check.enable):
        return factory
    guard = RevocationGuard(spec.id, guard_settings(assembly, lst),
                            incr=assembly.node.metrics.incr, on_files_changed=tls.reload)
    tls.on_reload.append(guard.reload_files)
    tls.closers.append(guard.close)
    guard.start(loop)

    def make(shell: Any, peer: Any) -> Any:
        channel = factory(shell, peer)
        guard.admit(shell)
        return channel

    return make


def guard_settings(assembly: Assembly, lst: Any) -> GuardSettings:
    """The revocation settings of an ssl/wss or dtls listener, with ``[crl_cache]``."""
    cc = assembly.config.crl_cache
    oc = lst.ocsp_check
    return GuardSettings(
        crlfile=list(lst.crlfile), cacertfile=lst.cacertfile,
        enable_crl_check=lst.enable_crl_check, refresh_interval=cc.refresh_interval,
        http_timeout=cc.http_timeout, capacity=cc.capacity, crl_fail_mode=cc.fail_mode,
        file_check_interval=cc.file_check_interval, ocsp_enable=oc.enable,
        ocsp_url=oc.responder_url, ocsp_ttl=oc.cache_ttl, ocsp_timeout=oc.http_timeout,
        ocsp_fail_mode=oc.fail_mode,
    )


def guard_dtls(assembly: Assembly, spec: ListenerSpec, server: DtlsServer) -> None:
    """A DTLS listener's revocation guard (CRL files watched, distribution points, OCSP),
    when one of them is configured: the server's sessions are judged by it, and a CRL
    file that changes reloads the server as SIGHUP does."""
    lst = spec.config
    if not (lst.crlfile or lst.enable_crl_check or lst.ocsp_check.enable):
        return
    guard = RevocationGuard(spec.id, guard_settings(assembly, lst),
                            incr=assembly.node.metrics.incr, on_files_changed=server.reload)
    server.guard = guard
    guard.start(asyncio.get_running_loop())


def dtls_channel(
    server: DtlsServer,
    handshake_timeout: float,
    inner: Callable[[ConnectionHandle, tuple[str, int], Mapping[str, str]], Any],
) -> Callable[[DatagramPeer, tuple[str, int]], DtlsChannel]:
    """The datagram shell's factory of a DTLS listener: a DTLS session per peer address,
    whose plaintext goes to the channel ``inner`` makes once the handshake is over."""

    def make(peer: DatagramPeer, addr: tuple[str, int]) -> DtlsChannel:
        return DtlsChannel(server, peer, addr, inner, handshake_timeout=handshake_timeout)

    return make
