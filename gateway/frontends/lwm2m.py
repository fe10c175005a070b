"""LwM2M 1.0/1.1 over CoAP on UDP and DTLS: ``[gateway.lwm2m]`` and its
``listeners.udp.<name>`` and ``listeners.dtls.<name>``.

Every listener shares one object model (the shipped one plus ``xml_dir``) and one
registry of registrations and unanswered commands, journaled in ``gateway.db`` when
durability is on (they survive a restart), in memory otherwise; registrations whose
lifetime ended with no channel left to notice are swept every minute.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.config import ConfigError, GatewayConfig
from gateway.config.schema import DtlsListener
from gateway.core.node import Node
from gateway.frontends.base import Assembly, FrontEnd, ListenerSpec, enabled
from gateway.net.dtls import IdentityBoundContext, bind_identity
from gateway.store.lwm2m import Lwm2mStore
from protocols.context import ConnectionHandle
from protocols.lwm2m.bootstrap import BootstrapPlan
from protocols.lwm2m.channel import Lwm2mChannel, Lwm2mSettings
from protocols.lwm2m.objects import ObjectModel
from protocols.lwm2m.registry import Registry

log = logging.getLogger("gateway")

LWM2M_SWEEP = 60.0  # seconds between sweeps of expired LwM2M registrations


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


def lwm2m_channel(
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


@dataclass(frozen=True, slots=True)
class Shared:
    """What every LwM2M listener of the node shares."""

    model: ObjectModel
    registry: Registry


def _prepare(assembly: Assembly) -> Shared:
    cfg = assembly.config.gateway.lwm2m
    assert cfg is not None
    model = ObjectModel.shipped()
    if cfg.xml_dir:
        try:
            model.load_dir(cfg.xml_dir)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"gateway.lwm2m.xml_dir: {exc}") from exc
    return Shared(model, _registry(assembly))


def _registry(assembly: Assembly) -> Registry:
    node = assembly.node
    store = assembly.store
    if store is None:
        registry = Registry()
    else:
        journal = Lwm2mStore(store.conn, store.committer)
        registry = Registry(journal)
        endpoints, commands = registry.restore(journal.load(), node.now())
        if endpoints:
            log.info("lwm2m: %d registrations restored, %d commands waiting",
                     endpoints, commands)

    def sweep() -> None:
        """Forget registrations whose lifetime ended with no channel left to notice
        (the device never came back after a kick or a restart)."""
        n = registry.sweep(node.now())
        if n:
            log.info("lwm2m: %d registrations expired (their waiting commands dropped)", n)

    assembly.every(LWM2M_SWEEP, sweep)
    return registry


def _listeners(config: GatewayConfig) -> list[ListenerSpec]:
    c = config.gateway.lwm2m
    if c is None or not c.enable:
        return []
    tables: list[tuple[str, dict[str, Any]]] = [
        ("udp", c.listeners.udp), ("dtls", c.listeners.dtls),
    ]
    return enabled("gateway.lwm2m.listeners", tables, prefix="lwm2m:", secure=("dtls",))


def _channel(assembly: Assembly, spec: ListenerSpec, shared: Shared) -> Callable[..., Any]:
    settings = lwm2m_settings(assembly.config, spec.id, shared.model)
    settings.registry = shared.registry
    dl = spec.config if spec.secure else None
    return lwm2m_channel(assembly.node, settings, assembly.monotonic, dl)


def _label(config: GatewayConfig, spec: ListenerSpec) -> str:
    return "LwM2M over DTLS" if spec.secure else "LwM2M"


FRONTEND = FrontEnd(
    protocol="lwm2m",
    transport="datagram",
    kinds=("udp", "dtls"),
    listeners=_listeners,
    channel=_channel,
    prepare=_prepare,
    label=_label,
)
