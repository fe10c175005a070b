"""MQTT 3.1, 3.1.1 and 5.0 for the gateway: packets, a sans-IO codec and connection.

The small public API::

    from protocols.mqtt import Connection, Role, Publish, encode, decode

- :mod:`~protocols.mqtt.packets`: frozen dataclasses named after the specification;
- :mod:`~protocols.mqtt.connection`: :class:`Connection` (bytes in, packets out);
- :mod:`~protocols.mqtt.codec`: :func:`encode` and :func:`decode` of single packets;
- :mod:`~protocols.mqtt.errors`: :class:`RemoteProtocolError` (the peer broke the
  protocol; carries the reason code to answer with) and :class:`LocalProtocolError`;
- :mod:`~protocols.mqtt.topics`: topic name/filter validation, shared subscriptions.
"""

from protocols.mqtt.codec import (
    decode,
    encode,
    encode_publish_with_id,
    publish_packet_id_offset,
    read_fixed_header,
)
from protocols.mqtt.connection import Connection, Role
from protocols.mqtt.errors import (
    LocalProtocolError,
    MQTTError,
    OutgoingPacketTooLarge,
    RemoteProtocolError,
    Violation,
)
from protocols.mqtt.packets import (
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    NO_PROPERTIES,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    PingReq,
    PingResp,
    Properties,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    Subscription,
    UnsubAck,
    Unsubscribe,
    Will,
)
from protocols.mqtt.reason_codes import ConnackV3, ReasonCode, to_v3_connack

__all__ = [
    "MQTT_3_1",
    "MQTT_3_1_1",
    "MQTT_5",
    "NO_PROPERTIES",
    "Auth",
    "ConnAck",
    "ConnackV3",
    "Connect",
    "Connection",
    "Disconnect",
    "LocalProtocolError",
    "MQTTError",
    "OutgoingPacketTooLarge",
    "Packet",
    "PacketType",
    "PingReq",
    "PingResp",
    "Properties",
    "PubAck",
    "PubComp",
    "PubRec",
    "PubRel",
    "Publish",
    "ReasonCode",
    "RemoteProtocolError",
    "Role",
    "SubAck",
    "Subscribe",
    "Subscription",
    "UnsubAck",
    "Unsubscribe",
    "Violation",
    "Will",
    "decode",
    "encode",
    "encode_publish_with_id",
    "publish_packet_id_offset",
    "read_fixed_header",
    "to_v3_connack",
]
