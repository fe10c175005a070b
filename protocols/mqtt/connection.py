"""A sans-IO MQTT connection (the h11/wsproto model): bytes in, packets out, and back.

``receive_data(data)`` buffers what the socket read; ``next_event()`` returns the next
complete packet, or ``None`` until more bytes arrive; ``send(packet)`` returns the bytes
to write. No sockets, no clocks, no asyncio: the transport shell owns those.

Invariants:

- The receive buffer is one ``bytearray`` with a read offset; consumed bytes are cut
  off only when they are at least half the buffer, so buffering costs amortised O(1)
  per byte however the stream is split. Drained, it is the shared immutable ``b""``
  (an idle connection holds no buffer of its own); the first bytes received into it
  are kept as they came when they are ``bytes`` (no copy), and turned into a
  ``bytearray`` only when more bytes must be appended to them.
- ``next_event`` checks the remaining length as soon as it is known: more than four
  length bytes is ``MALFORMED_REMAINING_LENGTH`` and a packet larger than
  ``max_incoming_packet_size`` (fixed header included) is ``PACKET_TOO_LARGE``, both
  before the body is buffered.
- SERVER role: the first packet must be CONNECT (``FIRST_PACKET_NOT_CONNECT``, checked
  on its first byte); a second CONNECT is ``SECOND_CONNECT``. The CONNECT's protocol
  name and level are checked first and set :attr:`Connection.protocol_level` before the
  rest is decoded, so a malformed 5.0 CONNECT can still be answered in 5.0. An unknown
  name or level (``PROTOCOL_NAME``, ``UNSUPPORTED_VERSION``) leaves it ``None``; the
  caller then answers ``send(ConnAck(reason_code=0x84))``, which is encoded as 3.1.1
  (return code 1) while the level is unknown.
- CLIENT role: the level comes from the constructor or from sending a ``Connect``.
- After a ``RemoteProtocolError`` the receiving side is dead: ``receive_data`` and
  ``next_event`` raise the same violation again. ``send`` keeps working, so the
  caller can still answer with a CONNACK or DISCONNECT.
- ``send`` refuses packets the role may not send (``LocalProtocolError``) and raises
  :class:`~protocols.mqtt.errors.OutgoingPacketTooLarge` above
  ``max_outgoing_packet_size`` (the peer's Maximum Packet Size, set by the caller).

A received ``Publish`` carries its bytes as received in ``raw`` (fixed header included;
``None`` when its remaining length was not in the shortest form, the only form an encoder
writes), so a broker may send them on unchanged where encoding would give the same.

Shared PUBLISH bytes bypass ``send``: encode once with :func:`encode`, then per
subscriber compare the length against ``max_outgoing_packet_size`` and patch the packet
id with :func:`encode_publish_with_id` at :func:`publish_packet_id_offset`.
"""

from __future__ import annotations

from enum import Enum

from protocols.mqtt.codec import (
    SUPPORTED_LEVELS,
    allowed_types,
    connect_protocol_level,
    decode,
    decode_publish,
    encode,
    encode_publish_with_id,
    publish_packet_id_offset,
    read_fixed_header,
)
from protocols.mqtt.errors import (
    LocalProtocolError,
    OutgoingPacketTooLarge,
    RemoteProtocolError,
    Violation,
)
from protocols.mqtt.packets import (
    MQTT_3_1_1,
    ConnAck,
    Connect,
    Disconnect,
    Packet,
    PacketType,
    PingReq,
    PubAck,
    Publish,
)

__all__ = [
    "DEFAULT_MAX_PACKET_SIZE",
    "Connection",
    "Role",
    "encode",
    "encode_publish_with_id",
    "publish_packet_id_offset",
]

