"""MQTT control packets as frozen dataclasses, named after the specification.

One set of classes serves MQTT 3.1, 3.1.1 and 5.0. Fields that only exist in 5.0
(properties, reason codes on acknowledgements) take their neutral defaults for older
versions; the codec drops them when encoding for 3.x and fills the defaults when
decoding 3.x.

Invariants:
- Packets are immutable; the empty :data:`NO_PROPERTIES` instance is shared. ``Publish``
  and the four acknowledgements are not frozen by the dataclass machinery (they are on
  the hot path, and a frozen dataclass costs 4x to build); treat them as immutable all
  the same.
- ``Publish.topic`` may be ``""`` only when ``properties.topic_alias`` is set (MQTT 5).
- ``Publish.packet_id`` is ``None`` exactly when ``qos == 0``.
- Reason codes are plain ints; their names live in :mod:`protocols.mqtt.reason_codes`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

__all__ = [
    "PacketType",
    "Properties",
    "NO_PROPERTIES",
    "Will",
    "Connect",
    "ConnAck",
    "Publish",
    "PubAck",
    "PubRec",
    "PubRel",
    "PubComp",
    "Subscription",
    "Subscribe",
    "SubAck",
    "Unsubscribe",
    "UnsubAck",
    "PingReq",
    "PingResp",
    "Disconnect",
    "Auth",
    "Packet",
    "MQTT_3_1",
    "MQTT_3_1_1",
    "MQTT_5",
]

MQTT_3_1 = 3
MQTT_3_1_1 = 4
MQTT_5 = 5


class PacketType(IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15


@dataclass(frozen=True, slots=True)
class Properties:
    """Every MQTT 5 property; ``None`` (or an empty tuple) means absent.

    ``subscription_identifiers`` holds the (possibly several) Subscription Identifier
    properties of a PUBLISH, or the single one of a SUBSCRIBE.
    """

    payload_format_indicator: int | None = None  # 0x01
    message_expiry_interval: int | None = None  # 0x02
    content_type: str | None = None  # 0x03
    response_topic: str | None = None  # 0x08
    correlation_data: bytes | None = None  # 0x09
    subscription_identifiers: tuple[int, ...] = ()  # 0x0B
    session_expiry_interval: int | None = None  # 0x11
    assigned_client_identifier: str | None = None  # 0x12
    server_keep_alive: int | None = None  # 0x13
    authentication_method: str | None = None  # 0x15
    authentication_data: bytes | None = None  # 0x16
    request_problem_information: int | None = None  # 0x17
    will_delay_interval: int | None = None  # 0x18
    request_response_information: int | None = None  # 0x19
    response_information: str | None = None  # 0x1A
    server_reference: str | None = None  # 0x1C
    reason_string: str | None = None  # 0x1F
    receive_maximum: int | None = None  # 0x21
    topic_alias_maximum: int | None = None  # 0x22
    topic_alias: int | None = None  # 0x23
    maximum_qos: int | None = None  # 0x24
    retain_available: int | None = None  # 0x25
    user_properties: tuple[tuple[str, str], ...] = ()  # 0x26
    maximum_packet_size: int | None = None  # 0x27
    wildcard_subscription_available: int | None = None  # 0x28
    subscription_identifier_available: int | None = None  # 0x29
    shared_subscription_available: int | None = None  # 0x2A


NO_PROPERTIES = Properties()


@dataclass(frozen=True, slots=True)
class Will:
    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Connect:
    client_id: str
    protocol_level: int = MQTT_3_1_1  # 3 = 3.1 ("MQIsdp"), 4 = 3.1.1, 5 = 5.0
    clean_start: bool = True
    keepalive: int = 60
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = NO_PROPERTIES

    @property
    def protocol_name(self) -> str:
        return "MQIsdp" if self.protocol_level == MQTT_3_1 else "MQTT"


@dataclass(frozen=True, slots=True)
class ConnAck:
    session_present: bool = False
    reason_code: int = 0  # for 3.x: the CONNACK return code 0..5
    properties: Properties = NO_PROPERTIES


# Not frozen: a frozen dataclass's __init__ sets each field through object.__setattr__,
# about 4x the cost of plain slot stores, and a PUBLISH is decoded for every message
# (bench/README.md). Treat it as immutable all the same; it stays hashable.
@dataclass(slots=True, unsafe_hash=True)
class Publish:
    topic: str
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = NO_PROPERTIES
    # the packet's bytes as received (set by Connection; None for a packet built here):
    # not part of the packet's value, and not copied by dataclasses.replace
    raw: bytes | None = field(default=None, init=False, compare=False, repr=False)


@dataclass(slots=True, unsafe_hash=True)  # not frozen: see Publish
class PubAck:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(slots=True, unsafe_hash=True)  # not frozen: see Publish
class PubRec:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(slots=True, unsafe_hash=True)  # not frozen: see Publish
class PubRel:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(slots=True, unsafe_hash=True)  # not frozen: see Publish
class PubComp:
    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Subscription:
    topic_filter: str
    qos: int = 0  # maximum QoS
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0


@dataclass(frozen=True, slots=True)
class Subscribe:
    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class SubAck:
    packet_id: int
    reason_codes: tuple[int, ...]  # granted QoS 0..2 or failure codes (0x80 in 3.1.1)
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class UnsubAck:
    packet_id: int
    reason_codes: tuple[int, ...] = ()  # empty for 3.x (no payload)
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class PingReq:
    pass


@dataclass(frozen=True, slots=True)
class PingResp:
    pass


@dataclass(frozen=True, slots=True)
class Disconnect:
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Auth:
    reason_code: int = 0
    properties: Properties = field(default=NO_PROPERTIES)


Packet = (
    Connect
    | ConnAck
    | Publish
    | PubAck
    | PubRec
    | PubRel
    | PubComp
    | Subscribe
    | SubAck
    | Unsubscribe
    | UnsubAck
    | PingReq
    | PingResp
    | Disconnect
    | Auth
)
