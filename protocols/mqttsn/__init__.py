"""MQTT-SN 1.2: a sans-IO codec (whole datagrams in and out), the gateway channel, and
a client for tests and the HIL rig.

- :mod:`protocols.mqttsn.packets`: the messages, frozen dataclasses named after the spec.
- :mod:`protocols.mqttsn.codec`: ``encode``/``decode`` and :class:`Codec` (role-aware).
- :mod:`protocols.mqttsn.channel`: :class:`MqttSnChannel`, the gateway's state machine.
- :mod:`protocols.mqttsn.client`: :class:`MqttSnClient`, our own client (asyncio UDP).
"""

from protocols.mqttsn.codec import (
    Codec,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    Role,
    decode,
    encode,
)
from protocols.mqttsn.packets import NORMAL, PREDEFINED, SHORT, MsgType, ReturnCode

__all__ = [
    "Codec",
    "LocalProtocolError",
    "ProtocolError",
    "RemoteProtocolError",
    "Role",
    "decode",
    "encode",
    "NORMAL",
    "PREDEFINED",
    "SHORT",
    "MsgType",
    "ReturnCode",
]
