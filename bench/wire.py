"""Hand-encoded MQTT 3.1.1 packets and a minimal receive-side scanner for the load generator.

The load generator never decodes packets into objects: it pre-encodes everything it sends
once (CONNECT, SUBSCRIBE, a ring of PUBLISH packets per publisher, DISCONNECT) and, on
receive, walks the fixed headers of the byte stream to count PUBLISH packets, answer
PUBACK for QoS 1 deliveries and read the send timestamp where a scenario asks for latency.

This module is independent of the broker's own codec on purpose: a bug or a slowdown in
``protocols.mqtt`` must not hide in the yardstick.

Invariants:
- Every function returns whole packets as ``bytes``.
- Packet ids in a publisher's ring run 1..len(ring); a publisher keeps fewer packets in
  flight than the ring holds, so an id is never reused before its PUBACK (brokers acknowledge
  one connection's publishes in order).
- Timestamped payloads start with 8 bytes of ``time.monotonic_ns()`` (big-endian), which is
  one clock for every process on the host.
"""

from __future__ import annotations

import os
import struct

PROTOCOL_LEVEL = 4  # MQTT 3.1.1

PUBACK_HEAD = b"\x40\x02"
DISCONNECT = b"\xe0\x00"
PINGREQ = b"\xc0\x00"

# Packet types (high nibble of the first byte).
T_CONNACK = 2
T_PUBLISH = 3
T_PUBACK = 4
T_SUBACK = 9
T_PINGRESP = 13

# Payload sizes a publisher cycles through: 16..256 bytes, mean 104 B.
PAYLOAD_SIZES = (16, 32, 64, 128, 256, 48, 96, 192)

_TS = struct.Struct(">Q")


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def mqtt_str(s: str) -> bytes:
    raw = s.encode()
    return len(raw).to_bytes(2, "big") + raw


def packet(first: int, body: bytes) -> bytes:
    return bytes([first]) + varint(len(body)) + body


def connect(client_id: str, keepalive: int = 60, clean: bool = True) -> bytes:
    flags = 0x02 if clean else 0x00
    body = mqtt_str("MQTT") + bytes([PROTOCOL_LEVEL, flags]) + keepalive.to_bytes(2, "big")
    return packet(0x10, body + mqtt_str(client_id))


def subscribe(packet_id: int, topic_filter: str, qos: int) -> bytes:
    return packet(0x82, packet_id.to_bytes(2, "big") + mqtt_str(topic_filter) + bytes([qos]))


def publish(topic: str, payload: bytes, qos: int = 0, packet_id: int | None = None) -> bytes:
    body = mqtt_str(topic)
    if qos:
        assert packet_id is not None
        body += packet_id.to_bytes(2, "big")
    return packet(0x30 | (qos << 1), body + payload)


def publish_ring(topic: str, qos: int, length: int = 128) -> list[bytes]:
    """Pre-encoded PUBLISH packets (payload sizes cycling over PAYLOAD_SIZES, ids 1..length)."""
    noise = os.urandom(max(PAYLOAD_SIZES))
    ring = []
    for i in range(length):
        size = PAYLOAD_SIZES[i % len(PAYLOAD_SIZES)]
        ring.append(publish(topic, noise[:size], qos, (i + 1) if qos else None))
    return ring


class TimestampedPublish:
    """A PUBLISH whose payload starts with a send timestamp, built per message.

    The packet bytes around the timestamp are encoded once; ``build(ns, packet_id)`` only
    concatenates.
    """

    __slots__ = ("head", "tail", "qos")

    def __init__(self, topic: str, qos: int, payload_size: int = 64) -> None:
        assert payload_size >= _TS.size
        self.qos = qos
        body_len = 2 + len(topic.encode()) + (2 if qos else 0) + payload_size
        self.head = bytes([0x30 | (qos << 1)]) + varint(body_len) + mqtt_str(topic)
        self.tail = os.urandom(payload_size - _TS.size)

    def build(self, ns: int, packet_id: int = 0) -> bytes:
        if self.qos:
            return self.head + packet_id.to_bytes(2, "big") + _TS.pack(ns) + self.tail
        return self.head + _TS.pack(ns) + self.tail


def read_timestamp(data: bytes | bytearray, offset: int) -> int:
    value: int = _TS.unpack_from(data, offset)[0]
    return value
