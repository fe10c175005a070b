"""The MQTT channel's settings (from ``[mqtt]`` and the listener) and its states.

:class:`MqttSettings` is per listener and shared by its channels (read-only for them);
:class:`State` is the channel's connection state machine, documented in
:mod:`protocols.mqtt.channel`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(slots=True)
class MqttSettings:
    """Per-listener MQTT behaviour (from ``[mqtt]`` and the listener's table)."""

    max_packet_size: int = 1024 * 1024
    max_clientid_len: int = 65535
    max_topic_levels: int = 128
    max_topic_alias: int = 65535
    max_qos_allowed: int = 2
    retain_available: bool = True
    wildcard_subscription: bool = True
    shared_subscription: bool = True
    idle_timeout: float = 15.0
    keepalive_multiplier: float = 1.5
    server_keepalive: int = 0
    max_keepalive: int = 0
    session_expiry_interval: int = 7200
    max_session_expiry_interval: int = 0
    max_inflight: int = 32
    max_awaiting_rel: int = 100
    await_rel_timeout: float = 300.0
    max_subscriptions: int = 0
    response_information: str = ""
    # protection (0 = off): PUBLISH packets and bytes per second read from one client
    # (beyond them the channel emits Pause: reading stops until the debt is paid), and
    # the seconds a packet may take to arrive once its first byte is in (slowloris)
    messages_rate: float = 0.0
    bytes_rate: float = 0.0
    packet_timeout: float = 0.0
    # TLS listeners: "cn" | "dn" | "san" of the client certificate (the ``peer_cert``
    # mapping) replaces the CONNECT's client id / username; "none" keeps the CONNECT's.
    peer_cert_as_clientid: str = "none"
    peer_cert_as_username: str = "none"
    # a verified client certificate authenticates a CONNECT without a password
    peer_cert_authenticates: bool = False
    deny_action_disconnect: bool = False
    subscribe_deny_code: int = 0x87  # MQTT 5 SUBACK code for a denied subscription
    mountpoint: str = ""
    listener: str = "tcp:default"


class State(Enum):
    CONNECTING = "connecting"
    AUTHENTICATING = "authenticating"  # the core decides; input is buffered, not parsed
    AUTH_EXCHANGE = "auth_exchange"  # enhanced authentication: waiting for the client's AUTH
    CONNECTED = "connected"
    CLOSED = "closed"

