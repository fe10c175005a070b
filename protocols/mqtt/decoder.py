"""Decode MQTT control packets (3.1, 3.1.1 and 5.0) from their bytes, without I/O.

:func:`decode` takes one packet whose fixed header was already split off (see
:func:`~protocols.mqtt.wire.read_fixed_header`) and returns a packet dataclass, or raises
:class:`RemoteProtocolError` naming the violation.

Invariants:

- Checks run in a fixed order: packet type, direction, fixed-header flags, then the
  body front to back, so one input always gives the same violation.
- A body must be consumed exactly: missing bytes are ``TRUNCATED``, extra bytes
  ``TRAILING_BYTES``. The optional parts of 5.0 PUBACK/PUBREC/PUBREL/PUBCOMP,
  DISCONNECT and AUTH (reason code, properties) may be absent as section 3 allows.
- PUBLISH flags carry DUP/QoS/RETAIN; QoS 3 is ``INVALID_QOS`` and DUP on QoS 0 is
  ``RESERVED_FLAGS`` (MQTT-3.3.1-2). A client's PUBLISH must not carry a Subscription
  Identifier (MQTT-3.3.4-6); a server's DISCONNECT no Session Expiry (MQTT-3.14.2-2).
- CONNECT names its own protocol level, so decoding it ignores ``protocol_level``.
- Semantic checks that need configuration (client identifier length, empty client
  identifier with a persistent session, payload format validation) belong to the
  channel, which answers them with a CONNACK or a reason code, not a disconnect.
- The result never references ``body``: the caller may reuse the buffer at once.
"""

from __future__ import annotations

from collections.abc import Callable

from protocols.mqtt.errors import LocalProtocolError, RemoteProtocolError, Violation
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
    decode_properties,
)
from protocols.mqtt.rules import (
    AUTH_CODES,
    CONNACK_CODES,
    DISCONNECT_CODES,
    FLAGS_0010,
    PUBACK_CODES,
    PUBREL_CODES,
    SUBACK_CODES,
    SUBACK_V3_CODES,
    SUPPORTED_LEVELS,
    UNSUBACK_CODES,
    allowed_types,
)
from protocols.mqtt.topics import is_shared, validate_topic_filter, validate_topic_name
from protocols.mqtt.wire import Buffer, read_binary, read_string, truncated

__all__ = ["connect_protocol_level", "decode", "decode_publish"]

_T = PacketType


# -- decoding --------------------------------------------------------------------------


