"""The cluster wire format, sans-IO: frames on a link, and forwarded messages in them.

A frame is ``length (4 bytes, big-endian) | kind (1 byte) | body``; ``length`` counts the
kind byte and the body. Control frames carry a JSON object; ``DATA`` frames carry a batch
of forwarded messages in a compact binary form (:func:`encode_batch`), and ``ACK`` frames
the highest sequence number the receiver has made durable.

Invariants:
- :class:`FrameReader` yields whole frames in arrival order and never more than
  ``max_frame`` bytes of body; a longer or malformed frame raises :class:`FrameError`
  (the link is closed: the peer is broken or not one of us).
- ``decode_batch(encode_batch(batch)) == batch`` for every message field the cluster
  carries (topic, payload, QoS, retain, publish properties, publisher, user name,
  timestamp, expiry), and the optional shared-group and target trailers.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

from gateway.store.sessions import dump_props, load_props
from protocols.context import Message

# -- frame kinds ----------------------------------------------------------------------

HELLO = 1  # dialer -> listener: {"name", "cluster", "channel", "addr", "epoch", "role"}
WELCOME = 2  # listener -> dialer: {"name", "members", "applied"} (or "refused")
PING = 3  # {"t": sender's clock}
PONG = 4  # {"t": echoed}
ROUTES = 5  # {"snapshot": bool, "add": [...], "del": [...], "rev": int}
ROUTES_ACK = 6  # {"rev": int}
MEMBERS = 7  # {"members": [[name, addr, role(, core of an attached replicant)], ...]}
LEAVE = 8  # {"name"}: the sender leaves the cluster
DATA = 9  # binary batch of messages
ACK = 10  # {"seq": int} on the data channel
CALL = 11  # {"id", "op", ...}: a request on the control channel
REPLY = 12  # {"id", ...}: its answer
CAST = 13  # {"op", ...}: a one-way notice on the control channel
RAFT = 14  # a pysyncobj message (allow-list unpickled, raft.py), control channel
TABLE = 15  # {"t": table, "rows": [[key, stamp, value|null], ...], "snapshot", "end"}

MAX_FRAME = 64 << 20
_HEAD = struct.Struct(">IB")


class FrameError(Exception):
    """A malformed frame: the link must be closed."""


def frame(kind: int, body: bytes) -> bytes:
    return _HEAD.pack(len(body) + 1, kind) + body


def control(kind: int, obj: dict[str, Any]) -> bytes:
    return frame(kind, json.dumps(obj, separators=(",", ":")).encode())


def parse_control(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body)
    except ValueError as exc:
        raise FrameError(f"bad control frame: {exc}") from None
    if not isinstance(obj, dict):
        raise FrameError("bad control frame: not an object")
    return obj


class FrameReader:
    """Bytes in, ``(kind, body)`` frames out (the consume/commit buffer of wsproto)."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        buf = self._buf
        buf += data
        out: list[tuple[int, bytes]] = []
        pos = 0
        n = len(buf)
        while n - pos >= 5:
            length, kind = _HEAD.unpack_from(buf, pos)
            if length < 1 or length > self._max:
                raise FrameError(f"frame length {length} out of range")
            end = pos + 4 + length
            if end > n:
                break
            out.append((kind, bytes(buf[pos + 5 : end])))
            pos = end
        if pos:
            del buf[:pos]
        return out


# -- forwarded messages ---------------------------------------------------------------


@dataclass(slots=True)
class Forwarded:
    """One message in a DATA batch: ``seq`` > 0 for a durable (QoS >= 1) forward."""

    seq: int
    message: Message
    share: tuple[str, str] | None = None  # (group, filter): for one member of that group
    target: str | None = None  # for that node only (a core relays it to its replicant)


_SEQ = struct.Struct(">Q")
_REC = struct.Struct(">BBHHHIIdd")
_NONE = 0xFFFF


_SHARE_LEN = struct.Struct(">H")


