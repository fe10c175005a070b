"""MQTT 5 properties: the identifier table, which packet may carry which, value rules.

The table ``PROPERTY_TABLE`` is the single source of truth: identifier, field name of
:class:`~protocols.mqtt.packets.Properties` and wire type. The ``*_PROPS`` sets below
are the rows of MQTT 5.0 table 2-4 (section 2.2.2.2), one per packet (and one for the
Will Properties of a CONNECT payload).

Invariants:

- Decoding rejects an unknown identifier (``UNKNOWN_PROPERTY``), an identifier not in
  the packet's set (``INVALID_PROPERTY``), a second occurrence of any property except
  User Property and, in PUBLISH only, Subscription Identifier (``DUPLICATE_PROPERTY``),
  and values outside ``VALUE_RANGES`` or Authentication Data without an Authentication
  Method (``INVALID_PROPERTY_VALUE``; a Topic Alias of 0 is ``TOPIC_ALIAS_INVALID``).
- Encoding enforces the same rules with ``LocalProtocolError``, so whatever
  :func:`encode_properties` accepts, :func:`decode_properties` gives back unchanged.
- An absent property section is represented by the shared ``NO_PROPERTIES``.
"""

from __future__ import annotations

from typing import Any

from protocols.mqtt.errors import LocalProtocolError, RemoteProtocolError, Violation
from protocols.mqtt.packets import NO_PROPERTIES, Properties
from protocols.mqtt.wire import (
    MAX_VARINT,
    U16,
    U32,
    Buffer,
    encode_binary,
    encode_string,
    encode_varint,
    read_binary,
    read_string,
    read_u16,
    read_u32,
    read_varint,
    truncated,
)

__all__ = [
    "ACK_PROPS",
    "AUTH_PROPS",
    "CONNACK_PROPS",
    "CONNECT_PROPS",
    "DISCONNECT_PROPS",
    "PROPERTY_TABLE",
    "PUBLISH_PROPS",
    "SUBACK_PROPS",
    "SUBSCRIBE_PROPS",
    "UNSUBACK_PROPS",
    "UNSUBSCRIBE_PROPS",
    "VALUE_RANGES",
    "WILL_PROPS",
    "decode_properties",
    "encode_properties",
]

BYTE, U16_T, U32_T, VARINT, STRING, BINARY, PAIR = range(7)

USER_PROPERTY = 0x26
SUBSCRIPTION_IDENTIFIER = 0x0B
TOPIC_ALIAS = 0x23

PROPERTY_TABLE: tuple[tuple[int, str, int], ...] = (
    (0x01, "payload_format_indicator", BYTE),
    (0x02, "message_expiry_interval", U32_T),
    (0x03, "content_type", STRING),
    (0x08, "response_topic", STRING),
    (0x09, "correlation_data", BINARY),
    (0x0B, "subscription_identifiers", VARINT),
    (0x11, "session_expiry_interval", U32_T),
    (0x12, "assigned_client_identifier", STRING),
    (0x13, "server_keep_alive", U16_T),
    (0x15, "authentication_method", STRING),
    (0x16, "authentication_data", BINARY),
    (0x17, "request_problem_information", BYTE),
    (0x18, "will_delay_interval", U32_T),
    (0x19, "request_response_information", BYTE),
    (0x1A, "response_information", STRING),
    (0x1C, "server_reference", STRING),
    (0x1F, "reason_string", STRING),
    (0x21, "receive_maximum", U16_T),
    (0x22, "topic_alias_maximum", U16_T),
    (0x23, "topic_alias", U16_T),
    (0x24, "maximum_qos", BYTE),
    (0x25, "retain_available", BYTE),
    (0x26, "user_properties", PAIR),
    (0x27, "maximum_packet_size", U32_T),
    (0x28, "wildcard_subscription_available", BYTE),
    (0x29, "subscription_identifier_available", BYTE),
    (0x2A, "shared_subscription_available", BYTE),
)
_BY_ID: dict[int, tuple[str, int]] = {pid: (name, kind) for pid, name, kind in PROPERTY_TABLE}

CONNECT_PROPS = frozenset({0x11, 0x21, 0x27, 0x22, 0x19, 0x17, 0x26, 0x15, 0x16})
WILL_PROPS = frozenset({0x18, 0x01, 0x02, 0x03, 0x08, 0x09, 0x26})
CONNACK_PROPS = frozenset(
    {0x11, 0x21, 0x24, 0x25, 0x27, 0x12, 0x22, 0x1F, 0x26, 0x28, 0x29, 0x2A}
    | {0x13, 0x1A, 0x1C, 0x15, 0x16}
)
PUBLISH_PROPS = frozenset({0x01, 0x02, 0x23, 0x08, 0x09, 0x26, 0x0B, 0x03})
ACK_PROPS = frozenset({0x1F, 0x26})  # PUBACK, PUBREC, PUBREL, PUBCOMP
SUBSCRIBE_PROPS = frozenset({0x0B, 0x26})
SUBACK_PROPS = frozenset({0x1F, 0x26})
UNSUBSCRIBE_PROPS = frozenset({0x26})
UNSUBACK_PROPS = frozenset({0x1F, 0x26})
DISCONNECT_PROPS = frozenset({0x11, 0x1F, 0x26, 0x1C})
AUTH_PROPS = frozenset({0x15, 0x16, 0x1F, 0x26})

_TYPE_MAX = {BYTE: 0xFF, U16_T: 0xFFFF, U32_T: 0xFFFF_FFFF, VARINT: MAX_VARINT}

