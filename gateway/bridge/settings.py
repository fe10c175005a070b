"""A bridge's settings as plain data, converted once from ``[bridges.mqtt.<name>]``.

The rest of :mod:`gateway.bridge` reads these dataclasses, never the pydantic models, so
the outbox and the client state machine are built in tests without a configuration.

Templates: a forward's ``remote`` and a subscription's ``local`` are topic names in which
``${topic}`` stands for the topic the message arrived on (the local topic when going up,
the remote topic when coming down); no other placeholder exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.config.schema import BridgeTls, MqttBridge

PROTOCOL_LEVELS = {"v3": 3, "v4": 4, "v5": 5}
TOPIC = "${topic}"


def render(template: str, topic: str) -> str:
    """``template`` with every ``${topic}`` replaced by ``topic``."""
    if template == TOPIC:
        return topic
    return template.replace(TOPIC, topic)


@dataclass(frozen=True, slots=True)
class ForwardRule:
    """Local messages on ``local`` (a topic filter) go upstream to ``remote``."""

    local: str
    remote: str = TOPIC
    qos: int | None = None  # None: the message's QoS
    retain: bool | None = None  # None: the message's retain flag


@dataclass(frozen=True, slots=True)
class SubscriptionRule:
    """Upstream messages on ``remote`` (a topic filter) are published locally on
    ``local``; subscribed upstream with maximum QoS ``qos``."""

    remote: str
    local: str = TOPIC
    qos: int = 1


@dataclass(slots=True)
class OutboxLimits:
    """Bounds of one bridge's outbox. 0 means no limit for ``max_messages``,
    ``max_bytes`` and ``max_age``. The memory settings are internal: how much of the
    queue is kept in memory in front of the disk (the rest is read back in batches)."""

    max_messages: int = 1_000_000
    max_bytes: int = 256 << 20
    max_age: float = 0.0
    drop_oldest: bool = True
    memory_bytes: int = 8 << 20
    memory_entries: int = 20_000
    refill_batch: int = 2_000


@dataclass(slots=True)
class BackoffSettings:
    """Reconnect delays: ``initial`` doubled after every failed attempt up to ``max``,
    each multiplied by a random factor in ``[1 - jitter, 1 + jitter]`` (capped at
    ``max``)."""

    initial: float = 1.0
    max: float = 60.0
    jitter: float = 0.2


@dataclass(slots=True)
class BridgeSettings:
    name: str
    host: str
    port: int
    protocol_level: int = 4
    client_id: str = ""
    username: str | None = None
    password: bytes | None = None
    clean_start: bool = False
    keepalive: int = 60
    session_expiry_interval: int = 7 * 86400  # MQTT 5 only
    bridge_mode: bool = False  # MQTT 3.x: announce a bridge (protocol level | 0x80)
    connect_timeout: float = 10.0
    max_inflight: int = 32
    drain_rate: float = 0.0  # messages per second upstream; 0 = no limit
    backoff: BackoffSettings = field(default_factory=BackoffSettings)
    outbox: OutboxLimits = field(default_factory=OutboxLimits)
    forwards: tuple[ForwardRule, ...] = ()
    subscriptions: tuple[SubscriptionRule, ...] = ()
    tls: BridgeTls | None = None  # None: plain TCP

    @property
    def upstream(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'mqtts' if self.tls is not None else 'mqtt'}://{host}:{self.port}"


def settings_from_config(name: str, conf: MqttBridge, node_name: str) -> BridgeSettings:
    """Plain settings for bridge ``name``; the client id defaults to
    ``"<node name>:bridge:<name>"`` (stable across restarts, as a persistent session
    upstream needs)."""
    from gateway.config.schema import parse_bind

    host, port = parse_bind(conf.server)
    o = conf.outbox
    r = conf.reconnect
    return BridgeSettings(
        name=name,
        host=host,
        port=port,
        protocol_level=PROTOCOL_LEVELS[conf.proto_ver],
        client_id=conf.clientid or f"{node_name}:bridge:{name}",
        username=conf.username,
        password=conf.password.encode() if conf.password is not None else None,
        clean_start=conf.clean_start,
        keepalive=int(conf.keepalive),
        session_expiry_interval=int(conf.session_expiry_interval),
        bridge_mode=conf.bridge_mode,
        connect_timeout=conf.connect_timeout,
        max_inflight=conf.max_inflight,
        drain_rate=o.drain_rate,
        backoff=BackoffSettings(r.initial, r.max, r.jitter),
        outbox=OutboxLimits(
            max_messages=o.max_messages,
            max_bytes=o.max_bytes,
            max_age=o.max_age,
            drop_oldest=o.overflow == "drop_oldest",
        ),
        forwards=tuple(
            ForwardRule(
                f.local,
                f.remote,
                None if f.qos == "${qos}" else int(f.qos),
                None if f.retain == "${retain}" else bool(f.retain),
            )
            for f in conf.forwards
        ),
        subscriptions=tuple(
            SubscriptionRule(s.remote, s.local, s.qos) for s in conf.subscriptions
        ),
        tls=conf.tls if conf.tls.enable else None,
    )
