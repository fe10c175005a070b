"""MQTT-SN 1.2 messages as frozen dataclasses, named after the specification.

Field conventions:
- ``qos`` is -1, 0, 1 or 2 (-1 is the specification's "QoS -1", flag bits 0b11).
- ``topic_id_type`` is :data:`NORMAL` (a registered topic id), :data:`PREDEFINED` (an id
  configured on both sides) or :data:`SHORT` (a two-character topic name carried in the
  topic id field).
- ``topic`` of :class:`Publish`, :class:`Subscribe` and :class:`Unsubscribe` is an ``int``
  for NORMAL and PREDEFINED ids, and a ``str`` for a SHORT name; SUBSCRIBE and
  UNSUBSCRIBE by NORMAL type carry a full topic name (``str``) instead of an id.
- ``msg_id`` and topic ids are 16-bit unsigned integers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

NORMAL = 0
PREDEFINED = 1
SHORT = 2
PROTOCOL_ID = 0x01


class MsgType(IntEnum):
    ADVERTISE = 0x00
    SEARCHGW = 0x01
    GWINFO = 0x02
    CONNECT = 0x04
    CONNACK = 0x05
    WILLTOPICREQ = 0x06
    WILLTOPIC = 0x07
    WILLMSGREQ = 0x08
    WILLMSG = 0x09
    REGISTER = 0x0A
    REGACK = 0x0B
    PUBLISH = 0x0C
    PUBACK = 0x0D
    PUBCOMP = 0x0E
    PUBREC = 0x0F
    PUBREL = 0x10
    SUBSCRIBE = 0x12
    SUBACK = 0x13
    UNSUBSCRIBE = 0x14
    UNSUBACK = 0x15
    PINGREQ = 0x16
    PINGRESP = 0x17
    DISCONNECT = 0x18
    WILLTOPICUPD = 0x1A
    WILLTOPICRESP = 0x1B
    WILLMSGUPD = 0x1C
    WILLMSGRESP = 0x1D
    ENCAPSULATED = 0xFE


class ReturnCode(IntEnum):
    ACCEPTED = 0x00
    CONGESTION = 0x01
    INVALID_TOPIC_ID = 0x02
    NOT_SUPPORTED = 0x03


@dataclass(frozen=True, slots=True)
class Advertise:
    gw_id: int
    duration: int  # seconds until the next ADVERTISE


@dataclass(frozen=True, slots=True)
class SearchGw:
    radius: int = 0


@dataclass(frozen=True, slots=True)
class GwInfo:
    gw_id: int
    gw_add: bytes = b""  # only when a client answers on behalf of a gateway


@dataclass(frozen=True, slots=True)
class Connect:
    client_id: str
    duration: int = 0  # keepalive, seconds
    clean_session: bool = True
    will: bool = False
    protocol_id: int = PROTOCOL_ID


@dataclass(frozen=True, slots=True)
class ConnAck:
    return_code: int = 0


@dataclass(frozen=True, slots=True)
class WillTopicReq:
    pass


@dataclass(frozen=True, slots=True)
class WillTopic:
    """An empty WILLTOPIC (``topic == ""``, no flags byte) deletes the will."""

    topic: str = ""
    qos: int = 0
    retain: bool = False


@dataclass(frozen=True, slots=True)
class WillMsgReq:
    pass


@dataclass(frozen=True, slots=True)
class WillMsg:
    message: bytes = b""


@dataclass(frozen=True, slots=True)
class Register:
    topic_id: int
    msg_id: int
    topic_name: str


@dataclass(frozen=True, slots=True)
class RegAck:
    topic_id: int
    msg_id: int
    return_code: int = 0


@dataclass(frozen=True, slots=True)
class Publish:
    topic: int | str
    data: bytes
    qos: int = 0
    msg_id: int = 0
    retain: bool = False
    dup: bool = False
    topic_id_type: int = NORMAL


@dataclass(frozen=True, slots=True)
class PubAck:
    topic_id: int
    msg_id: int
    return_code: int = 0


@dataclass(frozen=True, slots=True)
class PubRec:
    msg_id: int


@dataclass(frozen=True, slots=True)
class PubRel:
    msg_id: int


@dataclass(frozen=True, slots=True)
class PubComp:
    msg_id: int


@dataclass(frozen=True, slots=True)
class Subscribe:
    msg_id: int
    topic: int | str
    qos: int = 0
    dup: bool = False
    topic_id_type: int = NORMAL


@dataclass(frozen=True, slots=True)
class SubAck:
    msg_id: int
    topic_id: int = 0
    qos: int = 0
    return_code: int = 0


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    msg_id: int
    topic: int | str
    topic_id_type: int = NORMAL


@dataclass(frozen=True, slots=True)
class UnsubAck:
    msg_id: int


@dataclass(frozen=True, slots=True)
class PingReq:
    client_id: str | None = None  # set by a sleeping client that wakes up


@dataclass(frozen=True, slots=True)
class PingResp:
    pass


@dataclass(frozen=True, slots=True)
class Disconnect:
    duration: int | None = None  # set by a client going to sleep


@dataclass(frozen=True, slots=True)
class WillTopicUpd:
    """An empty WILLTOPICUPD (``topic == ""``) deletes the will."""

    topic: str = ""
    qos: int = 0
    retain: bool = False


@dataclass(frozen=True, slots=True)
class WillTopicResp:
    return_code: int = 0


@dataclass(frozen=True, slots=True)
class WillMsgUpd:
    message: bytes = b""


@dataclass(frozen=True, slots=True)
class WillMsgResp:
    return_code: int = 0


@dataclass(frozen=True, slots=True)
class Encapsulated:
    """A message relayed by a forwarder (section 5.5): ``message`` is the whole inner
    MQTT-SN message, undecoded."""

    radius: int
    wireless_node_id: bytes
    message: bytes


Packet = (
    Advertise
    | SearchGw
    | GwInfo
    | Connect
    | ConnAck
    | WillTopicReq
    | WillTopic
    | WillMsgReq
    | WillMsg
    | Register
    | RegAck
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
    | WillTopicUpd
    | WillTopicResp
    | WillMsgUpd
    | WillMsgResp
    | Encapsulated
)

MSG_TYPE: dict[type, MsgType] = {
    Advertise: MsgType.ADVERTISE,
    SearchGw: MsgType.SEARCHGW,
    GwInfo: MsgType.GWINFO,
    Connect: MsgType.CONNECT,
    ConnAck: MsgType.CONNACK,
    WillTopicReq: MsgType.WILLTOPICREQ,
    WillTopic: MsgType.WILLTOPIC,
    WillMsgReq: MsgType.WILLMSGREQ,
    WillMsg: MsgType.WILLMSG,
    Register: MsgType.REGISTER,
    RegAck: MsgType.REGACK,
    Publish: MsgType.PUBLISH,
    PubAck: MsgType.PUBACK,
    PubRec: MsgType.PUBREC,
    PubRel: MsgType.PUBREL,
    PubComp: MsgType.PUBCOMP,
    Subscribe: MsgType.SUBSCRIBE,
    SubAck: MsgType.SUBACK,
    Unsubscribe: MsgType.UNSUBSCRIBE,
    UnsubAck: MsgType.UNSUBACK,
    PingReq: MsgType.PINGREQ,
    PingResp: MsgType.PINGRESP,
    Disconnect: MsgType.DISCONNECT,
    WillTopicUpd: MsgType.WILLTOPICUPD,
    WillTopicResp: MsgType.WILLTOPICRESP,
    WillMsgUpd: MsgType.WILLMSGUPD,
    WillMsgResp: MsgType.WILLMSGRESP,
    Encapsulated: MsgType.ENCAPSULATED,
}
