"""CoAP on UDP and DTLS: ``[gateway.coap]`` and its ``listeners.udp.<name>`` and
``listeners.dtls.<name>`` (EMQX's CoAP gateway: publish, subscribe by observe).

Under DTLS the channel is bound to the peer's identity (``psk_identity_as_clientid``,
``peer_cert_as_clientid``...); the DTLS session itself is the assembly's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gateway.config import GatewayConfig
from gateway.config.schema import DtlsListener
from gateway.core.node import Node
from gateway.frontends.base import Assembly, FrontEnd, ListenerSpec, enabled
from gateway.net.datagram import DatagramPeer
from gateway.net.dtls import bind_identity
from protocols.coap.channel import CoapChannel, CoapSettings
from protocols.context import ConnectionHandle


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


def coap_dtls_channel(
    node: Node, settings: CoapSettings, monotonic: Callable[[], float], dl: DtlsListener
) -> Callable[[ConnectionHandle, tuple[str, int], Mapping[str, str]], CoapChannel]:
    """The inner factory of a DTLS listener: ``(handle, addr, identity) -> channel``."""
    def make(
        handle: ConnectionHandle, addr: tuple[str, int], identity: Mapping[str, str]
    ) -> CoapChannel:
        return CoapChannel(node, settings, handle, peer=addr, monotonic=monotonic,
                           bound=bind_identity(dl, identity))

    return make


def _listeners(config: GatewayConfig) -> list[ListenerSpec]:
    c = config.gateway.coap
    if c is None or not c.enable:
        return []
    tables: list[tuple[str, dict[str, Any]]] = [
        ("udp", c.listeners.udp), ("dtls", c.listeners.dtls),
    ]
    return enabled("gateway.coap.listeners", tables, prefix="coap:", secure=("dtls",))


def _channel(assembly: Assembly, spec: ListenerSpec, state: None) -> Callable[..., CoapChannel]:
    node, monotonic = assembly.node, assembly.monotonic
    settings = coap_settings(assembly.config, spec.id)
    if spec.secure:
        return coap_dtls_channel(node, settings, monotonic, spec.config)

    def make(peer: DatagramPeer, addr: tuple[str, int]) -> CoapChannel:
        return CoapChannel(node, settings, peer, peer=addr, monotonic=monotonic)

    return make


def _label(config: GatewayConfig, spec: ListenerSpec) -> str:
    return "CoAP over DTLS" if spec.secure else "CoAP"


FRONTEND = FrontEnd(
    protocol="coap",
    transport="datagram",
    kinds=("udp", "dtls"),
    listeners=_listeners,
    channel=_channel,
    label=_label,
)
