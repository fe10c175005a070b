"""A tiny MQTT packet kit for black-box tests: bytes built by hand, replies parsed by hand.

This module deliberately does not import the project's codec (``protocols.mqtt``): the
conformance suite must be able to catch a bug that the codec and the broker share. It
follows mosquitto's ``test/mosq_test.py``: builders return exact ``bytes``; a reader pulls
one packet at a time off a socket (fixed header, remaining length, body) under a timeout;
``expect_packet`` compares what arrived with what was expected and prints both, decoded,
when they differ.

Invariants:

- Builders never validate. Tests of malformed input build the bad bytes with the same
  helpers (or by hand) on purpose.
- Every read has a deadline. Nothing here sleeps; a test that expects silence asks for a
  short bounded read (``RawClient.expect_nothing``).
- ``decode`` parses only what a server sends to a client (and PUBLISH/PUBREL, which go both
  ways); it is strict about lengths so a malformed reply from the broker fails loudly.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

V31 = 3
V311 = 4
V5 = 5

CONNECT = 1
CONNACK = 2
PUBLISH = 3
PUBACK = 4
PUBREC = 5
PUBREL = 6
PUBCOMP = 7
SUBSCRIBE = 8
SUBACK = 9
UNSUBSCRIBE = 10
UNSUBACK = 11
PINGREQ = 12
PINGRESP = 13
DISCONNECT = 14
AUTH = 15

NAMES = {
    CONNECT: "CONNECT",
    CONNACK: "CONNACK",
    PUBLISH: "PUBLISH",
    PUBACK: "PUBACK",
    PUBREC: "PUBREC",
    PUBREL: "PUBREL",
    PUBCOMP: "PUBCOMP",
    SUBSCRIBE: "SUBSCRIBE",
    SUBACK: "SUBACK",
    UNSUBSCRIBE: "UNSUBSCRIBE",
    UNSUBACK: "UNSUBACK",
    PINGREQ: "PINGREQ",
    PINGRESP: "PINGRESP",
    DISCONNECT: "DISCONNECT",
    AUTH: "AUTH",
}
TYPES = {name: code for code, name in NAMES.items()}

# MQTT 5 property identifiers (section 2.2.2.2).
PAYLOAD_FORMAT_INDICATOR = 0x01
MESSAGE_EXPIRY_INTERVAL = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_IDENTIFIER = 0x0B
SESSION_EXPIRY_INTERVAL = 0x11
ASSIGNED_CLIENT_IDENTIFIER = 0x12
SERVER_KEEP_ALIVE = 0x13
AUTHENTICATION_METHOD = 0x15
AUTHENTICATION_DATA = 0x16
REQUEST_PROBLEM_INFORMATION = 0x17
WILL_DELAY_INTERVAL = 0x18
REQUEST_RESPONSE_INFORMATION = 0x19
RESPONSE_INFORMATION = 0x1A
SERVER_REFERENCE = 0x1C
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
SHARED_SUBSCRIPTION_AVAILABLE = 0x2A

_PROP_TYPES = {
    PAYLOAD_FORMAT_INDICATOR: "byte",
    MESSAGE_EXPIRY_INTERVAL: "u32",
    CONTENT_TYPE: "utf8",
    RESPONSE_TOPIC: "utf8",
    CORRELATION_DATA: "bin",
    SUBSCRIPTION_IDENTIFIER: "varint",
    SESSION_EXPIRY_INTERVAL: "u32",
    ASSIGNED_CLIENT_IDENTIFIER: "utf8",
    SERVER_KEEP_ALIVE: "u16",
    AUTHENTICATION_METHOD: "utf8",
    AUTHENTICATION_DATA: "bin",
    REQUEST_PROBLEM_INFORMATION: "byte",
    WILL_DELAY_INTERVAL: "u32",
    REQUEST_RESPONSE_INFORMATION: "byte",
    RESPONSE_INFORMATION: "utf8",
    SERVER_REFERENCE: "utf8",
    REASON_STRING: "utf8",
    RECEIVE_MAXIMUM: "u16",
    TOPIC_ALIAS_MAXIMUM: "u16",
    TOPIC_ALIAS: "u16",
    MAXIMUM_QOS: "byte",
    RETAIN_AVAILABLE: "byte",
    USER_PROPERTY: "pair",
    MAXIMUM_PACKET_SIZE: "u32",
    WILDCARD_SUBSCRIPTION_AVAILABLE: "byte",
    SUBSCRIPTION_IDENTIFIER_AVAILABLE: "byte",
    SHARED_SUBSCRIPTION_AVAILABLE: "byte",
}

# Which properties each packet may carry (MQTT 5 table 2-4); used to check the broker.
CONNACK_PROPS = frozenset(
    {
        SESSION_EXPIRY_INTERVAL,
        ASSIGNED_CLIENT_IDENTIFIER,
        SERVER_KEEP_ALIVE,
        AUTHENTICATION_METHOD,
        AUTHENTICATION_DATA,
        RESPONSE_INFORMATION,
        SERVER_REFERENCE,
        REASON_STRING,
        RECEIVE_MAXIMUM,
        TOPIC_ALIAS_MAXIMUM,
        MAXIMUM_QOS,
        RETAIN_AVAILABLE,
        USER_PROPERTY,
        MAXIMUM_PACKET_SIZE,
        WILDCARD_SUBSCRIPTION_AVAILABLE,
        SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        SHARED_SUBSCRIPTION_AVAILABLE,
    }
)
PUBLISH_PROPS = frozenset(
    {
        PAYLOAD_FORMAT_INDICATOR,
        MESSAGE_EXPIRY_INTERVAL,
        CONTENT_TYPE,
        RESPONSE_TOPIC,
        CORRELATION_DATA,
        SUBSCRIPTION_IDENTIFIER,
        TOPIC_ALIAS,
        USER_PROPERTY,
    }
)

DEFAULT_TIMEOUT = 5.0

PropList = Sequence[tuple[int, object]]


class ConnectionClosed(Exception):
    """The peer closed the connection (EOF or reset) while a packet was expected."""


class Timeout(AssertionError):
    """Nothing (or not enough) arrived before the deadline."""


# --------------------------------------------------------------------------- encoding


def varint(n: int) -> bytes:
    if n < 0:
        raise ValueError(n)
    out = bytearray()
    while True:
        byte, n = n % 128, n // 128
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def u16(n: int) -> bytes:
    return struct.pack("!H", n)


def u32(n: int) -> bytes:
    return struct.pack("!I", n)


def utf8(s: str | bytes) -> bytes:
    """A length-prefixed string; pass ``bytes`` to send invalid UTF-8 on purpose."""
    data = s.encode() if isinstance(s, str) else s
    return u16(len(data)) + data


def binary(b: bytes) -> bytes:
    return u16(len(b)) + b


def _prop_value(pid: int, value: object) -> bytes:
    kind = _PROP_TYPES[pid]
    if kind == "byte":
        assert isinstance(value, int)
        return bytes([value])
    if kind == "u16":
        assert isinstance(value, int)
        return u16(value)
    if kind == "u32":
        assert isinstance(value, int)
        return u32(value)
    if kind == "varint":
        assert isinstance(value, int)
        return varint(value)
    if kind == "utf8":
        assert isinstance(value, (str, bytes))
        return utf8(value)
    if kind == "bin":
        assert isinstance(value, bytes)
        return binary(value)
    assert isinstance(value, tuple) and len(value) == 2
    return utf8(value[0]) + utf8(value[1])


def props(items: PropList = ()) -> bytes:
    """An MQTT 5 property block: varint length then (id, value) pairs, repeats allowed."""
    body = b"".join(bytes([pid]) + _prop_value(pid, value) for pid, value in items)
    return varint(len(body)) + body


def packet(ptype: int, flags: int, body: bytes) -> bytes:
    """Fixed header (type, flags, remaining length) followed by ``body``."""
    return bytes([(ptype << 4) | (flags & 0x0F)]) + varint(len(body)) + body


@dataclass(frozen=True)
class Will:
    topic: str | bytes
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    properties: PropList = ()


def connect(
    client_id: str | bytes = "",
    *,
    proto: int = V311,
    clean: bool = True,
    keepalive: int = 60,
    will: Will | None = None,
    username: str | bytes | None = None,
    password: bytes | None = None,
    properties: PropList = (),
    proto_name: bytes | None = None,
    reserved_flag: bool = False,
) -> bytes:
    name = proto_name if proto_name is not None else (b"MQIsdp" if proto == V31 else b"MQTT")
    flags = 0
    if reserved_flag:
        flags |= 0x01
    if clean:
        flags |= 0x02
    if will is not None:
        flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
    if username is not None:
        flags |= 0x80
    if password is not None:
        flags |= 0x40
    body = utf8(name) + bytes([proto, flags]) + u16(keepalive)
    if proto == V5:
        body += props(properties)
    body += utf8(client_id)
    if will is not None:
        if proto == V5:
            body += props(will.properties)
        body += utf8(will.topic) + binary(will.payload)
    if username is not None:
        body += utf8(username)
    if password is not None:
        body += binary(password)
    return packet(CONNECT, 0, body)


def connack(
    rc: int = 0, *, session_present: bool = False, proto: int = V311, properties: PropList = ()
) -> bytes:
    body = bytes([1 if session_present else 0, rc])
    if proto == V5:
        body += props(properties)
    return packet(CONNACK, 0, body)


def publish(
    topic: str | bytes,
    payload: bytes = b"",
    *,
    qos: int = 0,
    mid: int | None = None,
    retain: bool = False,
    dup: bool = False,
    proto: int = V311,
    properties: PropList = (),
) -> bytes:
    flags = (0x08 if dup else 0) | (qos << 1) | (0x01 if retain else 0)
    body = utf8(topic)
    if qos > 0 or mid is not None:
        body += u16(mid if mid is not None else 1)
    if proto == V5:
        body += props(properties)
    return packet(PUBLISH, flags, body + payload)


def _ack(ptype: int, flags: int, mid: int, proto: int, reason: int, properties: PropList) -> bytes:
    body = u16(mid)
    if proto == V5 and (reason != 0 or properties):
        body += bytes([reason])
        if properties:
            body += props(properties)
    return packet(ptype, flags, body)


def puback(mid: int, *, proto: int = V311, reason: int = 0, properties: PropList = ()) -> bytes:
    return _ack(PUBACK, 0, mid, proto, reason, properties)


def pubrec(mid: int, *, proto: int = V311, reason: int = 0, properties: PropList = ()) -> bytes:
    return _ack(PUBREC, 0, mid, proto, reason, properties)


def pubrel(mid: int, *, proto: int = V311, reason: int = 0, properties: PropList = ()) -> bytes:
    return _ack(PUBREL, 2, mid, proto, reason, properties)


def pubcomp(mid: int, *, proto: int = V311, reason: int = 0, properties: PropList = ()) -> bytes:
    return _ack(PUBCOMP, 0, mid, proto, reason, properties)


def sub_options(qos: int = 0, *, no_local: bool = False, rap: bool = False, rh: int = 0) -> int:
    """The MQTT 5 subscription options byte (3.8.3.1)."""
    return qos | (0x04 if no_local else 0) | (0x08 if rap else 0) | (rh << 4)


def subscribe(
    mid: int,
    topics: str | bytes | Iterable[tuple[str | bytes, int]],
    qos: int = 0,
    *,
    proto: int = V311,
    properties: PropList = (),
) -> bytes:
    """``topics`` is one filter (subscribed at ``qos``) or (filter, options byte) pairs."""
    pairs = [(topics, qos)] if isinstance(topics, (str, bytes)) else list(topics)
    body = u16(mid)
    if proto == V5:
        body += props(properties)
    for topic, opts in pairs:
        body += utf8(topic) + bytes([opts])
    return packet(SUBSCRIBE, 2, body)


def suback(
    mid: int, codes: int | Sequence[int], *, proto: int = V311, properties: PropList = ()
) -> bytes:
    codes = [codes] if isinstance(codes, int) else list(codes)
    body = u16(mid) + (props(properties) if proto == V5 else b"") + bytes(codes)
    return packet(SUBACK, 0, body)


def unsubscribe(
    mid: int,
    topics: str | bytes | Iterable[str | bytes],
    *,
    proto: int = V311,
    properties: PropList = (),
) -> bytes:
    filters = [topics] if isinstance(topics, (str, bytes)) else list(topics)
    body = u16(mid) + (props(properties) if proto == V5 else b"")
    body += b"".join(utf8(t) for t in filters)
    return packet(UNSUBSCRIBE, 2, body)


def unsuback(mid: int, codes: Sequence[int] = (), *, proto: int = V311) -> bytes:
    body = u16(mid)
    if proto == V5:
        body += props() + bytes(codes)
    return packet(UNSUBACK, 0, body)


def pingreq() -> bytes:
    return packet(PINGREQ, 0, b"")


def pingresp() -> bytes:
    return packet(PINGRESP, 0, b"")


def disconnect(reason: int = 0, *, proto: int = V311, properties: PropList = ()) -> bytes:
    if proto != V5 or (reason == 0 and not properties):
        return packet(DISCONNECT, 0, b"")
    return packet(DISCONNECT, 0, bytes([reason]) + props(properties))


# --------------------------------------------------------------------------- decoding


@dataclass
class Props:
    """Decoded MQTT 5 properties, in wire order; repeats (user property, ...) kept."""

    items: list[tuple[int, object]] = field(default_factory=list)

    def get(self, pid: int, default: Any = None) -> Any:
        for key, value in self.items:
            if key == pid:
                return value
        return default

    def all(self, pid: int) -> list[Any]:
        return [value for key, value in self.items if key == pid]

    def ids(self) -> set[int]:
        return {key for key, _ in self.items}

    def __contains__(self, pid: object) -> bool:
        return any(key == pid for key, _ in self.items)

    @property
    def user(self) -> list[tuple[str, str]]:
        return self.all(USER_PROPERTY)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise AssertionError(f"broker sent a truncated packet: {self.data.hex(' ')}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def byte(self) -> int:
        return self.take(1)[0]

    def u16(self) -> int:
        return int(struct.unpack("!H", self.take(2))[0])

    def u32(self) -> int:
        return int(struct.unpack("!I", self.take(4))[0])

    def varint(self) -> int:
        value, mult = 0, 1
        for _ in range(4):
            b = self.byte()
            value += (b & 0x7F) * mult
            if not b & 0x80:
                return value
            mult *= 128
        raise AssertionError("broker sent a varint longer than 4 bytes")

    def utf8(self) -> str:
        raw = self.take(self.u16())
        text = raw.decode("utf-8")  # raises on invalid UTF-8 from the broker
        assert "\x00" not in text, "broker sent U+0000 in a UTF-8 string"
        return text

    def binary(self) -> bytes:
        return self.take(self.u16())

    def rest(self) -> bytes:
        out = self.data[self.pos :]
        self.pos = len(self.data)
        return out

    def at_end(self) -> bool:
        return self.pos >= len(self.data)

    def props(self) -> Props:
        length = self.varint()
        end = self.pos + length
        out = Props()
        while self.pos < end:
            pid = self.varint()
            kind = _PROP_TYPES.get(pid)
            if kind is None:
                raise AssertionError(f"broker sent unknown property id 0x{pid:02x}")
            value: object
            if kind == "byte":
                value = self.byte()
            elif kind == "u16":
                value = self.u16()
            elif kind == "u32":
                value = self.u32()
            elif kind == "varint":
                value = self.varint()
            elif kind == "utf8":
                value = self.utf8()
            elif kind == "bin":
                value = self.binary()
            else:
                value = (self.utf8(), self.utf8())
            out.items.append((pid, value))
        assert self.pos == end, "property length does not match its contents"
        return out


@dataclass
class Packet:
    """One packet read off the wire, with the fields of its type decoded."""

    type: int
    flags: int
    raw: bytes
    body: bytes
    proto: int = V311
    reason: int = 0
    session_present: bool = False
    mid: int = 0
    topic: str = ""
    payload: bytes = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    codes: list[int] = field(default_factory=list)
    props: Props = field(default_factory=Props)

    @property
    def name(self) -> str:
        return NAMES.get(self.type, f"TYPE{self.type}")

    def __repr__(self) -> str:
        if self.type == PUBLISH:
            return (
                f"<PUBLISH topic={self.topic!r} payload={self.payload[:64]!r} qos={self.qos} "
                f"retain={self.retain} dup={self.dup} mid={self.mid} props={self.props.items}>"
            )
        extra = f" mid={self.mid}" if self.type in (PUBACK, PUBREC, PUBREL, PUBCOMP) else ""
        if self.type in (SUBACK, UNSUBACK):
            extra = f" mid={self.mid} codes={[hex(c) for c in self.codes]}"
        if self.type == CONNACK:
            extra = f" sp={int(self.session_present)}"
        return (
            f"<{self.name}{extra} reason=0x{self.reason:02x} props={self.props.items} "
            f"raw={self.raw.hex(' ')}>"
        )


def decode(raw: bytes, proto: int = V311) -> Packet:
    """Decode one whole packet (fixed header included)."""
    first = raw[0]
    r = _Reader(raw)
    r.byte()
    length = r.varint()
    body = r.rest()
    assert len(body) == length
    pkt = Packet(type=first >> 4, flags=first & 0x0F, raw=raw, body=body, proto=proto)
    b = _Reader(body)
    t = pkt.type
    if t != PUBLISH:  # MQTT-2.2.2-1: fixed header flags are fixed for every other type
        want = 2 if t in (PUBREL, SUBSCRIBE, UNSUBSCRIBE) else 0
        assert pkt.flags == want, f"broker sent {pkt.name} with flags {pkt.flags:#x}"
    if t == CONNACK:
        ack_flags = b.byte()
        assert ack_flags & 0xFE == 0, f"CONNACK reserved ack flags set: {raw.hex(' ')}"
        pkt.session_present = bool(ack_flags & 1)
        pkt.reason = b.byte()
        if proto == V5 and not b.at_end():
            pkt.props = b.props()
    elif t == PUBLISH:
        pkt.dup = bool(pkt.flags & 0x08)
        pkt.qos = (pkt.flags >> 1) & 0x03
        pkt.retain = bool(pkt.flags & 0x01)
        assert pkt.qos != 3, "broker sent a PUBLISH with QoS 3"
        pkt.topic = b.utf8()
        if pkt.qos:
            pkt.mid = b.u16()
            assert pkt.mid != 0, "broker sent a PUBLISH with packet identifier 0"
        if proto == V5:
            pkt.props = b.props()
        pkt.payload = b.rest()
    elif t in (PUBACK, PUBREC, PUBREL, PUBCOMP):
        pkt.mid = b.u16()
        if proto == V5 and not b.at_end():
            pkt.reason = b.byte()
            if not b.at_end():
                pkt.props = b.props()
    elif t in (SUBACK, UNSUBACK):
        pkt.mid = b.u16()
        if proto == V5:
            pkt.props = b.props()
        pkt.codes = list(b.rest())
    elif t in (DISCONNECT, AUTH) and not b.at_end():
        pkt.reason = b.byte()
        if not b.at_end():
            pkt.props = b.props()
    if t != PUBLISH:
        assert b.at_end(), f"trailing bytes in {pkt.name}: {raw.hex(' ')}"
    return pkt


# --------------------------------------------------------------------------- socket I/O


def _recv_exact(sock: socket.socket, n: int, deadline: float) -> bytes:
    out = bytearray()
    while len(out) < n:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise Timeout(f"timed out with {len(out)}/{n} bytes read")
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(n - len(out))
        except TimeoutError:
            raise Timeout(f"timed out with {len(out)}/{n} bytes read") from None
        except (ConnectionResetError, ConnectionAbortedError, BrokenPipeError) as exc:
            raise ConnectionClosed(str(exc)) from None
        if not chunk:
            raise ConnectionClosed("EOF")
        out += chunk
    return bytes(out)


def read_packet(sock: socket.socket, timeout: float = DEFAULT_TIMEOUT) -> bytes:
    """One whole packet as raw bytes. Raises Timeout or ConnectionClosed."""
    deadline = time.monotonic() + timeout
    head = _recv_exact(sock, 1, deadline)
    length_bytes = b""
    value, mult = 0, 1
    while True:
        b = _recv_exact(sock, 1, deadline)
        length_bytes += b
        value += (b[0] & 0x7F) * mult
        if not b[0] & 0x80:
            break
        mult *= 128
        assert len(length_bytes) < 4, "broker sent a remaining length longer than 4 bytes"
    return head + length_bytes + _recv_exact(sock, value, deadline)


def expect_packet(
    sock: socket.socket,
    name: str,
    expected: bytes,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    proto: int = V311,
) -> bytes:
    """Read one packet and require it to equal ``expected`` byte for byte."""
    try:
        got = read_packet(sock, timeout)
    except ConnectionClosed:
        raise AssertionError(f"expected {name}, connection closed") from None
    except Timeout:
        raise Timeout(f"expected {name}, nothing arrived within {timeout}s") from None
    if got != expected:
        raise AssertionError(
            f"expected {name}\n  want {expected.hex(' ')} {decode(expected, proto)!r}\n"
            f"  got  {got.hex(' ')} {decode(got, proto)!r}"
        )
    return got


def open_socket(addr: tuple[str, int], timeout: float = DEFAULT_TIMEOUT) -> socket.socket:
    sock = socket.create_connection(addr, timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class RawClient:
    """A socket speaking hand-built MQTT, with ``expect_*`` helpers. Use as a context manager."""

    def __init__(self, addr: tuple[str, int], proto: int = V311) -> None:
        self.addr = (addr[0], addr[1])
        self.proto = proto
        self.sock = open_socket(self.addr)
        self._next_mid = 0
        # PUBLISH packets that arrived while an acknowledgement was awaited.
        self.stash: list[Packet] = []

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def mid(self) -> int:
        self._next_mid = self._next_mid % 65535 + 1
        return self._next_mid

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read(self, timeout: float = DEFAULT_TIMEOUT) -> Packet:
        """The next packet off the wire (the stash is not consulted)."""
        return decode(read_packet(self.sock, timeout), self.proto)

    def _next(self, name: str, timeout: float) -> Packet:
        """The next packet, with PUBLISH ordering relaxed.

        A PUBLISH that arrives while an acknowledgement is awaited is stashed (the broker
        may forward our own publish to us before acknowledging it) and handed out by the
        next PUBLISH expectation. Any other unexpected packet is returned to fail the caller.
        """
        if name == "PUBLISH" and self.stash:
            return self.stash.pop(0)
        deadline = time.monotonic() + timeout
        while True:
            remaining = max(deadline - time.monotonic(), 0.001)
            try:
                pkt = self.read(remaining)
            except ConnectionClosed:
                raise AssertionError(f"expected {name}, connection closed") from None
            except Timeout:
                raise Timeout(f"expected {name}, nothing arrived within {timeout}s") from None
            if pkt.type == PUBLISH and name != "PUBLISH":
                self.stash.append(pkt)
                continue
            return pkt

    def expect(self, name: str, timeout: float = DEFAULT_TIMEOUT) -> Packet:
        pkt = self._next(name, timeout)
        assert pkt.name == name, f"expected {name}, got {pkt!r}"
        return pkt

    def expect_bytes(self, name: str, expected: bytes, timeout: float = DEFAULT_TIMEOUT) -> None:
        """expect_packet on this connection (stash-aware): byte-for-byte equality."""
        pkt = self._next(name, timeout)
        if pkt.raw != expected:
            raise AssertionError(
                f"expected {name}\n  want {expected.hex(' ')} {decode(expected, self.proto)!r}"
                f"\n  got  {pkt.raw.hex(' ')} {pkt!r}"
            )

    def expect_publish(
        self,
        topic: str | None = None,
        payload: bytes | None = None,
        *,
        qos: int | None = None,
        retain: bool | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> Packet:
        pkt = self.expect("PUBLISH", timeout)
        if topic is not None:
            assert pkt.topic == topic, f"topic: want {topic!r}, got {pkt!r}"
        if payload is not None:
            assert pkt.payload == payload, f"payload: want {payload!r}, got {pkt!r}"
        if qos is not None:
            assert pkt.qos == qos, f"qos: want {qos}, got {pkt!r}"
        if retain is not None:
            assert pkt.retain == retain, f"retain: want {retain}, got {pkt!r}"
        return pkt

    def expect_nothing(self, timeout: float = 0.5) -> None:
        """Bounded silence: fail if any packet (or EOF) arrives within ``timeout``."""
        assert not self.stash, f"expected nothing, got {self.stash[0]!r}"
        try:
            pkt = self.read(timeout)
        except Timeout:
            return
        except ConnectionClosed:
            raise AssertionError("expected silence, the connection was closed") from None
        raise AssertionError(f"expected nothing, got {pkt!r}")

    def expect_closed(
        self,
        timeout: float = DEFAULT_TIMEOUT,
        *,
        disconnect_reasons: Iterable[int] | None = None,
        require_disconnect: bool = False,
    ) -> Packet | None:
        """Require the broker to close the connection within ``timeout``.

        A DISCONNECT (and for a rejected CONNECT, a CONNACK) may come first; if
        ``disconnect_reasons`` is given its reason code must be one of them. Any other
        packet fails. Returns the DISCONNECT/CONNACK seen, if any.
        """
        assert not self.stash, f"expected the connection to close, got {self.stash[0]!r}"
        deadline = time.monotonic() + timeout
        seen: Packet | None = None
        allowed = None if disconnect_reasons is None else set(disconnect_reasons)
        while True:
            remaining = deadline - time.monotonic()
            try:
                pkt = self.read(max(remaining, 0.001))
            except ConnectionClosed:
                break
            except Timeout:
                raise Timeout(f"broker did not close the connection within {timeout}s") from None
            assert pkt.type in (DISCONNECT, CONNACK) and seen is None, (
                f"expected the connection to close, got {pkt!r}"
            )
            if allowed is not None:
                assert pkt.reason in allowed, (
                    f"{pkt.name} reason 0x{pkt.reason:02x} not in "
                    f"{sorted(hex(a) for a in allowed)}: {pkt!r}"
                )
            seen = pkt
        if require_disconnect:
            assert seen is not None and seen.type == DISCONNECT, (
                "broker closed without sending DISCONNECT"
            )
        return seen

    # ---- flows

    def connect(self, client_id: str | bytes = "", *, rc: int = 0, **kw: Any) -> Packet:
        """Send CONNECT (``kw`` as for ``raw.connect``); require a CONNACK with reason ``rc``."""
        self.send(connect(client_id, proto=self.proto, **kw))
        ack = self.expect("CONNACK")
        assert ack.reason == rc, f"CONNACK reason: want 0x{rc:02x}, got {ack!r}"
        if self.proto == V5:
            unexpected = ack.props.ids() - CONNACK_PROPS
            assert not unexpected, f"CONNACK carries non-CONNACK properties {unexpected}"
        return ack

    def subscribe(
        self,
        topics: str | bytes | Iterable[tuple[str | bytes, int]],
        qos: int = 0,
        *,
        properties: PropList = (),
        codes: Sequence[int] | None = None,
    ) -> Packet:
        """Subscribe and require a SUBACK with the same packet id (and ``codes`` if given)."""
        mid = self.mid()
        self.send(subscribe(mid, topics, qos, proto=self.proto, properties=properties))
        ack = self.expect("SUBACK")
        assert ack.mid == mid, f"SUBACK packet id: want {mid}, got {ack!r}"
        if codes is None:
            n = 1 if isinstance(topics, (str, bytes)) else None
            if n == 1:
                assert ack.codes == [qos], f"SUBACK: want [{qos}], got {ack!r}"
        else:
            assert ack.codes == list(codes), f"SUBACK: want {list(codes)}, got {ack!r}"
        return ack

    def unsubscribe(self, topics: str | bytes | Iterable[str | bytes]) -> Packet:
        mid = self.mid()
        self.send(unsubscribe(mid, topics, proto=self.proto))
        ack = self.expect("UNSUBACK")
        assert ack.mid == mid, f"UNSUBACK packet id: want {mid}, got {ack!r}"
        return ack

    def publish(
        self,
        topic: str | bytes,
        payload: bytes = b"",
        *,
        qos: int = 0,
        retain: bool = False,
        properties: PropList = (),
    ) -> int:
        """Publish and complete the QoS 1/2 handshake. Returns the packet id used (0 for QoS 0)."""
        mid = self.mid() if qos else 0
        self.send(
            publish(
                topic,
                payload,
                qos=qos,
                mid=mid if qos else None,
                retain=retain,
                proto=self.proto,
                properties=properties,
            )
        )
        if qos == 1:
            ack = self.expect("PUBACK")
            assert ack.mid == mid and ack.reason < 0x80, f"PUBACK for {mid}: {ack!r}"
        elif qos == 2:
            rec = self.expect("PUBREC")
            assert rec.mid == mid and rec.reason < 0x80, f"PUBREC for {mid}: {rec!r}"
            self.send(pubrel(mid, proto=self.proto))
            comp = self.expect("PUBCOMP")
            assert comp.mid == mid and comp.reason == 0, f"PUBCOMP for {mid}: {comp!r}"
        return mid

    def ack(self, pkt: Packet) -> None:
        """Acknowledge a received PUBLISH (QoS 1 PUBACK; QoS 2 PUBREC, PUBREL, PUBCOMP)."""
        if pkt.qos == 1:
            self.send(puback(pkt.mid, proto=self.proto))
        elif pkt.qos == 2:
            self.send(pubrec(pkt.mid, proto=self.proto))
            rel = self.expect("PUBREL")
            assert rel.mid == pkt.mid and rel.flags == 2, f"PUBREL for {pkt.mid}: {rel!r}"
            self.send(pubcomp(pkt.mid, proto=self.proto))

    def receive(
        self,
        topic: str | None = None,
        payload: bytes | None = None,
        *,
        qos: int | None = None,
        retain: bool | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> Packet:
        """expect_publish, then acknowledge it."""
        pkt = self.expect_publish(topic, payload, qos=qos, retain=retain, timeout=timeout)
        self.ack(pkt)
        return pkt

    def ping(self) -> None:
        self.send(pingreq())
        self.expect_bytes("PINGRESP", pingresp())

    def disconnect(self, reason: int = 0, properties: PropList = ()) -> None:
        """Send DISCONNECT and wait for the broker to close (so it has processed it)."""
        self.send(disconnect(reason, proto=self.proto, properties=properties))
        self.expect_closed()
        self.close()

    def close(self) -> None:
        """Close abruptly (no DISCONNECT): an abnormal disconnection for the broker."""
        with contextlib.suppress(OSError):
            self.sock.close()

    def abort(self) -> None:
        """Close with a TCP reset, the rudest abnormal disconnection."""
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close()


def assert_broker_healthy(addr: tuple[str, int], proto: int = V311) -> None:
    """A fresh client can connect, subscribe, publish and receive its own message."""
    topic = f"health/{time.monotonic_ns()}"
    with RawClient(addr, proto) as c:
        c.connect(f"health-{time.monotonic_ns()}")
        c.subscribe(topic, 1)
        c.publish(topic, b"ok", qos=1)
        c.receive(topic, b"ok", qos=1)
        c.disconnect()


def collect(
    clients: Sequence[RawClient], count: int, timeout: float = DEFAULT_TIMEOUT, *, ack: bool = True
) -> list[tuple[RawClient, Packet]]:
    """Read ``count`` PUBLISH packets from whichever of ``clients`` has one (acking each)."""
    got: list[tuple[RawClient, Packet]] = []
    for c in clients:
        while c.stash and len(got) < count:
            got.append((c, c.stash.pop(0)))
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        for c in clients:
            sel.register(c.sock, selectors.EVENT_READ, c)
        while len(got) < count:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise Timeout(f"collected {len(got)}/{count} PUBLISH packets: {got}")
            for key, _ in sel.select(remaining):
                c = key.data
                pkt = c.read(max(deadline - time.monotonic(), 0.001))
                assert pkt.type == PUBLISH, f"expected PUBLISH, got {pkt!r}"
                got.append((c, pkt))
    if ack:
        for c, pkt in got:
            c.ack(pkt)
    return got


def wait_broker_seconds(addr: tuple[str, int], seconds: int, timeout: float = 10.0) -> None:
    """Return once the broker itself has let ``seconds`` pass, without sleeping here.

    A throwaway MQTT 5 client leaves with a will delayed by ``seconds`` (its session lasts
    longer); when the will arrives the broker's own timer has fired. Used by tests of
    expiry, where real time has to pass on the broker's clock.
    """
    token = f"clock/{time.monotonic_ns()}"
    with RawClient(addr, V5) as watcher:
        watcher.connect(f"{token.replace('/', '-')}-w")
        watcher.subscribe(token, 0)
        timer = RawClient(addr, V5)
        timer.connect(
            f"{token.replace('/', '-')}-t",
            properties=[(SESSION_EXPIRY_INTERVAL, seconds + 60)],
            will=Will(token, b"tick", properties=[(WILL_DELAY_INTERVAL, seconds)]),
        )
        timer.close()
        watcher.receive(token, b"tick", timeout=timeout)
        watcher.disconnect()
    with RawClient(addr, V5) as c:  # end the timer's session
        c.connect(f"{token.replace('/', '-')}-t", clean=True)
        c.disconnect()
