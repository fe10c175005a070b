"""The MQTT-SN 1.2 codec: whole datagrams to messages and back (sans-IO).

``decode(datagram)`` returns one message or raises :class:`RemoteProtocolError`;
``encode(message)`` returns one datagram or raises :class:`LocalProtocolError`. A
:class:`Codec` adds the role (gateway or client): which messages each side may send and
receive, as a table (``SENT_BY``), so a client's codec refuses to decode a SUBSCRIBE and a
gateway's refuses to encode one.

Wire rules (MQTT-SN 1.2, section 5):
- Length is one byte (2..255) or 0x01 followed by two bytes (256..65535); it counts the
  whole message, and a datagram whose length field disagrees with its size is malformed.
- Flags: DUP (bit 7), QoS (bits 6-5; 0b11 is QoS -1), Retain (4), Will (3),
  CleanSession (2), TopicIdType (bits 1-0; 0b11 is reserved).
- Strings (client id, topic names) are UTF-8; anything else is malformed.
- ENCAPSULATED (0xFE): its length counts only its own header (length, type, ctrl,
  wireless node id); the rest of the datagram is the relayed message, undecoded.
"""

from __future__ import annotations

from enum import Enum

from protocols.mqttsn.packets import (
    MSG_TYPE,
    NORMAL,
    PREDEFINED,
    SHORT,
    Advertise,
    ConnAck,
    Connect,
    Disconnect,
    Encapsulated,
    GwInfo,
    MsgType,
    Packet,
    PingReq,
    PingResp,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    RegAck,
    Register,
    SearchGw,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    WillMsg,
    WillMsgReq,
    WillMsgResp,
    WillMsgUpd,
    WillTopic,
    WillTopicReq,
    WillTopicResp,
    WillTopicUpd,
)

MAX_LENGTH = 0xFFFF


class ProtocolError(Exception):
    pass


class RemoteProtocolError(ProtocolError):
    """The peer sent something that is not valid MQTT-SN (or not valid in our role)."""


class LocalProtocolError(ProtocolError):
    """We were asked to encode something invalid (a bug on our side)."""


class Role(Enum):
    GATEWAY = "gateway"
    CLIENT = "client"


_BOTH = {Role.GATEWAY, Role.CLIENT}
SENT_BY: dict[type, set[Role]] = {
    Advertise: {Role.GATEWAY},
    SearchGw: {Role.CLIENT},
    GwInfo: _BOTH,  # a client may answer on behalf of a gateway it knows
    Connect: {Role.CLIENT},
    ConnAck: {Role.GATEWAY},
    WillTopicReq: {Role.GATEWAY},
    WillTopic: {Role.CLIENT},
    WillMsgReq: {Role.GATEWAY},
    WillMsg: {Role.CLIENT},
    Register: _BOTH,
    RegAck: _BOTH,
    Publish: _BOTH,
    PubAck: _BOTH,
    PubRec: _BOTH,
    PubRel: _BOTH,
    PubComp: _BOTH,
    Subscribe: {Role.CLIENT},
    SubAck: {Role.GATEWAY},
    Unsubscribe: {Role.CLIENT},
    UnsubAck: {Role.GATEWAY},
    PingReq: _BOTH,
    PingResp: _BOTH,
    Disconnect: _BOTH,
    WillTopicUpd: {Role.CLIENT},
    WillTopicResp: {Role.GATEWAY},
    WillMsgUpd: {Role.CLIENT},
    WillMsgResp: {Role.GATEWAY},
    Encapsulated: _BOTH,
}
"""Who may send each message. Either side may *receive* an ADVERTISE or a GWINFO meant
for someone else on a broadcast network; the gateway role accepts and ignores them."""

_RECEIVABLE_BROADCAST = {Advertise, GwInfo, SearchGw}

# ------------------------------------------------------------------ flags

_QOS_BITS = {0: 0b00, 1: 0b01, 2: 0b10, -1: 0b11}
_BITS_QOS = {v: k for k, v in _QOS_BITS.items()}


def _flags(
    *,
    dup: bool = False,
    qos: int = 0,
    retain: bool = False,
    will: bool = False,
    clean: bool = False,
    tid_type: int = 0,
) -> int:
    if qos not in _QOS_BITS:
        raise LocalProtocolError(f"QoS {qos} is not -1, 0, 1 or 2")
    if tid_type not in (NORMAL, PREDEFINED, SHORT):
        raise LocalProtocolError(f"topic id type {tid_type} is reserved")
    return (
        (dup << 7)
        | (_QOS_BITS[qos] << 5)
        | (retain << 4)
        | (will << 3)
        | (clean << 2)
        | tid_type
    )


