"""Byte-building helpers for hand-written MQTT vectors, independent of the codec."""

from __future__ import annotations

from protocols.mqtt.codec import decode, read_fixed_header
from protocols.mqtt.connection import Connection, Role
from protocols.mqtt.packets import Packet


def vbi(n: int) -> bytes:
    out = bytearray()
    while True:
        n, digit = divmod(n, 128)
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def pkt(first: int, body: bytes) -> bytes:
    """A whole packet: first byte, remaining length, body."""
    return bytes((first,)) + vbi(len(body)) + body


def s(text: str | bytes) -> bytes:
    """An MQTT UTF-8 string or binary field: two byte length, then the bytes."""
    data = text.encode() if isinstance(text, str) else text
    return len(data).to_bytes(2, "big") + data


def props(*items: bytes) -> bytes:
    """A property section from already-encoded properties."""
    body = b"".join(items)
    return vbi(len(body)) + body


def connect_packet(level: int, *, flags: int = 0x02, tail: bytes | None = None) -> bytes:
    """A CONNECT at ``level`` with client id "c" unless ``tail`` replaces the payload."""
    name = "MQIsdp" if level == 3 else "MQTT"
    head = s(name) + bytes((level, flags)) + b"\x00\x3c"
    if level == 5:
        head += b"\x00"
    return pkt(0x10, head + (s("c") if tail is None else tail))


def decode_whole(raw: bytes, level: int, *, from_client: bool) -> Packet:
    """Decode one complete packet, checking its length field covers it exactly."""
    header = read_fixed_header(raw, 0, len(raw))
    assert header is not None
    first, length, header_length = header
    assert header_length + length == len(raw)
    return decode(first, raw[header_length:], level, from_client=from_client)


def server_after_connect(level: int) -> Connection:
    """A SERVER connection that has received a valid CONNECT at ``level``."""
    conn = Connection(Role.SERVER)
    conn.receive_data(connect_packet(level))
    assert conn.next_event() is not None
    assert conn.protocol_level == level
    return conn


def drain(conn: Connection) -> list[Packet]:
    out = []
    while (packet := conn.next_event()) is not None:
        out.append(packet)
    return out