DEFAULT_MAX_PACKET_SIZE = 268_435_460  # 1 + 4 + the largest remaining length
_COPY_MAX = 16384  # packet bodies up to this size are decoded from a copy, not a view
_EMPTY = b""  # the drained receive buffer, shared (immutable: receive_data never appends to it)
# The two bodiless packets a client sends without properties (every connection ends with
# one, keepalive is the other): frozen, so one instance each serves every connection.
_BODILESS_FROM_CLIENT: dict[int, Packet] = {0xE0: Disconnect(), 0xC0: PingReq()}
_PACKET_TYPE: dict[type, PacketType] = {
    cls: PacketType[cls.__name__.upper()] for cls in Packet.__args__
}


class Role(Enum):
    SERVER = "server"
    CLIENT = "client"


class Connection:
    """One end of an MQTT connection; see the module docstring for the rules."""

    # one per network connection: slots keep an idle one small
    __slots__ = (
        "_buffer",
        "_connect_received",
        "_error",
        "_from_client",
        "_offset",
        "max_incoming_packet_size",
        "max_outgoing_packet_size",
        "protocol_level",
    )

    def __init__(
        self,
        role: Role,
        *,
        protocol_level: int | None = None,
        max_incoming_packet_size: int = DEFAULT_MAX_PACKET_SIZE,
    ) -> None:
        if protocol_level is not None and protocol_level not in SUPPORTED_LEVELS:
            raise LocalProtocolError(f"unsupported protocol level {protocol_level!r}")
        self.protocol_level: int | None = protocol_level
        self.max_incoming_packet_size = max_incoming_packet_size
        self.max_outgoing_packet_size: int | None = None
        # the direction of what we receive (the role, without a slot of its own)
        self._from_client = role is Role.SERVER
        self._connect_received = False
        # _EMPTY when drained; else what is buffered from _offset on (bytes or bytearray)
        self._buffer: bytes | bytearray = _EMPTY
        self._offset = 0
        self._error: RemoteProtocolError | None = None

    @property
    def role(self) -> Role:
        return Role.SERVER if self._from_client else Role.CLIENT

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as packets."""
        return len(self._buffer) - self._offset

    def _raise_again(self) -> None:
        error = self._error
        if error is not None:
            raise RemoteProtocolError(error.violation, error.detail)

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes read from the peer (an empty ``data`` is ignored)."""
        self._raise_again()
        buffer = self._buffer
        if not buffer:  # drained (_EMPTY): keep the bytes as they came
            if data:
                self._buffer = data if type(data) is bytes else bytes(data)
                self._offset = 0
            return
        offset = self._offset
        if not isinstance(buffer, bytearray):  # the first bytes received, partial: now a bytearray
            self._buffer = bytearray(memoryview(buffer)[offset:])
            self._offset = 0
        elif offset and offset * 2 >= len(buffer):
            del buffer[:offset]
            self._offset = 0
        self._buffer += data

    def next_event(self) -> Packet | None:
        """The next complete packet, or ``None`` when more bytes are needed."""
        if self._error is not None:
            self._raise_again()
        buffer = self._buffer
        offset = self._offset
        end = len(buffer)
        if offset >= end:
            return None
        try:
            packet = self._next(buffer, offset, end)
        except RemoteProtocolError as exc:
            self._error = exc
            self._buffer = _EMPTY  # the old one may still be exported by a traceback
            self._offset = 0
            raise
        return packet

    def _next(self, buffer: bytes | bytearray, offset: int, end: int) -> Packet | None:
        server = self._from_client
        if server and not self._connect_received and buffer[offset] >> 4 != 1:
            raise RemoteProtocolError(
                Violation.FIRST_PACKET_NOT_CONNECT, f"first byte 0x{buffer[offset]:02X}"
            )
        if end - offset >= 2 and buffer[offset + 1] < 0x80:  # a one-byte length
            first = buffer[offset]
            length = buffer[offset + 1]
            header_length = 2
        else:
            header = read_fixed_header(buffer, offset, end)
            if header is None:
                return None
            first, length, header_length = header
        total = header_length + length
        if total > self.max_incoming_packet_size:
            raise RemoteProtocolError(
                Violation.PACKET_TOO_LARGE,
                f"{total} bytes, limit {self.max_incoming_packet_size}",
            )
        if end - offset < total:
            return None
        level = self.protocol_level
        if level is None and not server:
            raise LocalProtocolError("protocol level unknown: pass it or send a Connect")
        stop = offset + total
        if first == 0x40 and length == 2:
            # a plain PUBACK (every QoS 1 delivery has one), read straight from the buffer
            packet_id = (buffer[offset + 2] << 8) | buffer[offset + 3]
            if packet_id:
                if stop == end:
                    self._buffer = _EMPTY
                    stop = 0
                self._offset = stop
                return PubAck(packet_id)
        if length == 0 and server and self._connect_received:
            bodiless = _BODILESS_FROM_CLIENT.get(first)
            if bodiless is not None:  # what decode() would make of it (any level)
                if stop == end:
                    self._buffer = _EMPTY
                    stop = 0
                self._offset = stop
                return bodiless
        if first >> 4 == 3 and level is not None:
            # PUBLISH: decoded from its own bytes, which it keeps (Publish.raw) when the
            # remaining length is in the shortest form (the one an encoder writes)
            if length <= _COPY_MAX:
                raw = bytes(buffer[offset:stop])
            else:  # one copy, not two
                with memoryview(buffer) as view:
                    raw = bytes(view[offset:stop])
            if stop == end:
                self._buffer = _EMPTY
                stop = 0
            self._offset = stop
            publish = decode_publish(first & 0x0F, raw, header_length, level, server)
            # shortest form: one length byte, or a last (most significant) byte not 0
            if header_length == 2 or raw[header_length - 1]:
                publish.raw = raw
            return publish
        start = offset + header_length
        # A small packet is copied out (cheaper than a memoryview, ~0.4 us); a large one
        # is read through a view.
        body: bytes | bytearray | memoryview = (
            buffer[start:stop] if length <= _COPY_MAX else memoryview(buffer)[start:stop]
        )
        try:
            if server and first >> 4 == 1:
                if self._connect_received:
                    raise RemoteProtocolError(Violation.SECOND_CONNECT)
                level = self.protocol_level = connect_protocol_level(body)
                packet = decode(first, body, level, from_client=True)
                self._connect_received = True
            else:
                assert level is not None
                packet = decode(first, body, level, from_client=server)
        finally:
            if type(body) is memoryview:
                body.release()
        offset = stop
        if offset == end:
            self._buffer = _EMPTY
            offset = 0
        self._offset = offset
        return packet

    def send(self, packet: Packet) -> bytes:
        """The bytes of ``packet`` at this connection's protocol level."""
        ptype = _PACKET_TYPE.get(type(packet))
        if ptype is None:
            raise LocalProtocolError(f"not an MQTT packet: {packet!r}")
        client = not self._from_client
        if client and type(packet) is Connect:
            if packet.protocol_level not in SUPPORTED_LEVELS:
                raise LocalProtocolError(f"unsupported protocol level {packet.protocol_level}")
            self.protocol_level = packet.protocol_level
        level = self.protocol_level
        if level is None:
            if type(packet) is not ConnAck:
                raise LocalProtocolError("protocol level unknown: no CONNECT yet")
            level = MQTT_3_1_1  # answering an unsupported protocol level
        if ptype not in allowed_types(level, from_client=client):
            raise LocalProtocolError(f"a {self.role.value} does not send {ptype.name}")
        if client and type(packet) is Publish and packet.properties.subscription_identifiers:
            raise LocalProtocolError("a client PUBLISH carries no subscription identifier")
        data = encode(packet, level)
        limit = self.max_outgoing_packet_size
        if limit is not None and len(data) > limit:
            raise OutgoingPacketTooLarge(f"{len(data)} bytes, peer accepts {limit}")
        return data