def encode_message(m: Message, share: tuple[str, str] | None = None,
                   target: str | None = None) -> bytes:
    """A message's record body; a DATA record is ``seq (8 bytes) | body``. With ``share``
    (group, filter) flag bit 2 is set and ``len (2 bytes) | group NUL filter`` follows the
    payload: the receiver gives it to one member of that shared group only. With
    ``target`` (a node name) flag bit 4 is set and ``len (2 bytes) | name`` follows: the
    receiving core hands it to that replicant only."""
    topic = m.topic.encode()
    publisher = m.publisher.encode()
    username = b"" if m.username is None else m.username.encode()
    props_s = dump_props(m.properties)
    props = b"" if props_s is None else props_s.encode()
    expires = math.nan if m.expires_at is None else m.expires_at
    trailer = b""
    if share is not None:
        key = f"{share[0]}\0{share[1]}".encode()
        trailer = _SHARE_LEN.pack(len(key)) + key
    if target is not None:
        name = target.encode()
        trailer += _SHARE_LEN.pack(len(name)) + name
    return b"".join(
        (
            _REC.pack(
                m.qos,
                (1 if m.retain else 0) | (2 if share is not None else 0)
                | (4 if target is not None else 0),
                len(topic),
                len(publisher),
                _NONE if m.username is None else len(username),
                len(props),
                len(m.payload),
                m.timestamp,
                expires,
            ),
            topic,
            publisher,
            username,
            props,
            m.payload,
            trailer,
        )
    )


def record(seq: int, body: bytes) -> bytes:
    return _SEQ.pack(seq) + body


def decode_body(body: bytes) -> Forwarded:
    """One record body made by :func:`encode_message` (``seq`` 0)."""
    return decode_batch(struct.pack(">I", 1) + record(0, body))[0]


def encode_batch(records: list[bytes]) -> bytes:
    """A DATA frame from records made by :func:`record`."""
    return frame(DATA, struct.pack(">I", len(records)) + b"".join(records))


def decode_batch(body: bytes) -> list[Forwarded]:
    try:
        (count,) = struct.unpack_from(">I", body, 0)
        pos = 4
        out: list[Forwarded] = []
        rec = _REC
        for _ in range(count):
            (seq,) = _SEQ.unpack_from(body, pos)
            qos, flags, lt, lp, lu, lpr, lpl, ts, exp = rec.unpack_from(body, pos + 8)
            pos += 8 + rec.size
            topic = body[pos : pos + lt].decode()
            pos += lt
            publisher = body[pos : pos + lp].decode()
            pos += lp
            username: str | None = None
            if lu != _NONE:
                username = body[pos : pos + lu].decode()
                pos += lu
            props = load_props(body[pos : pos + lpr].decode()) if lpr else load_props(None)
            pos += lpr
            payload = body[pos : pos + lpl]
            if len(payload) != lpl:
                raise FrameError("truncated message")
            pos += lpl
            share: tuple[str, str] | None = None
            if flags & 2:
                (ls,) = _SHARE_LEN.unpack_from(body, pos)
                group, sep, real = body[pos + 2 : pos + 2 + ls].decode().partition("\0")
                if not sep:
                    raise FrameError("bad shared-group trailer")
                share = (group, real)
                pos += 2 + ls
            target: str | None = None
            if flags & 4:
                (ln,) = _SHARE_LEN.unpack_from(body, pos)
                target = body[pos + 2 : pos + 2 + ln].decode()
                if len(target.encode()) != ln or not target:
                    raise FrameError("bad target trailer")
                pos += 2 + ln
            m = Message(
                topic,
                payload,
                qos,
                bool(flags & 1),
                props,
                publisher,
                username,
                ts,
                None if math.isnan(exp) else exp,
            )
            out.append(Forwarded(seq, m, share, target))
    except (struct.error, UnicodeDecodeError, ValueError, TypeError) as exc:
        raise FrameError(f"bad DATA frame: {exc}") from None
    return out