# Value rules beyond the wire type (MQTT 5.0 section 3): (field, lowest, highest).
VALUE_RANGES: dict[str, tuple[int, int]] = {
    "payload_format_indicator": (0, 1),
    "request_problem_information": (0, 1),
    "request_response_information": (0, 1),
    "maximum_qos": (0, 1),
    "retain_available": (0, 1),
    "wildcard_subscription_available": (0, 1),
    "subscription_identifier_available": (0, 1),
    "shared_subscription_available": (0, 1),
    "receive_maximum": (1, 0xFFFF),
    "topic_alias": (1, 0xFFFF),
    "maximum_packet_size": (1, 0xFFFF_FFFF),
    "subscription_identifiers": (1, MAX_VARINT),
}


def _bad_value(name: str, value: object) -> RemoteProtocolError:
    return RemoteProtocolError(Violation.INVALID_PROPERTY_VALUE, f"{name}={value!r}")


def decode_properties(
    buf: Buffer,
    pos: int,
    end: int,
    allowed: frozenset[int],
    *,
    repeated_subscription_ids: bool = False,
) -> tuple[Properties, int]:
    """Read a property length and the properties after it; return them and the end."""
    length, pos = read_varint(buf, pos, end)
    if length == 0:
        return NO_PROPERTIES, pos
    stop = pos + length
    if stop > end:
        raise truncated("properties")
    values: dict[str, Any] = {}
    user: list[tuple[str, str]] = []
    sub_ids: list[int] = []
    while pos < stop:
        pid = buf[pos]
        pos += 1
        spec = _BY_ID.get(pid)
        if spec is None:
            raise RemoteProtocolError(Violation.UNKNOWN_PROPERTY, f"0x{pid:02X}")
        if pid not in allowed:
            raise RemoteProtocolError(Violation.INVALID_PROPERTY, spec[0])
        name, kind = spec
        value: Any
        if kind == BYTE:
            if pos >= stop:
                raise truncated(name)
            value = buf[pos]
            pos += 1
        elif kind == U16_T:
            value, pos = read_u16(buf, pos, stop)
        elif kind == U32_T:
            value, pos = read_u32(buf, pos, stop)
        elif kind == STRING:
            value, pos = read_string(buf, pos, stop)
        elif kind == BINARY:
            value, pos = read_binary(buf, pos, stop)
        elif kind == PAIR:
            key, pos = read_string(buf, pos, stop)
            val, pos = read_string(buf, pos, stop)
            user.append((key, val))
            continue
        else:  # VARINT: only the Subscription Identifier
            value, pos = read_varint(buf, pos, stop)
            if value == 0:
                raise _bad_value(name, value)
            if sub_ids and not repeated_subscription_ids:
                raise RemoteProtocolError(Violation.DUPLICATE_PROPERTY, name)
            sub_ids.append(value)
            continue
        if name in values:
            raise RemoteProtocolError(Violation.DUPLICATE_PROPERTY, name)
        limits = VALUE_RANGES.get(name)
        if limits is not None and not limits[0] <= value <= limits[1]:
            if pid == TOPIC_ALIAS:  # MQTT-3.3.2-8: answered with 0x94, not 0x82
                raise RemoteProtocolError(Violation.TOPIC_ALIAS_INVALID, f"{name}={value}")
            raise _bad_value(name, value)
        values[name] = value
    if "authentication_data" in values and "authentication_method" not in values:
        raise _bad_value("authentication_data", "without authentication_method")
    if user:
        values["user_properties"] = tuple(user)
    if sub_ids:
        values["subscription_identifiers"] = tuple(sub_ids)
    return Properties(**values), pos


def _check_int(name: str, kind: int, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise LocalProtocolError(f"property {name} must be an int, not {value!r}")
    low, high = VALUE_RANGES.get(name, (0, _TYPE_MAX[kind]))
    if not low <= value <= high:
        raise LocalProtocolError(f"property {name} out of range: {value}")
    return value


def encode_properties(
    props: Properties,
    allowed: frozenset[int],
    *,
    repeated_subscription_ids: bool = False,
) -> bytes:
    """The property length followed by the properties, in table order."""
    if props is NO_PROPERTIES:
        return b"\x00"
    parts: list[bytes] = []
    for pid, name, kind in PROPERTY_TABLE:
        value = getattr(props, name)
        if value is None or value == ():
            continue
        if pid not in allowed:
            raise LocalProtocolError(f"property {name} is not allowed in this packet")
        if kind == PAIR:
            for key, val in value:
                parts.append(b"\x26" + encode_string(key) + encode_string(val))
        elif kind == VARINT:
            if len(value) > 1 and not repeated_subscription_ids:
                raise LocalProtocolError("only a PUBLISH may carry several subscription ids")
            for sub_id in value:
                parts.append(b"\x0b" + encode_varint(_check_int(name, kind, sub_id)))
        elif kind == STRING:
            parts.append(bytes((pid,)) + encode_string(value))
        elif kind == BINARY:
            parts.append(bytes((pid,)) + encode_binary(value))
        elif kind == BYTE:
            parts.append(bytes((pid, _check_int(name, kind, value))))
        elif kind == U16_T:
            parts.append(bytes((pid,)) + U16.pack(_check_int(name, kind, value)))
        else:
            parts.append(bytes((pid,)) + U32.pack(_check_int(name, kind, value)))
    if props.authentication_data is not None and props.authentication_method is None:
        raise LocalProtocolError("authentication_data without authentication_method")
    body = b"".join(parts)
    return encode_varint(len(body)) + body
