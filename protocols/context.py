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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from protocols.effects import Effect
from protocols.empties import EMPTY_DICT
from protocols.mqtt.packets import NO_PROPERTIES, Properties

# The attributes of a client that has none (most): shared and read-only; see set_attr.
_NO_ATTRS: Any = EMPTY_DICT


@dataclass(slots=True)
class ClientInfo:
    """Who is on the other end of a connection, as the core needs to know it.

    One per connection: ``attrs`` is a shared read-only empty mapping until the first
    :meth:`set_attr` (an empty dict costs 64 bytes)."""

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
    attrs: dict[str, Any] = field(default_factory=lambda: _NO_ATTRS)
    # topic -> (allowed, valid until, rules generation): publish decisions only, owned by
    # the core's authorizer
    authz_cache: dict[str, tuple[bool, float, int]] | None = None

    def set_attr(self, key: str, value: Any) -> None:
        if self.attrs is _NO_ATTRS:
            self.attrs = {}
        self.attrs[key] = value


# a cached encoded PUBLISH (Message.wire): (bytes, packet id offset or -1), then
# (bytes, offset, None) after one copy with another id, (bytes, offset, head, tail) after two
WireForm = tuple[bytes, int] | tuple[bytes, int, None] | tuple[bytes, int, bytes, bytes]


class Message:
    """An application message inside the broker (protocol-neutral).

    ``properties`` holds only the publish-related MQTT 5 properties (payload format,
    expiry, content type, response topic, correlation data, user properties); never a
    topic alias or subscription identifiers. ``expires_at`` is wall-clock seconds or None.
    ``wire`` caches its encodings per (MQTT 5?, QoS, retain), seeded with the publisher's
    own bytes where they are the same (``MqttChannel._on_publish``): a hook that changes
    a message returns a new one instead of modifying it.
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
        "wire",
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
        # encoded PUBLISH templates shared by every subscriber: key -> (bytes, id offset,
        # ...) (see protocols.mqtt.channel's _shared_publish)
        self.wire: dict[Any, WireForm] | None = None

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

    def call_channel(self, fn: Callable[[], list[Effect]]) -> None:
        """Run ``fn`` (a channel method returning effects) and carry out its effects;
        nothing happens once the connection is closed. How a result computed later (an
        authentication that had to wait) gets back into the sans-IO channel."""
        ...


class SessionAPI(Protocol):
    """A session as a channel sees it."""

    client_id: str
    subscriptions: dict[str, SubOptions]
    awaiting_rel: dict[int, float]  # incoming QoS 2 packet ids awaiting PUBREL

    def puback(self, packet_id: int, *, drain: bool = True) -> bool:
        """A QoS 1 delivery acknowledged; ``drain=False``: the caller calls ``drain``
        (once after a batch of acknowledgements)."""
        ...

    def drain(self) -> None: ...
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
    # The CONNACK may leave before the store commits what this connect wrote: losing
    # those writes in a crash leaves no session, or the session as it was, which the
    # client learns from session present at its next connect (MQTT tells it what to do).
    # False when the connect discarded a session (clean start) or moved one in from
    # another node: that must be on disk before the client is told.
    connack_early: bool = False


PUBLISH_REFUSED = -1
"""``GatewayContext.publish``: the message was not taken (not routed, not retained): it
is QoS 1/2 and the node's store cannot make it durable now (disk full, a write error, its
size cap). The channel answers at once: MQTT 5 with reason code 0x97 (quota exceeded),
MQTT 3.1.1 by closing the connection without an acknowledgement (the client re-sends)."""

SUBSCRIBED = 0
"""``GatewayContext.subscribe``: a new subscription."""
RESUBSCRIBED = 1
"""``GatewayContext.subscribe``: it replaced the client's subscription to the same filter."""


def subscribe_refused(result: int) -> int:
    """The reason code (>= 0x80) when :meth:`GatewayContext.subscribe` refused, else 0."""
    return result if result >= 0x80 else 0


AUTH_PENDING = -1
"""``GatewayContext.authenticate``: the answer will come through ``done``."""


class PendingDecision(Protocol):
    """An authorization answer that is not known yet (``GatewayContext.authorize`` with
    ``wait=True``; the core's :class:`gateway.core.deferred.Deferred`). The callbacks run
    once, on the event loop thread, with True (allowed) or False; a callback added after
    the answer runs at once."""

    @property
    def done(self) -> bool: ...

    def add_callback(self, callback: Callable[[bool], None]) -> None: ...


@dataclass(frozen=True, slots=True)
class AuthStep:
    """One server step of an enhanced authentication exchange.

    ``reason_code``: 0x18 (continue: send ``data`` in an AUTH and wait for the client's
    next AUTH), 0 (success: ``data`` goes in the CONNACK, or in AUTH 0x00 when
    re-authenticating) or a failure reason code (0x86, 0x87, ...) with ``reason``.
    """

    reason_code: int
    data: bytes | None = None
    reason: str = ""


class AuthExchange(Protocol):
    """The server side of one enhanced authentication (sans-IO). ``step`` is called with
    the Authentication Data of the CONNECT (or AUTH 0x19) and then of each AUTH 0x18.
    On success the exchange has set ``client.username`` (if it was None) and
    ``client.attrs`` (e.g. ``is_superuser``)."""

    def step(self, data: bytes | None) -> AuthStep: ...


class GatewayContext(Protocol):
    """The core as a channel sees it."""

    def authenticate(
        self,
        client: ClientInfo,
        password: bytes | None,
        done: Callable[[int], None] | None = None,
    ) -> int:
        """Return 0 to accept, an MQTT 5 CONNACK reason code to refuse, or
        :data:`AUTH_PENDING`: the answer is not known yet and ``done(code)`` will be
        called exactly once, later, on the event loop thread. Without ``done`` the
        answer is never pending."""
        ...

    def enhanced_auth(self, client: ClientInfo, method: str) -> AuthExchange | None:
        """A new exchange for MQTT 5 enhanced authentication with ``method`` (e.g.
        ``"SCRAM-SHA-256"``), or None when the method is not supported (0x8C)."""
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

    def authorize(
        self, client: ClientInfo, action: str, topic: str, wait: bool = False
    ) -> bool | PendingDecision:
        """True to allow ``action`` (``"publish"``/``"subscribe"``) on ``topic``, False to
        deny. A decision an authorization source has to ask for (an HTTP service) may not
        be known at once: with ``wait=True`` the answer is then a :class:`PendingDecision`
        (test ``is True``/``is False`` first: both are the common, synchronous case);
        without it such a decision is False (denied and logged), never pending. Cached
        and rule decisions are always answered at once."""
        ...

    def publish(self, client: ClientInfo, message: Message) -> int:
        """Route a message; returns the number of sessions it reached, or
        :data:`PUBLISH_REFUSED`."""
        ...

    def subscribe(
        self, client: ClientInfo, topic_filter: str, options: SubOptions
    ) -> int:
        """Add or replace a subscription; returns :data:`RESUBSCRIBED` when it already
        existed, :data:`SUBSCRIBED` when it is new, or a reason code (>= 0x80: see
        :func:`subscribe_refused`) when the core refused it (an exclusive subscription
        another client holds: 0x97, quota exceeded). Plain ints, not ``bool | int``: a
        compiled caller (mypyc) stores such a union as an int, and True is 1 there."""
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
