"""Encode MQTT control packets (3.1, 3.1.1 and 5.0) into bytes, without I/O.

:func:`encode` is a pure function of a packet and a protocol level. PUBLISH, the hot
path, is encoded with one ``join`` and no intermediate property objects when the
properties are the shared ``NO_PROPERTIES``.

Invariants:

- Whatever ``encode`` returns, :func:`~protocols.mqtt.decoder.decode` gives back as an
  equal packet, after the 3.x drops below; what it cannot encode faithfully raises
  :class:`LocalProtocolError` (packet id 0 or missing, QoS 3, wildcards in a topic
  name, invalid topic filters, U+0000 in a string, a reason code not allowed in the
  packet, a property not allowed in the packet, values out of range).
- For 3.x: properties, the 5.0-only subscription options (No Local, Retain As
  Published, Retain Handling) and the reason codes of PUBACK, PUBREC, PUBREL, PUBCOMP
  and DISCONNECT are dropped; 5.0 CONNACK codes become 3.1.1 return codes through
  :func:`~protocols.mqtt.reason_codes.to_v3_connack`; SUBACK failure codes become 0x80.
  A failure code in a 3.x UNSUBACK and any 3.x AUTH raise: 3.x cannot say them.
- A CONNECT is encoded at its own ``protocol_level``, which must equal the argument.
- The shortest form is chosen for the optional parts of 5.0 acknowledgements,
  DISCONNECT and AUTH.

Shared PUBLISH bytes: the broker may encode a QoS 1/2 PUBLISH once (with any valid
packet id) and give every subscriber a copy with its own packet id::

    template = encode(publish, level)
    offset = publish_packet_id_offset(template)
    data = encode_publish_with_id(template, offset, packet_id)
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from protocols.mqtt.errors import LocalProtocolError, RemoteProtocolError
from protocols.mqtt.packets import (
    MQTT_5,
    NO_PROPERTIES,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
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
    UnsubAck,
    Unsubscribe,
)
from protocols.mqtt.properties import (
    ACK_PROPS,
    AUTH_PROPS,
    CONNACK_PROPS,
    CONNECT_PROPS,
    DISCONNECT_PROPS,
    PUBLISH_PROPS,
    SUBACK_PROPS,
    SUBSCRIBE_PROPS,
    UNSUBACK_PROPS,
    UNSUBSCRIBE_PROPS,
    WILL_PROPS,
    encode_properties,
)
from protocols.mqtt.reason_codes import to_v3_connack
from protocols.mqtt.rules import (
    AUTH_CODES,
    CONNACK_CODES,
    CONNACK_V3_CODES,
    DISCONNECT_CODES,
    PUBACK_CODES,
    PUBREL_CODES,
    SUBACK_CODES,
    SUPPORTED_LEVELS,
    UNSUBACK_CODES,
)
from protocols.mqtt.topics import is_shared, validate_topic_filter, validate_topic_name
from protocols.mqtt.wire import (
    U16,
    encode_binary,
    encode_string,
    encode_utf8,
    encode_varint,
    read_fixed_header,
)

__all__ = ["encode", "encode_publish", "encode_publish_with_id", "publish_packet_id_offset"]

_SHORT_PUBLISH_HEAD = struct.Struct(">BBH")  # first byte, 1-byte length, topic length
_PINGREQ = b"\xc0\x00"
_PINGRESP = b"\xd0\x00"
_DISCONNECT = b"\xe0\x00"
_AUTH = b"\xf0\x00"


def _packet(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_varint(len(body)) + body


def _packet_id(packet_id: int | None) -> bytes:
    if packet_id is None or not 0 < packet_id <= 0xFFFF:
        raise LocalProtocolError(f"invalid packet identifier {packet_id!r}")
    return U16.pack(packet_id)


def _code(code: int, allowed: frozenset[int], what: str) -> int:
    if code not in allowed:
        raise LocalProtocolError(f"reason code 0x{code:02X} not allowed in {what}")
    return code


def _qos(qos: int, what: str) -> int:
    if qos not in (0, 1, 2):
        raise LocalProtocolError(f"{what} QoS {qos!r}")
    return qos


def _topic_name(topic: str) -> None:
    try:
        validate_topic_name(topic)
    except RemoteProtocolError as exc:
        raise LocalProtocolError(str(exc)) from None


def _topic_filter(topic_filter: str) -> bytes:
    try:
        validate_topic_filter(topic_filter)
    except RemoteProtocolError as exc:
        raise LocalProtocolError(str(exc)) from None
    return encode_string(topic_filter)


def _encode_publish(p: Publish, level: int) -> bytes:
    return encode_publish(
        p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id, p.properties, level
    )


def encode_publish(
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int | None,
    props: Properties,
    level: int,
) -> bytes:
    """``encode(Publish(topic, payload, qos, retain, dup, packet_id, props), level)``
    without the packet object (the broker's delivery path); ``level`` is not checked."""
    if qos == 0:
        if packet_id is not None or dup:
            raise LocalProtocolError("QoS 0 PUBLISH with a packet id or DUP")
        packet_id_bytes = b""
    elif qos == 1 or qos == 2:
        packet_id_bytes = _packet_id(packet_id)
    else:
        raise LocalProtocolError(f"PUBLISH QoS {qos!r}")
    if "+" in topic or "#" in topic:
        raise LocalProtocolError(f"wildcard in topic name {topic!r}")
    topic_bytes = encode_utf8(topic)
    if level == MQTT_5:
        if props is NO_PROPERTIES:
            encoded_props = b"\x00"
        else:
            encoded_props = encode_properties(props, PUBLISH_PROPS, repeated_subscription_ids=True)
            if props.response_topic is not None:
                _topic_name(props.response_topic)
        if not topic_bytes and props.topic_alias is None:
            raise LocalProtocolError("empty topic name without a topic alias")
    else:
        encoded_props = b""
        if not topic_bytes:
            raise LocalProtocolError("empty topic name")
    length = 2 + len(topic_bytes) + len(packet_id_bytes) + len(encoded_props) + len(payload)
    first = 0x30 | (qos << 1)
    if dup:
        first |= 0x08
    if retain:
        first |= 0x01
    if length < 128:
        head = _SHORT_PUBLISH_HEAD.pack(first, length, len(topic_bytes))
    else:
        head = bytes((first,)) + encode_varint(length) + U16.pack(len(topic_bytes))
    return b"".join((head, topic_bytes, packet_id_bytes, encoded_props, payload))


def _encode_connect(p: Connect, level: int) -> bytes:
    if p.protocol_level != level:
        raise LocalProtocolError(f"CONNECT of level {p.protocol_level} encoded at level {level}")
    v5 = level == MQTT_5
    flags = 0x02 if p.clean_start else 0
    will = p.will
    if will is not None:
        flags |= 0x04 | (_qos(will.qos, "will") << 3) | (0x20 if will.retain else 0)
        _topic_name(will.topic)
        if v5 and will.properties.response_topic is not None:
            _topic_name(will.properties.response_topic)
    if p.username is not None:
        flags |= 0x80
    if p.password is not None:
        if p.username is None and not v5:
            raise LocalProtocolError("a 3.x CONNECT needs a user name to carry a password")
        flags |= 0x40
    if not 0 <= p.keepalive <= 0xFFFF:
        raise LocalProtocolError(f"keep alive {p.keepalive!r}")
    parts = [encode_string(p.protocol_name), bytes((level, flags)), U16.pack(p.keepalive)]
    if v5:
        parts.append(encode_properties(p.properties, CONNECT_PROPS))
    parts.append(encode_string(p.client_id))
    if will is not None:
        if v5:
            parts.append(encode_properties(will.properties, WILL_PROPS))
        parts.append(encode_string(will.topic))
        parts.append(encode_binary(will.payload))
    if p.username is not None:
        parts.append(encode_string(p.username))
    if p.password is not None:
        parts.append(encode_binary(p.password))
    return _packet(0x10, b"".join(parts))


def _encode_connack(p: ConnAck, level: int) -> bytes:
    code = p.reason_code
    if level == MQTT_5:
        _code(code, CONNACK_CODES, "CONNACK")
        tail = encode_properties(p.properties, CONNACK_PROPS)
    else:
        if code not in CONNACK_V3_CODES:
            code = to_v3_connack(_code(code, CONNACK_CODES, "CONNACK"))
        tail = b""
    if p.session_present and code:
        raise LocalProtocolError("session present on a refused CONNACK")
    return _packet(0x20, bytes((1 if p.session_present else 0, code)) + tail)


def _ack_encoder(first: int, codes: frozenset[int], what: str) -> Callable[[Any, int], bytes]:
    def encode_ack(p: PubAck | PubRec | PubRel | PubComp, level: int) -> bytes:
        packet_id = _packet_id(p.packet_id)
        if level != MQTT_5:
            return bytes((first, 2)) + packet_id
        code = _code(p.reason_code, codes, what)
        props = encode_properties(p.properties, ACK_PROPS)
        if props != b"\x00":
            return _packet(first, packet_id + bytes((code,)) + props)
        if code:
            return bytes((first, 3)) + packet_id + bytes((code,))
        return bytes((first, 2)) + packet_id

    return encode_ack


def _encode_subscribe(p: Subscribe, level: int) -> bytes:
    v5 = level == MQTT_5
    parts = [_packet_id(p.packet_id)]
    if v5:
        if len(p.properties.subscription_identifiers) > 1:
            raise LocalProtocolError("a SUBSCRIBE carries at most one subscription id")
        parts.append(encode_properties(p.properties, SUBSCRIBE_PROPS))
    if not p.subscriptions:
        raise LocalProtocolError("SUBSCRIBE without subscriptions")
    for sub in p.subscriptions:
        parts.append(_topic_filter(sub.topic_filter))
        options = _qos(sub.qos, "subscription")
        if v5:
            if sub.retain_handling not in (0, 1, 2):
                raise LocalProtocolError(f"retain handling {sub.retain_handling!r}")
            if sub.no_local and is_shared(sub.topic_filter):
                raise LocalProtocolError("No Local on a shared subscription")
            options |= sub.retain_handling << 4
            options |= (0x04 if sub.no_local else 0) | (0x08 if sub.retain_as_published else 0)
        parts.append(bytes((options,)))
    return _packet(0x82, b"".join(parts))


def _encode_suback(p: SubAck, level: int) -> bytes:
    if not p.reason_codes:
        raise LocalProtocolError("SUBACK without reason codes")
    if level == MQTT_5:
        codes = bytes(_code(code, SUBACK_CODES, "SUBACK") for code in p.reason_codes)
        props = encode_properties(p.properties, SUBACK_PROPS)
        return _packet(0x90, _packet_id(p.packet_id) + props + codes)
    v3_codes = bytearray()
    for code in p.reason_codes:
        _code(code, SUBACK_CODES, "SUBACK")
        v3_codes.append(code if code < 0x80 else 0x80)
    return _packet(0x90, _packet_id(p.packet_id) + bytes(v3_codes))


def _encode_unsubscribe(p: Unsubscribe, level: int) -> bytes:
    if not p.topic_filters:
        raise LocalProtocolError("UNSUBSCRIBE without topic filters")
    parts = [_packet_id(p.packet_id)]
    if level == MQTT_5:
        parts.append(encode_properties(p.properties, UNSUBSCRIBE_PROPS))
    parts.extend(_topic_filter(topic_filter) for topic_filter in p.topic_filters)
    return _packet(0xA2, b"".join(parts))


def _encode_unsuback(p: UnsubAck, level: int) -> bytes:
    packet_id = _packet_id(p.packet_id)
    if level != MQTT_5:
        for code in p.reason_codes:
            if _code(code, UNSUBACK_CODES, "UNSUBACK") >= 0x80:
                raise LocalProtocolError("3.x UNSUBACK cannot carry a failure reason code")
        return b"\xb0\x02" + packet_id
    if not p.reason_codes:
        raise LocalProtocolError("5.0 UNSUBACK without reason codes")
    codes = bytes(_code(code, UNSUBACK_CODES, "UNSUBACK") for code in p.reason_codes)
    return _packet(0xB0, packet_id + encode_properties(p.properties, UNSUBACK_PROPS) + codes)


def _encode_optional(first: int, code: int, props: Properties, allowed: frozenset[int]) -> bytes:
    encoded = encode_properties(props, allowed)
    if encoded != b"\x00":
        return _packet(first, bytes((code,)) + encoded)
    if code:
        return bytes((first, 1, code))
    return bytes((first, 0))


def _encode_disconnect(p: Disconnect, level: int) -> bytes:
    if level != MQTT_5:
        return _DISCONNECT
    code = _code(p.reason_code, DISCONNECT_CODES, "DISCONNECT")
    return _encode_optional(0xE0, code, p.properties, DISCONNECT_PROPS)


def _encode_auth(p: Auth, level: int) -> bytes:
    if level != MQTT_5:
        raise LocalProtocolError("AUTH exists only in MQTT 5.0")
    code = _code(p.reason_code, AUTH_CODES, "AUTH")
    return _encode_optional(0xF0, code, p.properties, AUTH_PROPS)


_ENCODERS: dict[type, Callable[[Any, int], bytes]] = {
    Connect: _encode_connect,
    ConnAck: _encode_connack,
    PubAck: _ack_encoder(0x40, PUBACK_CODES, "PUBACK"),
    PubRec: _ack_encoder(0x50, PUBACK_CODES, "PUBREC"),
    PubRel: _ack_encoder(0x62, PUBREL_CODES, "PUBREL"),
    PubComp: _ack_encoder(0x70, PUBREL_CODES, "PUBCOMP"),
    Subscribe: _encode_subscribe,
    SubAck: _encode_suback,
    Unsubscribe: _encode_unsubscribe,
    UnsubAck: _encode_unsuback,
    PingReq: lambda p, level: _PINGREQ,
    PingResp: lambda p, level: _PINGRESP,
    Disconnect: _encode_disconnect,
    Auth: _encode_auth,
}


def encode(packet: Packet, protocol_level: int) -> bytes:
    """The complete bytes of ``packet`` (fixed header included) at ``protocol_level``."""
    if type(packet) is Publish:
        if protocol_level not in SUPPORTED_LEVELS:
            raise LocalProtocolError(f"unsupported protocol level {protocol_level!r}")
        return _encode_publish(packet, protocol_level)
    if protocol_level not in SUPPORTED_LEVELS:
        raise LocalProtocolError(f"unsupported protocol level {protocol_level!r}")
    encoder = _ENCODERS.get(type(packet))
    if encoder is None:
        raise LocalProtocolError(f"not an MQTT packet: {packet!r}")
    return encoder(packet, protocol_level)


def publish_packet_id_offset(encoded: bytes) -> int:
    """Where the two-byte packet identifier sits in an encoded QoS 1/2 PUBLISH."""
    header = read_fixed_header(encoded, 0, len(encoded))
    if header is None or header[0] >> 4 != 3 or not header[0] & 0x06:
        raise LocalProtocolError("not an encoded QoS 1 or 2 PUBLISH")
    start = header[2]
    topic_length: int = U16.unpack_from(encoded, start)[0]
    return start + 2 + topic_length


def encode_publish_with_id(
    template: bytes, offset: int, packet_id: int, *, dup: bool = False
) -> bytes:
    """A copy of an encoded PUBLISH with another packet id (and DUP set if asked).

    ``offset`` comes from :func:`publish_packet_id_offset`; one copy is made.
    """
    if not 0 < packet_id <= 0xFFFF:
        raise LocalProtocolError(f"invalid packet identifier {packet_id!r}")
    if not dup or template[0] & 0x08:
        return template[:offset] + U16.pack(packet_id) + template[offset + 2 :]
    view = memoryview(template)
    return b"".join(
        (bytes((view[0] | 0x08,)), view[1:offset], U16.pack(packet_id), view[offset + 2 :])
    )
