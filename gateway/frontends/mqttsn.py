"""MQTT-SN 1.2 on UDP: ``[gateway.mqttsn]`` and its ``listeners.udp.<name>``.

With ``broadcast`` the listener may send to a broadcast address, and ADVERTISE goes out
when it opens and every ``advertise_interval`` seconds while it is open.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gateway.config import GatewayConfig
from gateway.core.node import Node
from gateway.frontends.base import Assembly, FrontEnd, ListenerSpec, enabled
from gateway.net.datagram import DatagramPeer, DatagramShell
from protocols.mqttsn.channel import MqttSnChannel, MqttSnSettings
from protocols.mqttsn.codec import encode
from protocols.mqttsn.packets import Advertise

log = logging.getLogger("gateway")


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


def _listeners(config: GatewayConfig) -> list[ListenerSpec]:
    sn = config.gateway.mqttsn
    if sn is None or not sn.enable:
        return []
    tables: list[tuple[str, dict[str, Any]]] = [("udp", sn.listeners.udp)]
    return enabled("gateway.mqttsn.listeners", tables, prefix="mqttsn:",
                   options={"allow_broadcast": sn.broadcast})


def _channel(
    assembly: Assembly, spec: ListenerSpec, state: None
) -> Callable[[DatagramPeer, tuple[str, int]], MqttSnChannel]:
    node: Node = assembly.node
    settings = mqttsn_settings(assembly.config, spec.id)
    monotonic = assembly.monotonic

    def make(peer: DatagramPeer, addr: tuple[str, int]) -> MqttSnChannel:
        return MqttSnChannel(node, settings, peer, peer=addr, monotonic=monotonic)

    return make


def _label(config: GatewayConfig, spec: ListenerSpec) -> str:
    assert config.gateway.mqttsn is not None
    return f"MQTT-SN 1.2, gateway id {config.gateway.mqttsn.gateway_id}"


def _opened(assembly: Assembly, spec: ListenerSpec, shell: DatagramShell) -> None:
    """ADVERTISE now and every ``advertise_interval`` seconds while the shell is open."""
    sn = assembly.config.gateway.mqttsn
    assert sn is not None and shell.transport is not None
    if not sn.broadcast:
        return
    local = shell.transport.get_extra_info("sockname")
    target = (sn.broadcast_address, sn.broadcast_port or local[1])
    datagram = encode(Advertise(sn.gateway_id, min(0xFFFF, int(sn.advertise_interval))))

    def advertise() -> bool:
        if not shell.open:
            return False
        try:
            shell.send_to([datagram], target)
        except OSError as exc:  # e.g. no route for the broadcast address
            log.warning("ADVERTISE to %s:%d failed: %s", target[0], target[1], exc)
        return True

    assembly.every(sn.advertise_interval, advertise)


FRONTEND = FrontEnd(
    protocol="mqttsn",
    transport="datagram",
    kinds=("udp",),
    listeners=_listeners,
    channel=_channel,
    label=_label,
    opened=_opened,
)
