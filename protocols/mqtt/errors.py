"""Protocol errors, split the h11 way.

- :class:`RemoteProtocolError`: the peer sent something invalid. It carries the MQTT 5
  reason code to answer with (in a CONNACK before the session exists, in a DISCONNECT
  after) and the :class:`Violation` that caused it.
- :class:`LocalProtocolError`: we were asked to send something invalid (a bug on our side
  or a caller's misuse of the codec).

Every violation the codec can detect is a member of :class:`Violation`; the one table
``VIOLATION_REASON`` maps each to its reason code.
"""

from __future__ import annotations

from enum import Enum

from protocols.mqtt.reason_codes import ReasonCode


class Violation(Enum):
    MALFORMED_REMAINING_LENGTH = "malformed remaining length"
    RESERVED_FLAGS = "reserved fixed-header flags set"
    UNKNOWN_PACKET_TYPE = "unknown packet type"
    TRUNCATED = "packet shorter than its contents require"
    TRAILING_BYTES = "packet longer than its contents"
    INVALID_UTF8 = "string is not well-formed UTF-8"
    NULL_CHARACTER = "string contains U+0000"
    INVALID_QOS = "QoS 3"
    PACKET_ID_ZERO = "packet identifier 0"
    TOPIC_NAME_INVALID = "invalid topic name"
    TOPIC_FILTER_INVALID = "invalid topic filter"
    EMPTY_SUBSCRIBE = "SUBSCRIBE or UNSUBSCRIBE without topic filters"
    INVALID_PROPERTY = "property not allowed in this packet"
    DUPLICATE_PROPERTY = "property given more than once"
    INVALID_PROPERTY_VALUE = "property value out of range"
    UNKNOWN_PROPERTY = "unknown property identifier"
    INVALID_REASON_CODE = "reason code not allowed in this packet"
    PROTOCOL_NAME = "unknown protocol name"
    UNSUPPORTED_VERSION = "unsupported protocol version"
    CONNECT_FLAGS = "invalid CONNECT flags"
    FIRST_PACKET_NOT_CONNECT = "first packet is not CONNECT"
    SECOND_CONNECT = "second CONNECT"
    UNEXPECTED_PACKET = "packet not allowed in this direction"
    PACKET_TOO_LARGE = "packet exceeds the maximum packet size"
    CLIENT_ID_INVALID = "invalid client identifier"
    SUBSCRIPTION_OPTIONS = "invalid subscription options"
    MALFORMED_VARIABLE_INTEGER = "variable byte integer longer than 4 bytes"
    CONNACK_FLAGS = "invalid CONNACK acknowledge flags"
    RETAIN_HANDLING = "retain handling 3"
    SHARED_NO_LOCAL = "No Local set on a shared subscription"
    TOPIC_ALIAS_INVALID = "topic alias 0"


VIOLATION_REASON: dict[Violation, ReasonCode] = {
    Violation.MALFORMED_REMAINING_LENGTH: ReasonCode.MALFORMED_PACKET,
    Violation.RESERVED_FLAGS: ReasonCode.MALFORMED_PACKET,
    Violation.UNKNOWN_PACKET_TYPE: ReasonCode.MALFORMED_PACKET,
    Violation.TRUNCATED: ReasonCode.MALFORMED_PACKET,
    Violation.TRAILING_BYTES: ReasonCode.MALFORMED_PACKET,
    Violation.INVALID_UTF8: ReasonCode.MALFORMED_PACKET,
    Violation.NULL_CHARACTER: ReasonCode.MALFORMED_PACKET,
    Violation.INVALID_QOS: ReasonCode.MALFORMED_PACKET,
    Violation.PACKET_ID_ZERO: ReasonCode.MALFORMED_PACKET,
    Violation.TOPIC_NAME_INVALID: ReasonCode.TOPIC_NAME_INVALID,
    Violation.TOPIC_FILTER_INVALID: ReasonCode.TOPIC_FILTER_INVALID,
    Violation.EMPTY_SUBSCRIBE: ReasonCode.PROTOCOL_ERROR,
    Violation.INVALID_PROPERTY: ReasonCode.MALFORMED_PACKET,
    Violation.DUPLICATE_PROPERTY: ReasonCode.PROTOCOL_ERROR,
    Violation.INVALID_PROPERTY_VALUE: ReasonCode.PROTOCOL_ERROR,
    Violation.UNKNOWN_PROPERTY: ReasonCode.MALFORMED_PACKET,
    Violation.INVALID_REASON_CODE: ReasonCode.MALFORMED_PACKET,
    Violation.PROTOCOL_NAME: ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
    Violation.UNSUPPORTED_VERSION: ReasonCode.UNSUPPORTED_PROTOCOL_VERSION,
    Violation.CONNECT_FLAGS: ReasonCode.MALFORMED_PACKET,
    Violation.FIRST_PACKET_NOT_CONNECT: ReasonCode.PROTOCOL_ERROR,
    Violation.SECOND_CONNECT: ReasonCode.PROTOCOL_ERROR,
    Violation.UNEXPECTED_PACKET: ReasonCode.PROTOCOL_ERROR,
    Violation.PACKET_TOO_LARGE: ReasonCode.PACKET_TOO_LARGE,
    Violation.CLIENT_ID_INVALID: ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
    Violation.SUBSCRIPTION_OPTIONS: ReasonCode.MALFORMED_PACKET,
    Violation.MALFORMED_VARIABLE_INTEGER: ReasonCode.MALFORMED_PACKET,
    Violation.CONNACK_FLAGS: ReasonCode.MALFORMED_PACKET,
    Violation.RETAIN_HANDLING: ReasonCode.PROTOCOL_ERROR,
    Violation.SHARED_NO_LOCAL: ReasonCode.PROTOCOL_ERROR,
    Violation.TOPIC_ALIAS_INVALID: ReasonCode.TOPIC_ALIAS_INVALID,
}


class MQTTError(Exception):
    """Base class for every error this package raises."""


class RemoteProtocolError(MQTTError):
    """The peer broke the protocol; answer with ``reason_code`` and close."""

    def __init__(self, violation: Violation, detail: str = "") -> None:
        self.violation = violation
        self.reason_code: ReasonCode = VIOLATION_REASON[violation]
        self.detail = detail
        super().__init__(f"{violation.value}: {detail}" if detail else violation.value)


class LocalProtocolError(MQTTError):
    """We were asked to encode something the protocol does not allow."""


class OutgoingPacketTooLarge(LocalProtocolError):
    """The encoded packet exceeds the peer's Maximum Packet Size.

    Not a bug: MQTT 5 says the sender discards such a packet (a PUBLISH is dropped as if
    delivered), so callers catch this one and decide.
    """
