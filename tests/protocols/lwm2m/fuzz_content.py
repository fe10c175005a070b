"""Fuzz target for the LwM2M content decoders and the LwM2M channel.

Run with atheris: ``python -m tests.protocols.lwm2m.fuzz_content -max_len=2048 corpus/``.
Asserts that every decoder raises only ``ContentError`` and that the channel (registered,
with a command outstanding) never raises, whatever the datagram.
``test_fuzz.py`` runs it under hypothesis.
"""

from __future__ import annotations

import contextlib
import importlib
import sys

from gateway.core.clock import VirtualScheduler
from gateway.core.node import CoreSettings, Node
from protocols.coap.codec import CON, Code, encode, make
from protocols.lwm2m import content
from protocols.lwm2m.channel import Lwm2mChannel, Lwm2mSettings
from protocols.lwm2m.objects import ObjectModel

_MODEL = ObjectModel.shipped()
_FORMATS = (content.TEXT, content.OPAQUE, content.TLV, content.OMA_JSON, content.SENML_JSON,
            content.SENML_CBOR, content.LINK_FORMAT, None)


class _Handle:
    def deliver(self, deliveries: list) -> None:  # type: ignore[type-arg]
        pass

    def release(self, packet_id: int) -> None:
        pass

    def kick(self, reason_code: int) -> None:
        pass

    def call_channel(self, fn: object) -> None:
        fn()  # type: ignore[operator]


def _channel() -> Lwm2mChannel:
    clock = VirtualScheduler()
    node = Node(CoreSettings(), clock)
    ch = Lwm2mChannel(node, Lwm2mSettings(model=_MODEL), _Handle(), peer=("127.0.0.1", 1),
                      monotonic=clock.time)
    ch.connection_made()
    reg = make(CON, Code.POST, 1, b"r", b"</3/0>")
    reg.opt.uri_path = ("rd",)
    reg.opt.uri_query = ("ep=fuzz", "lt=60")
    ch.handle_datagram(encode(reg))
    ch.deliver([])
    ch._command(b'{"reqID": 1, "msgType": "read", "data": {"path": "/3/0"}}')
    ch._pump()
    return ch


def TestOneInput(data: bytes) -> None:
    for fmt in _FORMATS:
        with contextlib.suppress(content.ContentError):
            content.decode(fmt, data, "/3/0", _MODEL.type_of)
    with contextlib.suppress(content.ContentError):
        content.parse_links(data.decode("utf-8", "replace"))
    ch = _channel()
    ch.handle_datagram(data)
    ch._command(data)
    ch.on_timer("retry")


def main() -> None:  # pragma: no cover - needs atheris
    atheris = importlib.import_module("atheris")
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":  # pragma: no cover
    main()
