"""Fuzz target for the CoAP decoder and the gateway channel.

Run with atheris from the repository root::

    pip install atheris
    python -m tests.protocols.coap.fuzz_decoder -max_len=2048 corpus/

``TestOneInput`` asserts that:

- the decoder's only exception is :class:`~protocols.coap.codec.RemoteProtocolError`;
- every message it accepts encodes and decodes again to the same bytes;
- the channel (with a session and an observation) never raises, whatever the datagram,
  and every datagram it writes is a valid CoAP message.

``test_fuzz.py`` runs it under hypothesis so CI exercises it without atheris.
"""

from __future__ import annotations

import importlib
import sys

from gateway.core.clock import VirtualScheduler
from gateway.core.node import CoreSettings, Node
from protocols.coap.channel import CoapChannel, CoapSettings
from protocols.coap.codec import CON, Code, RemoteProtocolError, decode, encode, make


class _Handle:
    def __init__(self) -> None:
        self.channel: CoapChannel | None = None

    def deliver(self, deliveries: list) -> None:  # type: ignore[type-arg]
        assert self.channel is not None
        _check(self.channel.deliver(deliveries))

    def release(self, packet_id: int) -> None:
        pass

    def kick(self, reason_code: int) -> None:
        assert self.channel is not None
        self.channel.kick(reason_code)

    def call_channel(self, fn: object) -> None:
        fn()  # type: ignore[operator]


def _check(effects: list) -> None:  # type: ignore[type-arg]
    for e in effects:
        if isinstance(e, bytes):
            decode(e)


def _channel() -> CoapChannel:
    clock = VirtualScheduler()
    node = Node(CoreSettings(), clock)
    handle = _Handle()
    ch = CoapChannel(node, CoapSettings(), handle, peer=("127.0.0.1", 1), monotonic=clock.time)
    handle.channel = ch
    ch.connection_made()
    m = make(CON, Code.GET, 1, b"o")
    m.opt.uri_path = ("ps", "f", "+")
    m.opt.observe = 0
    _check(ch.handle_datagram(encode(m)))
    return ch


def TestOneInput(data: bytes) -> None:
    try:
        m = decode(data)
    except RemoteProtocolError:
        pass
    else:
        raw = encode(m)
        assert encode(decode(raw)) == raw
    ch = _channel()
    _check(ch.handle_datagram(data))
    _check(ch.on_timer("idle"))


def main() -> None:  # pragma: no cover - needs atheris
    atheris = importlib.import_module("atheris")
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":  # pragma: no cover
    main()
