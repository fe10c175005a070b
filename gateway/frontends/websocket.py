"""MQTT over WebSocket: ``[listeners.ws.<name>]`` and ``[listeners.wss.<name>]``.

A WebSocket framing channel (:class:`gateway.net.websocket.WebSocketChannel`) around an
unchanged MQTT channel, on the stream shell; wss gets the assembly's TLS context, like
the ssl listeners (reloaded by SIGHUP), and its MQTT channel the client's certificate
(``peer_cert_as_clientid``, ``peer_cert_as_username``, ``peer_cert_authenticates``), as
an ssl listener's does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway.config import GatewayConfig
from gateway.config.schema import WsListener, WssListener
from gateway.core.node import Node
from gateway.frontends.base import Assembly, FrontEnd, ListenerSpec, enabled
from gateway.frontends.mqtt import listener_settings, peer_cert
from gateway.net.stream import StreamShell
from gateway.net.websocket import WebSocketChannel, WebSocketSettings
from protocols.context import ConnectionHandle
from protocols.mqtt.channel import MqttChannel, MqttSettings


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


def ws_channel(
    node: Node, settings: MqttSettings, ws: WebSocketSettings, monotonic: Callable[[], float],
    *, tls: bool = False,
) -> Callable[[StreamShell, tuple[str, int] | None], WebSocketChannel]:
    """A WebSocket framing channel around an unchanged MQTT channel; with ``tls`` the
    MQTT channel gets the client's certificate (read when the connection is made)."""
    trusted = ws.networks()

    def inner(handle: ConnectionHandle, peer: tuple[str, int] | None) -> MqttChannel:
        return MqttChannel(node, settings, handle, peer=peer, monotonic=monotonic)

    if not tls:
        def make(shell: StreamShell, peer: tuple[str, int] | None) -> WebSocketChannel:
            return WebSocketChannel(ws, shell, peer, inner, trusted)

        return make

    def make_tls(shell: StreamShell, peer: tuple[str, int] | None) -> WebSocketChannel:
        cert = peer_cert(shell, settings)

        def inner_tls(handle: ConnectionHandle, peer: tuple[str, int] | None) -> MqttChannel:
            return MqttChannel(node, settings, handle, peer=peer, monotonic=monotonic,
                               peer_cert=cert)

        return WebSocketChannel(ws, shell, peer, inner_tls, trusted)

    return make_tls


def _listeners(config: GatewayConfig) -> list[ListenerSpec]:
    tables: list[tuple[str, dict[str, Any]]] = [
        ("ws", config.listeners.ws), ("wss", config.listeners.wss),
    ]
    return enabled("listeners", tables, secure=("wss",))


def _channel(
    assembly: Assembly, spec: ListenerSpec, state: None
) -> Callable[[StreamShell, tuple[str, int] | None], WebSocketChannel]:
    settings = listener_settings(assembly, spec)
    return ws_channel(
        assembly.node, settings, websocket_settings(spec.config), assembly.monotonic,
        tls=spec.secure,
    )


def _label(config: GatewayConfig, spec: ListenerSpec) -> str:
    tls = " and TLS" if spec.secure else ""
    return f"MQTT over WebSocket{tls}, path {spec.config.websocket.mqtt_path}"


FRONTEND = FrontEnd(
    protocol="mqtt",
    transport="stream",
    kinds=("ws", "wss"),
    listeners=_listeners,
    channel=_channel,
    label=_label,
)
