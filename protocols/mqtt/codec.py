"""The MQTT codec: bytes to packets and back, for MQTT 3.1, 3.1.1 and 5.0, without I/O.

This module is the codec's public face; the work is done in small modules, each with
its own invariants in its docstring:

- :mod:`~protocols.mqtt.wire`: integers, strings, binary data, the fixed header;
- :mod:`~protocols.mqtt.properties`: the MQTT 5 property table and its rules;
- :mod:`~protocols.mqtt.rules`: direction, fixed-header flags, reason codes per packet;
- :mod:`~protocols.mqtt.decoder`: :func:`decode` (raises ``RemoteProtocolError``);
- :mod:`~protocols.mqtt.encoder`: :func:`encode` (raises ``LocalProtocolError``).

Contract:

- ``decode(first_byte, body, protocol_level, from_client=...)`` decodes one packet
  whose fixed header was split off with :func:`read_fixed_header`.
- ``encode(packet, protocol_level)`` returns the whole packet; for 3.x it drops what
  3.x cannot carry (properties, 5.0-only options and reason codes) and raises where
  dropping would change the meaning.
- ``decode(encode(p, level)) == p`` for every packet ``encode`` accepts at that level
  (modulo those 3.x drops); the tests check it with hypothesis for every packet type.
- Shared PUBLISH bytes: ``publish_packet_id_offset(data)`` tells where the packet id
  sits and ``encode_publish_with_id(data, offset, packet_id)`` copies with a new id.
"""

from __future__ import annotations

from protocols.mqtt.decoder import connect_protocol_level, decode, decode_publish
from protocols.mqtt.encoder import (
    encode,
    encode_publish,
    encode_publish_with_id,
    publish_packet_id_offset,
)
from protocols.mqtt.rules import SUPPORTED_LEVELS, allowed_types
from protocols.mqtt.wire import read_fixed_header

__all__ = [
    "SUPPORTED_LEVELS",
    "allowed_types",
    "connect_protocol_level",
    "decode",
    "decode_publish",
    "encode",
    "encode_publish",
    "encode_publish_with_id",
    "publish_packet_id_offset",
    "read_fixed_header",
]