def _packet_id(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    if pos + 2 > end:
        raise truncated("packet identifier")
    packet_id = (buf[pos] << 8) | buf[pos + 1]
    if packet_id == 0:
        raise RemoteProtocolError(Violation.PACKET_ID_ZERO)
    return packet_id, pos + 2


def _done(pos: int, end: int) -> None:
    if pos != end:
        raise RemoteProtocolError(Violation.TRAILING_BYTES, f"{end - pos} extra bytes")


def _reason(code: int, allowed: frozenset[int], what: str) -> int:
    if code not in allowed:
        raise RemoteProtocolError(Violation.INVALID_REASON_CODE, f"{what} 0x{code:02X}")
    return code


def connect_protocol_level(body: Buffer) -> int:
    """Read and check the protocol name and level at the start of a CONNECT body.

    ``"MQTT"`` goes with level 4 or 5 and ``"MQIsdp"`` with level 3. An unknown name is
    ``PROTOCOL_NAME``; a known name with another level is ``UNSUPPORTED_VERSION``.
    Either way the caller answers with a 3.1.1-format CONNACK 0x84 (return code 1).
    """
    return _read_protocol(body)[0]


def _read_protocol(body: Buffer) -> tuple[int, int]:
    end = len(body)
    name, pos = read_string(body, 0, end)
    if pos >= end:
        raise truncated("protocol level")
    level = body[pos]
    if name == "MQTT":
        if level in (MQTT_3_1_1, MQTT_5):
            return level, pos + 1
    elif name == "MQIsdp":
        if level == MQTT_3_1:
            return level, pos + 1
    else:
        raise RemoteProtocolError(Violation.PROTOCOL_NAME, repr(name))
    raise RemoteProtocolError(Violation.UNSUPPORTED_VERSION, f"{name} level {level}")


def _decode_connect(body: Buffer, _level: int, from_client: bool) -> Connect:
    level, pos = _read_protocol(body)
    end = len(body)
    if pos + 3 > end:
        raise truncated("connect flags and keep alive")
    flags = body[pos]
    keepalive = (body[pos + 1] << 8) | body[pos + 2]
    pos += 3
    will_flag = flags & 0x04
    will_qos = (flags >> 3) & 0x03
    has_username = flags & 0x80
    has_password = flags & 0x40
    if flags & 0x01:
        raise RemoteProtocolError(Violation.CONNECT_FLAGS, "reserved bit set")
    if not will_flag and flags & 0x38:
        raise RemoteProtocolError(Violation.CONNECT_FLAGS, "will QoS/retain without will")
    if will_qos == 3:
        raise RemoteProtocolError(Violation.INVALID_QOS, "will QoS 3")
    if has_password and not has_username and level != MQTT_5:
        raise RemoteProtocolError(Violation.CONNECT_FLAGS, "password without user name")
    v5 = level == MQTT_5
    properties = NO_PROPERTIES
    if v5:
        properties, pos = decode_properties(body, pos, end, CONNECT_PROPS)
    client_id, pos = read_string(body, pos, end)
    will = None
    if will_flag:
        will_properties = NO_PROPERTIES
        if v5:
            will_properties, pos = decode_properties(body, pos, end, WILL_PROPS)
            if will_properties.response_topic is not None:
                validate_topic_name(will_properties.response_topic)
        will_topic, pos = read_string(body, pos, end)
        validate_topic_name(will_topic)
        will_payload, pos = read_binary(body, pos, end)
        will = Will(will_topic, will_payload, will_qos, bool(flags & 0x20), will_properties)
    username = password = None
    if has_username:
        username, pos = read_string(body, pos, end)
    if has_password:
        password, pos = read_binary(body, pos, end)
    _done(pos, end)
    return Connect(
        client_id, level, bool(flags & 0x02), keepalive, username, password, will, properties
    )


def _decode_connack(body: Buffer, level: int, from_client: bool) -> ConnAck:
    end = len(body)
    if end < 2:
        raise truncated("CONNACK")
    ack_flags, code = body[0], body[1]
    if ack_flags & 0xFE:
        raise RemoteProtocolError(Violation.CONNACK_FLAGS, "reserved bits set")
    properties = NO_PROPERTIES
    pos = 2
    if level == MQTT_5:
        _reason(code, CONNACK_CODES, "CONNACK")
        properties, pos = decode_properties(body, pos, end, CONNACK_PROPS)
    elif code > 5:
        raise RemoteProtocolError(Violation.INVALID_REASON_CODE, f"CONNACK return {code}")
    _done(pos, end)
    if ack_flags and code:
        raise RemoteProtocolError(Violation.CONNACK_FLAGS, "session present on failure")
    return ConnAck(bool(ack_flags), code, properties)


_PUBLISH_PROPS_FROM_CLIENT = PUBLISH_PROPS - {0x0B}  # MQTT-3.3.4-6


def _decode_publish(flags: int, body: Buffer, level: int, from_client: bool) -> Publish:
    return decode_publish(flags, body, 0, level, from_client)


def decode_publish(flags: int, buf: Buffer, start: int, level: int, from_client: bool) -> Publish:
    """A PUBLISH whose body is ``buf[start:]`` (the connection passes the whole packet
    as ``bytes``, so that the payload is one slice of it)."""
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise RemoteProtocolError(Violation.INVALID_QOS, "PUBLISH QoS 3")
    if qos == 0 and flags & 0x08:
        raise RemoteProtocolError(Violation.RESERVED_FLAGS, "DUP set on QoS 0")
    end = len(buf)
    if end - start < 2:
        raise truncated("topic length")
    pos = start + 2 + ((buf[start] << 8) | buf[start + 1])
    if pos > end:
        raise truncated("topic")
    try:
        topic = str(buf[start + 2 : pos], "utf-8")
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(Violation.INVALID_UTF8, str(exc)) from None
    if "+" in topic or "#" in topic:
        raise RemoteProtocolError(Violation.TOPIC_NAME_INVALID, repr(topic))
    if "\x00" in topic:
        raise RemoteProtocolError(Violation.NULL_CHARACTER, "in topic name")
    packet_id = None
    if qos:
        if pos + 2 > end:
            raise truncated("packet identifier")
        packet_id = (buf[pos] << 8) | buf[pos + 1]
        if packet_id == 0:
            raise RemoteProtocolError(Violation.PACKET_ID_ZERO)
        pos += 2
    properties = NO_PROPERTIES
    if level == MQTT_5:
        if pos < end and buf[pos] == 0:
            pos += 1
        else:
            allowed = _PUBLISH_PROPS_FROM_CLIENT if from_client else PUBLISH_PROPS
            properties, pos = decode_properties(
                buf, pos, end, allowed, repeated_subscription_ids=True
            )
            if properties.response_topic is not None:
                validate_topic_name(properties.response_topic)
    if not topic and properties.topic_alias is None:
        raise RemoteProtocolError(Violation.TOPIC_NAME_INVALID, "empty topic, no alias")
    return Publish(
        topic,
        bytes(buf[pos:]),
        qos,
        bool(flags & 0x01),
        bool(flags & 0x08),
        packet_id,
        properties,
    )


def _ack_decoder(
    cls: type[PubAck] | type[PubRec] | type[PubRel] | type[PubComp],
    codes: frozenset[int],
) -> Callable[[Buffer, int, bool], Packet]:
    name = cls.__name__.upper()

    def decode_ack(body: Buffer, level: int, from_client: bool) -> Packet:
        end = len(body)
        packet_id, pos = _packet_id(body, 0, end)
        if level != MQTT_5 or end == 2:
            _done(pos, end)
            return cls(packet_id)
        code = _reason(body[2], codes, name)
        if end == 3:
            return cls(packet_id, code)
        properties, pos = decode_properties(body, 3, end, ACK_PROPS)
        _done(pos, end)
        return cls(packet_id, code, properties)

    return decode_ack


def _decode_subscribe(body: Buffer, level: int, from_client: bool) -> Subscribe:
    end = len(body)
    packet_id, pos = _packet_id(body, 0, end)
    v5 = level == MQTT_5
    properties = NO_PROPERTIES
    if v5:
        properties, pos = decode_properties(body, pos, end, SUBSCRIBE_PROPS)
    subscriptions: list[Subscription] = []
    while pos < end:
        topic_filter, pos = read_string(body, pos, end)
        if pos >= end:
            raise truncated("subscription options")
        options = body[pos]
        pos += 1
        if options & (0xC0 if v5 else 0xFC):
            raise RemoteProtocolError(Violation.SUBSCRIPTION_OPTIONS, "reserved bits set")
        qos = options & 0x03
        if qos == 3:
            raise RemoteProtocolError(Violation.INVALID_QOS, "subscription QoS 3")
        retain_handling = (options >> 4) & 0x03
        if retain_handling == 3:
            raise RemoteProtocolError(Violation.RETAIN_HANDLING)
        validate_topic_filter(topic_filter)
        no_local = bool(options & 0x04)
        if no_local and is_shared(topic_filter):
            raise RemoteProtocolError(Violation.SHARED_NO_LOCAL, topic_filter)
        subscriptions.append(
            Subscription(topic_filter, qos, no_local, bool(options & 0x08), retain_handling)
        )
    if not subscriptions:
        raise RemoteProtocolError(Violation.EMPTY_SUBSCRIBE, "SUBSCRIBE")
    return Subscribe(packet_id, tuple(subscriptions), properties)


def _decode_suback(body: Buffer, level: int, from_client: bool) -> SubAck:
    end = len(body)
    packet_id, pos = _packet_id(body, 0, end)
    properties = NO_PROPERTIES
    allowed = SUBACK_V3_CODES
    if level == MQTT_5:
        properties, pos = decode_properties(body, pos, end, SUBACK_PROPS)
        allowed = SUBACK_CODES
    if pos >= end:
        raise truncated("SUBACK without return codes")
    codes = tuple(_reason(code, allowed, "SUBACK") for code in body[pos:end])
    return SubAck(packet_id, codes, properties)


def _decode_unsubscribe(body: Buffer, level: int, from_client: bool) -> Unsubscribe:
    end = len(body)
    packet_id, pos = _packet_id(body, 0, end)
    properties = NO_PROPERTIES
    if level == MQTT_5:
        properties, pos = decode_properties(body, pos, end, UNSUBSCRIBE_PROPS)
    filters: list[str] = []
    while pos < end:
        topic_filter, pos = read_string(body, pos, end)
        validate_topic_filter(topic_filter)
        filters.append(topic_filter)
    if not filters:
        raise RemoteProtocolError(Violation.EMPTY_SUBSCRIBE, "UNSUBSCRIBE")
    return Unsubscribe(packet_id, tuple(filters), properties)


def _decode_unsuback(body: Buffer, level: int, from_client: bool) -> UnsubAck:
    end = len(body)
    packet_id, pos = _packet_id(body, 0, end)
    if level != MQTT_5:
        _done(pos, end)
        return UnsubAck(packet_id)
    properties, pos = decode_properties(body, pos, end, UNSUBACK_PROPS)
    if pos >= end:
        raise truncated("UNSUBACK without reason codes")
    codes = tuple(_reason(code, UNSUBACK_CODES, "UNSUBACK") for code in body[pos:end])
    return UnsubAck(packet_id, codes, properties)


def _decode_empty(cls: type[PingReq] | type[PingResp]) -> Callable[[Buffer, int, bool], Packet]:
    def decode_empty(body: Buffer, level: int, from_client: bool) -> Packet:
        _done(0, len(body))
        return cls()

    return decode_empty


def _decode_disconnect(body: Buffer, level: int, from_client: bool) -> Disconnect:
    end = len(body)
    if level != MQTT_5 or end == 0:
        _done(0, end)
        return Disconnect()
    code = _reason(body[0], DISCONNECT_CODES, "DISCONNECT")
    if end == 1:
        return Disconnect(code)
    properties, pos = decode_properties(body, 1, end, DISCONNECT_PROPS)
    _done(pos, end)
    if not from_client and properties.session_expiry_interval is not None:
        raise RemoteProtocolError(  # MQTT-3.14.2-2
            Violation.INVALID_PROPERTY, "session expiry interval from the server"
        )
    return Disconnect(code, properties)


def _decode_auth(body: Buffer, level: int, from_client: bool) -> Auth:
    end = len(body)
    if end == 0:
        return Auth()
    code = _reason(body[0], AUTH_CODES, "AUTH")
    if end == 1:
        return Auth(code)
    properties, pos = decode_properties(body, 1, end, AUTH_PROPS)
    _done(pos, end)
    return Auth(code, properties)


_DECODERS: dict[int, Callable[[Buffer, int, bool], Packet]] = {
    _T.CONNECT: _decode_connect,
    _T.CONNACK: _decode_connack,
    _T.PUBACK: _ack_decoder(PubAck, PUBACK_CODES),
    _T.PUBREC: _ack_decoder(PubRec, PUBACK_CODES),
    _T.PUBREL: _ack_decoder(PubRel, PUBREL_CODES),
    _T.PUBCOMP: _ack_decoder(PubComp, PUBREL_CODES),
    _T.SUBSCRIBE: _decode_subscribe,
    _T.SUBACK: _decode_suback,
    _T.UNSUBSCRIBE: _decode_unsubscribe,
    _T.UNSUBACK: _decode_unsuback,
    _T.PINGREQ: _decode_empty(PingReq),
    _T.PINGRESP: _decode_empty(PingResp),
    _T.DISCONNECT: _decode_disconnect,
    _T.AUTH: _decode_auth,
}


def decode(first_byte: int, body: Buffer, protocol_level: int, *, from_client: bool) -> Packet:
    """Decode one packet given its first byte and its body (after the length).

    ``from_client`` is true when the packet travelled from a client to a server.
    Raises :class:`RemoteProtocolError` for every violation listed in the module
    docstring. ``body`` is not retained: the packet holds copies.
    """
    ptype = first_byte >> 4
    flags = first_byte & 0x0F
    if ptype == 3:  # PUBLISH, the hot path (a literal: reading _T.PUBLISH costs more)
        return _decode_publish(flags, body, protocol_level, from_client)
    if protocol_level not in SUPPORTED_LEVELS and ptype != _T.CONNECT:
        raise LocalProtocolError(f"unsupported protocol level {protocol_level}")
    if ptype == 0 or (ptype == _T.AUTH and protocol_level != MQTT_5):
        raise RemoteProtocolError(Violation.UNKNOWN_PACKET_TYPE, str(ptype))
    if ptype not in allowed_types(protocol_level, from_client=from_client):
        side = "client" if from_client else "server"
        raise RemoteProtocolError(
            Violation.UNEXPECTED_PACKET, f"{PacketType(ptype).name} from the {side}"
        )
    if ptype in FLAGS_0010:
        if flags != 0x02 and not (protocol_level == MQTT_3_1 and flags == 0x0A):
            raise RemoteProtocolError(Violation.RESERVED_FLAGS, f"flags 0x{flags:X}")
    elif flags:
        raise RemoteProtocolError(Violation.RESERVED_FLAGS, f"flags 0x{flags:X}")
    return _DECODERS[ptype](body, protocol_level, from_client)
