"""Fuzz target for the MQTT-SN decoder and the gateway channel.

Run with atheris from the repository root::

    pip install atheris
    python -m tests.protocols.mqttsn.fuzz_decoder -max_len=1024 corpus/

``TestOneInput`` decodes arbitrary bytes (both roles) and feeds them to a connected
gateway channel on a real core. It asserts that:

- the decoder's only exception is :class:`~protocols.mqttsn.codec.RemoteProtocolError`;
- every message it accepts encodes again to the same bytes' meaning (decode(encode(p)) == p);
- the channel never raises, whatever the datagram.

``test_fuzz.py`` runs it under hypothesis so CI exercises it without atheris.
"""

from __future__ import annotations

import contextlib
import importlib
import sys

from gateway.core.clock import VirtualScheduler
from gateway.core.node import CoreSettings, Node
from protocols.mqttsn.channel import MqttSnChannel, MqttSnSettings
from protocols.mqttsn.codec import Codec, RemoteProtocolError, Role, decode, encode
from protocols.mqttsn.packets import Connect

_CODECS = (Codec(Role.GATEWAY), Codec(Role.CLIENT))


class _Handle:
    def __init__(self) -> None:
        self.channel: MqttSnChannel | None = None

    def deliver(self, deliveries: list) -> None:  # type: ignore[type-arg]
        assert self.channel is not None
        self.channel.deliver(deliveries)

    def release(self, packet_id: int) -> None:
        assert self.channel is not None
        self.channel.release(packet_id)

    def kick(self, reason_code: int) -> None:
        assert self.channel is not None
        self.channel.kick(reason_code)

    def call_channel(self, fn: object) -> None:
        fn()  # type: ignore[operator]


def _channel() -> MqttSnChannel:
    clock = VirtualScheduler()
    node = Node(CoreSettings(), clock)
    handle = _Handle()
    ch = MqttSnChannel(
        node, MqttSnSettings(predefined={1: "p/1"}), handle, peer=("127.0.0.1", 1),
        monotonic=clock.time,
    )
    handle.channel = ch
    ch.connection_made()
    ch.handle_datagram(encode(Connect("fuzz", 60)))
    return ch


def TestOneInput(data: bytes) -> None:
    try:
        p = decode(data)
    except RemoteProtocolError:
        pass
    else:
        assert decode(encode(p)) == p, p
    for codec in _CODECS:
        with contextlib.suppress(RemoteProtocolError):
            codec.decode(data)
    ch = _channel()
    ch.handle_datagram(data)
    ch.on_timer("retry")


def main() -> None:  # pragma: no cover - needs atheris
    atheris = importlib.import_module("atheris")
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":  # pragma: no cover
    main()
