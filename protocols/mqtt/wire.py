"""Wire primitives shared by the MQTT codec: integers, strings, binary data.

Readers take a buffer (``bytes`` or ``memoryview``) and a position and return
``(value, new_position)``. They never return views into the buffer, so a caller may
release or resize the underlying storage as soon as a packet is decoded.

Invariants:

- Every read is bounds-checked against an explicit ``end``; running past it raises
  ``RemoteProtocolError(TRUNCATED)``, never ``IndexError`` or ``struct.error``.
- Strings are strict UTF-8 (Python's decoder already rejects surrogates, overlong forms
  and code points above U+10FFFF) and must not contain U+0000 (MQTT-1.5.4-1, -2).
- Variable byte integers are at most 4 bytes (values up to 268,435,455); non-minimal
  encodings are accepted on input and never produced on output.
- Writers raise ``LocalProtocolError`` for values that do not fit.
"""

from __future__ import annotations

import struct

from protocols.mqtt.errors import LocalProtocolError, RemoteProtocolError, Violation

__all__ = [
    "MAX_VARINT",
    "U16",
    "U32",
    "Buffer",
    "encode_binary",
    "encode_string",
    "encode_utf8",
    "encode_varint",
    "read_binary",
    "read_fixed_header",
    "read_string",
    "read_u16",
    "read_u32",
    "read_varint",
    "truncated",
]

Buffer = bytes | bytearray | memoryview

MAX_VARINT = 268_435_455
U16 = struct.Struct(">H")
U32 = struct.Struct(">I")

# Varints below 128 are one byte; cache those bytes objects.
_SMALL_VARINTS = tuple(bytes((n,)) for n in range(128))


def truncated(what: str) -> RemoteProtocolError:
    return RemoteProtocolError(Violation.TRUNCATED, what)


def read_varint(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    """Read a variable byte integer (MQTT 1.5.5)."""
    value = 0
    shift = 0
    for _ in range(4):
        if pos >= end:
            raise truncated("variable byte integer")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise RemoteProtocolError(Violation.MALFORMED_VARIABLE_INTEGER)


def read_u16(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    if pos + 2 > end:
        raise truncated("two byte integer")
    return (buf[pos] << 8) | buf[pos + 1], pos + 2


def read_u32(buf: Buffer, pos: int, end: int) -> tuple[int, int]:
    if pos + 4 > end:
        raise truncated("four byte integer")
    return U32.unpack_from(buf, pos)[0], pos + 4


def read_binary(buf: Buffer, pos: int, end: int) -> tuple[bytes, int]:
    """Read Binary Data: a two byte length then that many bytes."""
    if pos + 2 > end:
        raise truncated("binary data length")
    stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if stop > end:
        raise truncated("binary data")
    return bytes(buf[pos + 2 : stop]), stop


def read_string(buf: Buffer, pos: int, end: int) -> tuple[str, int]:
    """Read a UTF-8 Encoded String, rejecting ill-formed UTF-8 and U+0000."""
    if pos + 2 > end:
        raise truncated("string length")
    stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if stop > end:
        raise truncated("string")
    try:
        text = str(buf[pos + 2 : stop], "utf-8")
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(Violation.INVALID_UTF8, str(exc)) from None
    if "\x00" in text:
        raise RemoteProtocolError(Violation.NULL_CHARACTER)
    return text, stop


def read_fixed_header(buf: Buffer, pos: int, end: int) -> tuple[int, int, int] | None:
    """``(first_byte, remaining_length, header_length)`` of the packet at ``pos``.

    Returns ``None`` while the header is incomplete; raises
    ``MALFORMED_REMAINING_LENGTH`` as soon as a fourth length byte has its
    continuation bit set (MQTT 2.1.4), without waiting for more bytes.
    """
    if end - pos < 2:
        return None
    first = buf[pos]
    byte = buf[pos + 1]
    if byte < 0x80:
        return first, byte, 2
    value = byte & 0x7F
    shift = 7
    index = pos + 2
    while True:
        if index >= end:
            return None
        byte = buf[index]
        index += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return first, value, index - pos
        shift += 7
        if shift >= 28:
            raise RemoteProtocolError(Violation.MALFORMED_REMAINING_LENGTH)


def encode_varint(value: int) -> bytes:
    if 0 <= value < 128:
        return _SMALL_VARINTS[value]
    if not 0 <= value <= MAX_VARINT:
        raise LocalProtocolError(f"variable byte integer out of range: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_utf8(text: str) -> bytes:
    """The UTF-8 bytes of ``text``, checked for U+0000, surrogates and length."""
    if "\x00" in text:
        raise LocalProtocolError(f"U+0000 in string {text!r}")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise LocalProtocolError(f"string is not encodable as UTF-8: {exc}") from None
    if len(data) > 0xFFFF:
        raise LocalProtocolError("string longer than 65,535 bytes")
    return data


def encode_string(text: str) -> bytes:
    data = encode_utf8(text)
    return U16.pack(len(data)) + data


def encode_binary(data: bytes) -> bytes:
    if len(data) > 0xFFFF:
        raise LocalProtocolError("binary data longer than 65,535 bytes")
    return U16.pack(len(data)) + bytes(data)
