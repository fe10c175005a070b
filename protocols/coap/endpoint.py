"""The CoAP server side of one peer (RFC 7252 message layer), shared by the CoAP and the
LwM2M channels, sans-IO.

:class:`CoapEndpoint` adds to :class:`~protocols.channel_base.ChannelBase` what both
channels do the same way with CoAP messages: message ids for what we send, the cache of
answers that makes a repeated request harmless, answering a request (piggybacked or
not), answering a malformed datagram, ``handle_datagram`` (decode, then the channel's
``_dispatch``, or its ``_malformed``) and ``release`` (CoAP has no PUBREL).

Invariants:
- Message ids we allocate start at a random value and go up by one, modulo 2**16.
- A request is acted on once: its message id is remembered (the last ``dedup_size``);
  a repetition gets the same answer again, or nothing while the answer is not known yet.
- The final answer to a request whose body came with Block1 echoes the last Block1.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable

from protocols.channel_base import ChannelBase
from protocols.coap.codec import (
    ACK,
    CON,
    NON,
    Block,
    Code,
    Message,
    RemoteProtocolError,
    decode,
    encode,
    make,
)
from protocols.context import ConnectionHandle, GatewayContext
from protocols.effects import Effect


def query_of(msg: Message) -> dict[str, str]:
    """The request's Uri-Query as a dict (the first of a repeated key wins)."""
    out: dict[str, str] = {}
    for item in msg.opt.uri_query:
        k, _, v = item.partition("=")
        out.setdefault(k, v)
    return out


class CoapEndpoint(ChannelBase):
    """The CoAP message layer of a front-end channel (see the module docstring)."""

    def __init__(
        self,
        context: GatewayContext,
        handle: ConnectionHandle,
        peer: tuple[str, int] | None,
        monotonic: Callable[[], float],
        *,
        dedup_size: int,
    ) -> None:
        super().__init__(context, handle, peer, monotonic)
        self._next_mid = secrets.randbelow(0x10000)
        self._dedup_size = dedup_size
        self._responses: OrderedDict[int, bytes | None] = OrderedDict()
        self._last_block1: tuple[int, Block] | None = None  # (mid, Block1) to echo
        self.last_rx = 0.0  # when the peer last sent something well-formed (monotonic)

    def handle_datagram(self, data: bytes) -> list[Effect]:
        """One datagram from the peer: a well-formed message goes to ``_dispatch``; one
        that is not (decode raises RemoteProtocolError) to ``_malformed``."""
        if self.state is self.CLOSED or self._hold(data):
            return []
        outer = self._enter()
        try:
            msg = decode(data)
        except RemoteProtocolError as exc:
            self._malformed(exc)
            return self._leave(outer)
        self.last_rx = self._monotonic()
        try:
            self._dispatch(msg)
        except RemoteProtocolError as exc:
            self._malformed(exc)
        return self._leave(outer)

    def _dispatch(self, msg: Message) -> None:
        raise NotImplementedError

    def _replay(self, data: bytes) -> None:
        self.handle_datagram(data)  # (re-entrant: its effects join the outer call's)

    def _malformed(self, exc: RemoteProtocolError) -> None:
        raise NotImplementedError

    def release(self, packet_id: int) -> list[Effect]:
        """No PUBREL in CoAP: an outgoing QoS 2 message resumed at PUBREL is complete."""
        if self.session is not None:
            self.session.pubcomp(packet_id)
        return []

    def _mid(self) -> int:
        mid = self._next_mid
        self._next_mid = (mid + 1) & 0xFFFF
        return mid

    def _repeated(self, mid: int) -> bool:
        """True when the request with ``mid`` was seen before (its answer, once known,
        goes again); otherwise it is remembered, and False."""
        seen = self._responses.get(mid, b"")
        if seen != b"":
            if seen is not None:
                self._out.append(seen)
            return True
        self._responses[mid] = None
        if len(self._responses) > self._dedup_size:
            self._responses.popitem(last=False)
        return False

    def _reply(self, req: Message, code: int, payload: bytes = b"") -> Message:
        """The answer to ``req``: piggybacked in the ACK of a CON, a NON otherwise."""
        con = req.mtype == CON
        return make(ACK if con else NON, code, req.mid if con else self._mid(), req.token,
                    payload)

    def _send_reply(self, req: Message, resp: Message, block1: Block | None = None) -> None:
        """Send ``resp`` (from ``_reply``) and remember it as the answer to ``req``."""
        if block1 is None and self._last_block1 is not None and self._last_block1[0] == req.mid:
            block1 = self._last_block1[1]  # the final answer of a Block1 transfer echoes it
        if block1 is not None:
            resp.opt.block1 = block1
        data = encode(resp)
        if req.mid in self._responses:
            self._responses[req.mid] = data
        self._out.append(data)

    def _answer_malformed(self, exc: RemoteProtocolError, payload: bytes = b"") -> None:
        """4.00 to a datagram whose header could be read (and was a CON or NON)."""
        if exc.mid is None or exc.mtype not in (CON, NON):
            return
        reply = make(ACK if exc.mtype == CON else NON, Code.BAD_REQUEST,
                     exc.mid if exc.mtype == CON else self._mid(), exc.token or b"", payload)
        self._out.append(encode(reply))
