"""Fuzz target for the MQTT decoder and the streaming Connection.

Run with atheris from the repository root::

    pip install atheris
    python -m tests.protocols.mqtt.fuzz_decoder -max_len=4096 corpus/

``TestOneInput`` feeds arbitrary bytes to SERVER connections (fresh, and after a valid
CONNECT at each level) and to CLIENT connections at each level, in chunks whose size
the first input byte selects. It asserts that:

- the only exceptions are :class:`~protocols.mqtt.errors.MQTTError` subclasses (never
  ``IndexError``, ``struct.error``, ``UnicodeDecodeError``, ``BufferError`` ...);
- every packet the decoder accepts encodes again and decodes to an equal packet.

``test_fuzz.py`` runs it under hypothesis so CI exercises it without atheris.
"""

from __future__ import annotations

import importlib
import sys

from protocols.mqtt.codec import encode, read_fixed_header
from protocols.mqtt.connection import Connection, Role
from protocols.mqtt.decoder import decode
from protocols.mqtt.errors import MQTTError
from protocols.mqtt.packets import MQTT_3_1, MQTT_3_1_1, MQTT_5, Connect, Packet

LEVELS = (MQTT_3_1, MQTT_3_1_1, MQTT_5)
CONNECTS = {level: encode(Connect("fuzz", level), level) for level in LEVELS}


def _assert_round_trip(packet: Packet, level: int, from_client: bool) -> None:
    raw = encode(packet, level)  # must not raise: the decoder accepted the packet
    header = read_fixed_header(raw, 0, len(raw))
    assert header is not None and header[1] + header[2] == len(raw)
    again = decode(header[0], raw[header[2] :], level, from_client=from_client)
    assert again == packet, (packet, again)


def _feed(conn: Connection, data: bytes, chunk: int) -> None:
    from_client = conn.role is Role.SERVER
    for start in range(0, len(data), chunk):
        packets: list[Packet] = []
        try:
            conn.receive_data(data[start : start + chunk])
            while (packet := conn.next_event()) is not None:
                packets.append(packet)
        except MQTTError:
            failed = True
        else:
            failed = False
        level = conn.protocol_level
        for packet in packets:
            assert level is not None
            _assert_round_trip(packet, level, from_client)
        if failed:
            return


def TestOneInput(data: bytes) -> None:  # the name atheris expects
    if not data:
        return
    selector, rest = data[0], data[1:]
    chunk = len(rest) or 1 if selector & 0x80 else (selector & 0x0F) + 1
    _feed(Connection(Role.SERVER), rest, chunk)
    for level in LEVELS:
        _feed(Connection(Role.SERVER), CONNECTS[level] + rest, chunk)
        _feed(Connection(Role.CLIENT, protocol_level=level), rest, chunk)


def main() -> None:
    atheris = importlib.import_module("atheris")
    atheris.instrument_all()
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