def _parse_flags(b: int) -> tuple[bool, int, bool, bool, bool, int]:
    tid_type = b & 0b11
    if tid_type == 0b11:
        raise RemoteProtocolError("reserved topic id type 0b11")
    return (
        bool(b & 0x80),
        _BITS_QOS[(b >> 5) & 0b11],
        bool(b & 0x10),
        bool(b & 0x08),
        bool(b & 0x04),
        tid_type,
    )


# ------------------------------------------------------------------ helpers


def short_topic_bytes(name: str) -> bytes:
    data = name.encode()
    if len(data) != 2:
        raise LocalProtocolError(f"a short topic name is two bytes, not {name!r}")
    return data


def _u16(value: int, what: str) -> bytes:
    if not 0 <= value <= 0xFFFF:
        raise LocalProtocolError(f"{what} {value} out of 0..65535")
    return value.to_bytes(2, "big")


def _u8(value: int, what: str) -> bytes:
    if not 0 <= value <= 0xFF:
        raise LocalProtocolError(f"{what} {value} out of 0..255")
    return bytes((value,))


def _text(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise RemoteProtocolError(f"{what} is not valid UTF-8") from None


def _topic_field(topic: int | str, tid_type: int, *, by_name: bool) -> bytes:
    """The topic part of PUBLISH (``by_name`` False) or SUBSCRIBE/UNSUBSCRIBE."""
    if tid_type == SHORT:
        if not isinstance(topic, str):
            raise LocalProtocolError("a SHORT topic is a two-character str")
        return short_topic_bytes(topic)
    if tid_type == NORMAL and by_name:
        if not isinstance(topic, str):
            raise LocalProtocolError("SUBSCRIBE/UNSUBSCRIBE by NORMAL type carry a topic name")
        return topic.encode()
    if not isinstance(topic, int) or isinstance(topic, bool):
        raise LocalProtocolError(f"topic id type {tid_type} carries an int topic id")
    return _u16(topic, "topic id")


def _parse_topic(data: bytes, tid_type: int, *, by_name: bool) -> int | str:
    if tid_type == SHORT:
        if len(data) != 2:
            raise RemoteProtocolError("a short topic name is two bytes")
        return _text(data, "short topic name")
    if tid_type == NORMAL and by_name:
        return _text(data, "topic name")
    if len(data) != 2:
        raise RemoteProtocolError("a topic id is two bytes")
    return int.from_bytes(data, "big")


# ------------------------------------------------------------------ encode


def _body(p: Packet) -> bytes:
    if isinstance(p, Publish):
        return (
            bytes((_flags(dup=p.dup, qos=p.qos, retain=p.retain, tid_type=p.topic_id_type),))
            + _topic_field(p.topic, p.topic_id_type, by_name=False)
            + _u16(p.msg_id, "msg id")
            + p.data
        )
    if isinstance(p, PubAck):
        return _u16(p.topic_id, "topic id") + _u16(p.msg_id, "msg id") + _u8(p.return_code, "rc")
    if isinstance(p, PubRec | PubRel | PubComp | UnsubAck):
        return _u16(p.msg_id, "msg id")
    if isinstance(p, Register):
        return _u16(p.topic_id, "topic id") + _u16(p.msg_id, "msg id") + p.topic_name.encode()
    if isinstance(p, RegAck):
        return _u16(p.topic_id, "topic id") + _u16(p.msg_id, "msg id") + _u8(p.return_code, "rc")
    if isinstance(p, Subscribe):
        return (
            bytes((_flags(dup=p.dup, qos=p.qos, tid_type=p.topic_id_type),))
            + _u16(p.msg_id, "msg id")
            + _topic_field(p.topic, p.topic_id_type, by_name=True)
        )
    if isinstance(p, SubAck):
        return (
            bytes((_flags(qos=p.qos),))
            + _u16(p.topic_id, "topic id")
            + _u16(p.msg_id, "msg id")
            + _u8(p.return_code, "rc")
        )
    if isinstance(p, Unsubscribe):
        return (
            bytes((_flags(tid_type=p.topic_id_type),))
            + _u16(p.msg_id, "msg id")
            + _topic_field(p.topic, p.topic_id_type, by_name=True)
        )
    if isinstance(p, PingReq):
        return p.client_id.encode() if p.client_id else b""
    if isinstance(p, PingResp | WillTopicReq | WillMsgReq):
        return b""
    if isinstance(p, Connect):
        return (
            bytes((_flags(will=p.will, clean=p.clean_session),))
            + _u8(p.protocol_id, "protocol id")
            + _u16(p.duration, "duration")
            + p.client_id.encode()
        )
    if isinstance(p, ConnAck | WillTopicResp | WillMsgResp):
        return _u8(p.return_code, "rc")
    if isinstance(p, WillTopic | WillTopicUpd):
        if not p.topic:
            return b""
        return bytes((_flags(qos=p.qos, retain=p.retain),)) + p.topic.encode()
    if isinstance(p, WillMsg | WillMsgUpd):
        return p.message
    if isinstance(p, Disconnect):
        return b"" if p.duration is None else _u16(p.duration, "duration")
    if isinstance(p, Advertise):
        return _u8(p.gw_id, "gw id") + _u16(p.duration, "duration")
    if isinstance(p, SearchGw):
        return _u8(p.radius, "radius")
    if isinstance(p, GwInfo):
        return _u8(p.gw_id, "gw id") + p.gw_add
    raise LocalProtocolError(f"cannot encode {type(p).__name__}")  # pragma: no cover


def encode(p: Packet) -> bytes:
    """One MQTT-SN message as one datagram."""
    if isinstance(p, Encapsulated):
        head_len = 3 + len(p.wireless_node_id)
        if head_len > 0xFF:
            raise LocalProtocolError("wireless node id too long")
        return (
            bytes((head_len, MsgType.ENCAPSULATED))
            + _u8(p.radius & 0b11, "radius")
            + p.wireless_node_id
            + p.message
        )
    body = _body(p)
    msg_type = MSG_TYPE[type(p)]
    n = len(body) + 2
    if n <= 0xFF:
        return bytes((n, msg_type)) + body
    n += 2
    if n > MAX_LENGTH:
        raise LocalProtocolError(f"message of {n} bytes exceeds 65535")
    return b"\x01" + n.to_bytes(2, "big") + bytes((msg_type,)) + body


# ------------------------------------------------------------------ decode


def _exact(body: bytes, n: int, name: str) -> None:
    if len(body) != n:
        raise RemoteProtocolError(f"{name}: {len(body)} bytes of body, expected {n}")


def _at_least(body: bytes, n: int, name: str) -> None:
    if len(body) < n:
        raise RemoteProtocolError(f"{name}: {len(body)} bytes of body, expected at least {n}")


def decode(datagram: bytes) -> Packet:
    """One datagram as one MQTT-SN message; :class:`RemoteProtocolError` if malformed."""
    n = len(datagram)
    if n < 2:
        raise RemoteProtocolError("datagram shorter than a message header")
    if datagram[0] == 0x01:
        if n < 4:
            raise RemoteProtocolError("three-byte length header cut short")
        length = int.from_bytes(datagram[1:3], "big")
        header = 3
        if length < 256:
            raise RemoteProtocolError("three-byte length header used for a short message")
    else:
        length = datagram[0]
        header = 1
        if length == 0:
            raise RemoteProtocolError("length 0")
    try:
        msg_type = MsgType(datagram[header])
    except ValueError:
        raise RemoteProtocolError(f"unknown message type 0x{datagram[header]:02X}") from None
    if msg_type is MsgType.ENCAPSULATED:
        if header != 1 or length < 3 or length > n:
            raise RemoteProtocolError("ENCAPSULATED: bad header length")
        inner = datagram[length:]
        if not inner:
            raise RemoteProtocolError("ENCAPSULATED without a message")
        return Encapsulated(datagram[2] & 0b11, bytes(datagram[3:length]), bytes(inner))
    if length != n:
        raise RemoteProtocolError(f"length field {length} but datagram of {n} bytes")
    body = bytes(datagram[header + 1 :])
    name = msg_type.name
    if msg_type is MsgType.PUBLISH:
        _at_least(body, 5, name)
        dup, qos, retain, _, _, tid = _parse_flags(body[0])
        return Publish(
            _parse_topic(body[1:3], tid, by_name=False),
            body[5:],
            qos,
            int.from_bytes(body[3:5], "big"),
            retain,
            dup,
            tid,
        )
    if msg_type in (MsgType.PUBACK, MsgType.REGACK):
        _exact(body, 5, name)
        cls = PubAck if msg_type is MsgType.PUBACK else RegAck
        return cls(int.from_bytes(body[0:2], "big"), int.from_bytes(body[2:4], "big"), body[4])
    if msg_type in (MsgType.PUBREC, MsgType.PUBREL, MsgType.PUBCOMP, MsgType.UNSUBACK):
        _exact(body, 2, name)
        mid = int.from_bytes(body, "big")
        if msg_type is MsgType.PUBREC:
            return PubRec(mid)
        if msg_type is MsgType.PUBREL:
            return PubRel(mid)
        if msg_type is MsgType.PUBCOMP:
            return PubComp(mid)
        return UnsubAck(mid)
    if msg_type is MsgType.REGISTER:
        _at_least(body, 5, name)
        return Register(
            int.from_bytes(body[0:2], "big"),
            int.from_bytes(body[2:4], "big"),
            _text(body[4:], "topic name"),
        )
    if msg_type in (MsgType.SUBSCRIBE, MsgType.UNSUBSCRIBE):
        _at_least(body, 4, name)
        dup, qos, _, _, _, tid = _parse_flags(body[0])
        mid = int.from_bytes(body[1:3], "big")
        topic = _parse_topic(body[3:], tid, by_name=True)
        if msg_type is MsgType.SUBSCRIBE:
            return Subscribe(mid, topic, qos, dup, tid)
        return Unsubscribe(mid, topic, tid)
    if msg_type is MsgType.SUBACK:
        _exact(body, 6, name)
        _, qos, _, _, _, _ = _parse_flags(body[0])
        return SubAck(
            int.from_bytes(body[3:5], "big"), int.from_bytes(body[1:3], "big"), qos, body[5]
        )
    if msg_type is MsgType.PINGREQ:
        return PingReq(_text(body, "client id") if body else None)
    if msg_type is MsgType.PINGRESP:
        _exact(body, 0, name)
        return PingResp()
    if msg_type is MsgType.CONNECT:
        _at_least(body, 4, name)  # an empty client id is the channel's to refuse
        _, _, _, will, clean, _ = _parse_flags(body[0])
        return Connect(
            _text(body[4:], "client id"),
            int.from_bytes(body[2:4], "big"),
            clean,
            will,
            body[1],
        )
    if msg_type in (MsgType.CONNACK, MsgType.WILLTOPICRESP, MsgType.WILLMSGRESP):
        _exact(body, 1, name)
        if msg_type is MsgType.CONNACK:
            return ConnAck(body[0])
        if msg_type is MsgType.WILLTOPICRESP:
            return WillTopicResp(body[0])
        return WillMsgResp(body[0])
    if msg_type in (MsgType.WILLTOPIC, MsgType.WILLTOPICUPD):
        cls2 = WillTopic if msg_type is MsgType.WILLTOPIC else WillTopicUpd
        if not body:
            return cls2()
        _, qos, retain, _, _, _ = _parse_flags(body[0])
        topic = _text(body[1:], "will topic")
        if not topic:
            raise RemoteProtocolError(f"{name} with flags but no topic")
        return cls2(topic, qos, retain)
    if msg_type in (MsgType.WILLMSG, MsgType.WILLMSGUPD):
        return WillMsg(body) if msg_type is MsgType.WILLMSG else WillMsgUpd(body)
    if msg_type in (MsgType.WILLTOPICREQ, MsgType.WILLMSGREQ):
        _exact(body, 0, name)
        return WillTopicReq() if msg_type is MsgType.WILLTOPICREQ else WillMsgReq()
    if msg_type is MsgType.DISCONNECT:
        if not body:
            return Disconnect()
        _exact(body, 2, name)
        return Disconnect(int.from_bytes(body, "big"))
    if msg_type is MsgType.ADVERTISE:
        _exact(body, 3, name)
        return Advertise(body[0], int.from_bytes(body[1:3], "big"))
    if msg_type is MsgType.SEARCHGW:
        _exact(body, 1, name)
        return SearchGw(body[0])
    if msg_type is MsgType.GWINFO:
        _at_least(body, 1, name)
        return GwInfo(body[0], body[1:])
    raise RemoteProtocolError(f"unexpected message type {name}")  # pragma: no cover


class Codec:
    """The codec in one role: refuses to decode what the other side may not send, and
    to encode what this side may not send."""

    def __init__(self, role: Role) -> None:
        self.role = role
        self.peer_role = Role.CLIENT if role is Role.GATEWAY else Role.GATEWAY

    def decode(self, datagram: bytes) -> Packet:
        p = decode(datagram)
        kind = type(p)
        if self.peer_role not in SENT_BY[kind] and kind not in _RECEIVABLE_BROADCAST:
            raise RemoteProtocolError(f"a {self.peer_role.value} does not send {kind.__name__}")
        return p

    def encode(self, p: Packet) -> bytes:
        if self.role not in SENT_BY[type(p)]:
            raise LocalProtocolError(f"a {self.role.value} does not send {type(p).__name__}")
        return encode(p)
