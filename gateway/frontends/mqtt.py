"""MQTT 3.1, 3.1.1 and 5.0 over TCP and TLS: ``[listeners.tcp.<name>]`` and
``[listeners.ssl.<name>]`` (settings: ``[mqtt]``, per-listener rate overrides).

An ssl listener's channel gets the client's certificate (``peer_cert_as_clientid``,
``peer_cert_as_username``, ``peer_cert_authenticates``); the TLS context itself is the
assembly's (:mod:`gateway.frontends.listen`), reloaded by SIGHUP.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gateway.config import GatewayConfig
from gateway.core.node import Node
from gateway.frontends.base import Assembly, FrontEnd, ListenerSpec, enabled
from gateway.net.stream import StreamShell
from gateway.net.tls import peer_identity
from protocols.mqtt.channel import MqttChannel, MqttSettings

StreamFactory = Callable[[StreamShell, tuple[str, int] | None], MqttChannel]


def mqtt_settings(config: GatewayConfig, listener: str, mountpoint: str) -> MqttSettings:
    """The MQTT channel's settings for listener ``listener`` (``"kind:name"``)."""
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


def mqtt_channel(
    node: Node, settings: MqttSettings, monotonic: Callable[[], float], *, tls: bool = False
) -> StreamFactory:
    """The stream shell's channel factory; with ``tls`` the channel gets the client's
    certificate."""
    if not tls:
        def make(shell: StreamShell, peer: tuple[str, int] | None) -> MqttChannel:
            return MqttChannel(node, settings, shell, peer=peer, monotonic=monotonic)

        return make

    def make_tls(shell: StreamShell, peer: tuple[str, int] | None) -> MqttChannel:
        cert = peer_cert(shell, settings)
        return MqttChannel(node, settings, shell, peer=peer, monotonic=monotonic, peer_cert=cert)

    return make_tls


def peer_cert(shell: StreamShell, settings: MqttSettings) -> Mapping[str, str] | None:
    """The client certificate's identity fields, with what ``peer_cert_as_*`` needs beyond
    CN and DN (the PEM, the DER, its MD5)."""
    extra = tuple(
        f for f in (settings.peer_cert_as_clientid, settings.peer_cert_as_username)
        if f in ("pem", "crt", "md5")
    )
    return peer_identity(shell.transport, extra)


def _listeners(config: GatewayConfig) -> list[ListenerSpec]:
    tables: list[tuple[str, dict[str, Any]]] = [
        ("tcp", config.listeners.tcp), ("ssl", config.listeners.ssl),
    ]
    return enabled("listeners", tables, secure=("ssl",))


def listener_settings(assembly: Assembly, spec: ListenerSpec) -> MqttSettings:
    """The MQTT settings of one listener (MQTT or WebSocket): the zone's, its mountpoint,
    and on a TLS listener what the client certificate stands for."""
    lst = spec.config
    settings = mqtt_settings(assembly.config, spec.id, lst.mountpoint)
    if spec.secure:
        settings.peer_cert_as_clientid = lst.peer_cert_as_clientid
        settings.peer_cert_as_username = lst.peer_cert_as_username
        settings.peer_cert_authenticates = lst.peer_cert_authenticates
    return settings


def _channel(assembly: Assembly, spec: ListenerSpec, state: None) -> StreamFactory:
    settings = listener_settings(assembly, spec)
    return mqtt_channel(assembly.node, settings, assembly.monotonic, tls=spec.secure)


def _label(config: GatewayConfig, spec: ListenerSpec) -> str:
    return "MQTT over TLS" if spec.secure else "MQTT"


FRONTEND = FrontEnd(
    protocol="mqtt",
    transport="stream",
    kinds=("tcp", "ssl"),
    listeners=_listeners,
    channel=_channel,
    label=_label,
)
