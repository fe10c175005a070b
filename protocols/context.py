"""The one narrow interface between protocol front-ends and the broker core.

Channels (MQTT, MQTT-SN, CoAP, LwM2M) see the core only through :class:`GatewayContext`
and the :class:`SessionAPI` it hands out; the core reaches a live connection only
through the :class:`ConnectionHandle` the transport shell registers. ``protocols/`` never
imports ``gateway/``: ``gateway.core`` implements these protocols structurally.

Invariants:
- A :class:`Delivery` with ``qos > 0`` carries the packet id the session allocated; the
  channel must either send it or call ``SessionAPI.discard`` with that id.
- Every callback into a channel from the core happens on the event loop thread.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from protocols.mqtt.packets import NO_PROPERTIES, Properties


@dataclass(slots=True)
class ClientInfo:
    """Who is on the other end of a connection, as the core needs to know it."""

    client_id: str
    protocol: str = "mqtt"  # mqtt | mqttsn | coap | lwm2m | ws
    proto_ver: int = 4
    username: str | None = None
    peer_host: str | None = None
    peer_port: int | None = None
    listener: str = "tcp:default"
    mountpoint: str = ""
    keepalive: int = 0
    clean_start: bool = True
    connected_at: float = 0.0
    attrs: dict[str, Any] = field(default_factory=dict)


class Message:
    """An application message inside the broker (protocol-neutral).

    ``properties`` holds only the publish-related MQTT 5 properties (payload format,
    expiry, content type, response topic, correlation data, user properties); never a
    topic alias or subscription identifiers. ``expires_at`` is wall-clock seconds or None.
    """

    __slots__ = (
        "topic",
        "payload",
        "qos",
        "retain",
        "properties",
        "publisher",
        "username",
        "timestamp",
        "expires_at",
        "headers",
        "store_id",
    )

    def __init__(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        properties: Properties = NO_PROPERTIES,
        publisher: str = "",
        username: str | None = None,
        timestamp: float = 0.0,
        expires_at: float | None = None,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.properties = properties
        self.publisher = publisher
        self.username = username
        self.timestamp = timestamp
        self.expires_at = expires_at
        self.headers: dict[str, Any] | None = None
        self.store_id: int | None = None  # row id once persisted (gateway.store)

    def __repr__(self) -> str:
        return (
            f"Message(topic={self.topic!r}, qos={self.qos}, retain={self.retain}, "
            f"len={len(self.payload)}, publisher={self.publisher!r})"
        )


class Delivery:
    """One message on its way to one session's connection."""

    __slots__ = ("message", "qos", "retain", "subscription_ids", "packet_id", "dup", "share", "ref")

    def __init__(
        self,
        message: Message,
        qos: int,
        retain: bool,
        subscription_ids: tuple[int, ...] = (),
        packet_id: int | None = None,
        dup: bool = False,
        share: tuple[str, str] | None = None,
    ) -> None:
        self.message = message
        self.qos = qos
        self.retain = retain
        self.subscription_ids = subscription_ids
        self.packet_id = packet_id
        self.dup = dup
        # (group, filter) when it came through a shared subscription: if the session
        # ends before the message is acknowledged, it goes to another group member.
        self.share = share
        self.ref: int | None = None  # queue row id while persisted (gateway.store)


@dataclass(frozen=True, slots=True)
class SubOptions:
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0
    subscription_id: int | None = None


class ConnectionHandle(Protocol):
    """What the core may ask of a live connection (implemented by the transport shell)."""

    def deliver(self, deliveries: list[Delivery]) -> None: ...
    def release(self, packet_id: int) -> None:
        """Re-send PUBREL for an outgoing QoS 2 message (session resume)."""
        ...

    def kick(self, reason_code: int) -> None:
        """Close the connection, telling the client why when the protocol allows."""
        ...


class SessionAPI(Protocol):
    """A session as a channel sees it."""

    client_id: str
    subscriptions: dict[str, SubOptions]
    awaiting_rel: dict[int, float]  # incoming QoS 2 packet ids awaiting PUBREL

    def puback(self, packet_id: int) -> bool: ...
    def pubrec(self, packet_id: int) -> bool: ...
    def pubcomp(self, packet_id: int) -> bool: ...
    def discard(self, packet_id: int) -> None: ...
    def await_rel(self, packet_id: int) -> None:
        """Remember an incoming QoS 2 packet id until its PUBREL (durably if persistent)."""
        ...

    def complete_rel(self, packet_id: int) -> bool:
        """PUBREL arrived: forget the id; False when it was not awaited."""
        ...

    def resume(self) -> None: ...
    def set_receive_maximum(self, value: int) -> None: ...


@dataclass(slots=True)
class ConnectResult:
    reason_code: int  # 0 = success; otherwise an MQTT 5 CONNACK reason code
    session: SessionAPI | None = None
    session_present: bool = False
    session_expiry_interval: int = 0


class GatewayContext(Protocol):
    """The core as a channel sees it."""

    def authenticate(self, client: ClientInfo, password: bytes | None) -> int:
        """Return 0 to accept, else an MQTT 5 CONNACK reason code."""
        ...

    def open_session(
        self,
        client: ClientInfo,
        handle: ConnectionHandle,
        *,
        clean_start: bool,
        expiry_interval: int,
        receive_maximum: int,
        will: Message | None,
        will_delay: int,
    ) -> ConnectResult: ...

    def authorize(self, client: ClientInfo, action: str, topic: str) -> bool: ...

    def publish(self, client: ClientInfo, message: Message) -> int:
        """Route a message; returns the number of sessions it reached."""
        ...

    def subscribe(self, client: ClientInfo, topic_filter: str, options: SubOptions) -> bool:
        """Add or replace a subscription; returns True when it already existed."""
        ...

    def deliver_retained(
        self, client: ClientInfo, topic_filter: str, options: SubOptions, existed: bool
    ) -> None: ...

    def unsubscribe(self, client: ClientInfo, topic_filter: str) -> bool:
        """Returns False when no such subscription existed."""
        ...

    def close(
        self,
        client: ClientInfo,
        handle: ConnectionHandle,
        *,
        send_will: bool,
        expiry_interval: int | None = None,
    ) -> None: ...

    def connack(self, client: ClientInfo, reason_code: int) -> None:
        """A CONNACK went out (0 = accepted)."""
        ...

    def delivered(self, client: ClientInfo, deliveries: list[Delivery]) -> None:
        """These deliveries were written to the client (counted, ``message.delivered``)."""
        ...

    def incr(self, metric: str, n: int = 1) -> None: ...

    def now(self) -> float:
        """Wall-clock seconds (a virtual clock in tests)."""
        ...
