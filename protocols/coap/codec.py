"""CoAP message codec (RFC 7252, UDP framing), sans-IO, on aiocoap's message class.

We do not hand-write CoAP's option encoding: :func:`decode` and :func:`encode` wrap
``aiocoap.message.Message.decode`` / ``Message.encode``, which take and return whole
datagrams and touch no socket, no event loop and no clock. Everything above the message
(deduplication, piggybacked and separate responses, retransmission, observe,
blockwise) lives in the channel, on our own datagram shell.

Rules:
- :func:`decode` raises :class:`RemoteProtocolError` for anything that is not a CoAP
  message; when the 4-byte header and the token could still be read, the error carries
  them (``mtype``, ``mid``, ``token``) so the channel can answer 4.00 Bad Request.
- An empty message (code 0.00) must have no token, options or payload (RFC 7252 4.1).
- An unknown *critical* option is reported (``Message`` and the option number) by
  :func:`unknown_critical`; the channel answers 4.02 Bad Option.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiocoap import error as coap_error
from aiocoap.message import Direction, Message
from aiocoap.numbers import codes, optionnumbers, types
from aiocoap.optiontypes import BlockOption

__all__ = [
    "ACK",
    "CON",
    "NON",
    "RST",
    "Block",
    "Code",
    "Message",
    "RemoteProtocolError",
    "decode",
    "encode",
    "make",
    "unknown_critical",
]

Code = codes.Code
CON = types.Type.CON
NON = types.Type.NON
ACK = types.Type.ACK
RST = types.Type.RST
Block = BlockOption.BlockwiseTuple
_KNOWN = frozenset(int(n) for n in optionnumbers.OptionNumber)


class RemoteProtocolError(Exception):
    """The peer sent something that is not a valid CoAP message."""

    def __init__(
        self,
        reason: str,
        mtype: int | None = None,
        mid: int | None = None,
        token: bytes | None = None,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.mtype = mtype
        self.mid = mid
        self.token = token


@dataclass(frozen=True, slots=True)
class Header:
    version: int
    mtype: int
    token: bytes
    code: int
    mid: int


def _header(data: bytes) -> Header | None:
    if len(data) < 4:
        return None
    tkl = data[0] & 0x0F
    if tkl > 8 or len(data) < 4 + tkl:
        return None
    return Header(
        data[0] >> 6, (data[0] >> 4) & 3, bytes(data[4 : 4 + tkl]), data[1],
        int.from_bytes(data[2:4], "big"),
    )


def decode(data: bytes) -> Message:
    """One datagram -> one message, or :class:`RemoteProtocolError`."""
    head = _header(data)
    if head is None:
        raise RemoteProtocolError("too short for a CoAP header")
    if head.version != 1:
        raise RemoteProtocolError(f"CoAP version {head.version}")
    try:
        msg = Message.decode(bytes(data))
    except (coap_error.Error, ValueError, IndexError, UnicodeDecodeError) as exc:
        raise RemoteProtocolError(str(exc) or type(exc).__name__, head.mtype, head.mid,
                                  head.token) from None
    if any(int(o.number) > 0xFFFF for o in msg.opt.option_list()):
        # option deltas can add up past 65535 (RFC 7252 3.1: numbers are 16 bits)
        raise RemoteProtocolError("option number above 65535", head.mtype, head.mid,
                                  head.token)
    if msg.code == Code.EMPTY and (len(data) > 4):
        raise RemoteProtocolError("empty message with token, options or payload",
                                  head.mtype, head.mid, head.token)
    return msg


def encode(msg: Message) -> bytes:
    """One message -> one datagram (a decoded message may be encoded again)."""
    if msg.direction != Direction.OUTGOING:
        msg = msg.copy()
        msg.direction = Direction.OUTGOING
    return bytes(msg.encode())


def make(
    mtype: types.Type,
    code: int,
    mid: int,
    token: bytes = b"",
    payload: bytes = b"",
) -> Message:
    """A message with its message-layer fields set (aiocoap deprecates passing them to
    the constructor; its own transports set them as attributes, as we do)."""
    msg = Message(code=Code(code), payload=payload)
    msg.mtype = mtype
    msg.mid = mid
    msg.token = token
    return msg


def unknown_critical(msg: Message) -> int | None:
    """The number of the first unrecognised critical option, if any (odd numbers are
    critical, RFC 7252 5.4.1)."""
    for opt in msg.opt.option_list():
        n = int(opt.number)
        if n & 1 and n not in _KNOWN:
            return n
    return None
