"""What MQTT allows where, as data: protocol levels, direction, flags, reason codes.

One table per rule, shared by the decoder (which raises ``RemoteProtocolError`` when a
peer breaks a rule) and the encoder (which raises ``LocalProtocolError`` when asked to).

- Direction (MQTT 5.0 section 2.1.2): a client sends CONNECT, PUBLISH, PUBACK, PUBREC,
  PUBREL, PUBCOMP, SUBSCRIBE, UNSUBSCRIBE, PINGREQ, DISCONNECT and (5.0) AUTH; a server
  sends CONNACK, PUBLISH, the four acknowledgements, SUBACK, UNSUBACK, PINGRESP and, in
  5.0 only, DISCONNECT and AUTH.
- Fixed-header flags are 0b0010 for PUBREL, SUBSCRIBE and UNSUBSCRIBE and 0 for every
  other type but PUBLISH. MQTT 3.1 also allowed DUP on those three (0b1010).
- Reason codes: the sets below list, per packet, the codes MQTT 5.0 section 3 allows.
"""

from __future__ import annotations

from protocols.mqtt.packets import MQTT_3_1, MQTT_3_1_1, MQTT_5, PacketType

__all__ = [
    "AUTH_CODES",
    "CONNACK_CODES",
    "CONNACK_V3_CODES",
    "DISCONNECT_CODES",
    "FLAGS_0010",
    "PUBACK_CODES",
    "PUBREL_CODES",
    "SUBACK_CODES",
    "SUBACK_V3_CODES",
    "SUPPORTED_LEVELS",
    "UNSUBACK_CODES",
    "allowed_types",
]

SUPPORTED_LEVELS = frozenset({MQTT_3_1, MQTT_3_1_1, MQTT_5})

CONNACK_CODES = frozenset(
    {0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C}
    | {0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F}
)
CONNACK_V3_CODES = frozenset(range(6))
PUBACK_CODES = frozenset({0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99})  # +PUBREC
PUBREL_CODES = frozenset({0x00, 0x92})  # PUBREL and PUBCOMP
SUBACK_CODES = frozenset({0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2})
SUBACK_V3_CODES = frozenset({0x00, 0x01, 0x02, 0x80})
UNSUBACK_CODES = frozenset({0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91})
DISCONNECT_CODES = frozenset(
    {0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90}
    | set(range(0x93, 0xA3))
)
AUTH_CODES = frozenset({0x00, 0x18, 0x19})

_T = PacketType
_BOTH = {_T.PUBLISH, _T.PUBACK, _T.PUBREC, _T.PUBREL, _T.PUBCOMP}
_CLIENT_V5 = frozenset(
    _BOTH | {_T.CONNECT, _T.SUBSCRIBE, _T.UNSUBSCRIBE, _T.PINGREQ, _T.DISCONNECT, _T.AUTH}
)
_CLIENT_V3 = _CLIENT_V5 - {_T.AUTH}
_SERVER_V3 = frozenset(_BOTH | {_T.CONNACK, _T.SUBACK, _T.UNSUBACK, _T.PINGRESP})
_SERVER_V5 = _SERVER_V3 | {_T.DISCONNECT, _T.AUTH}

FLAGS_0010 = frozenset({_T.PUBREL, _T.SUBSCRIBE, _T.UNSUBSCRIBE})


def allowed_types(protocol_level: int, *, from_client: bool) -> frozenset[PacketType]:
    """The packet types one side may send at a protocol level."""
    if from_client:
        return _CLIENT_V5 if protocol_level == MQTT_5 else _CLIENT_V3
    return _SERVER_V5 if protocol_level == MQTT_5 else _SERVER_V3
