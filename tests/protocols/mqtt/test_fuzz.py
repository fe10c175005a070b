"""Run the decoder fuzz target under hypothesis: random bytes and mutated packets."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols.mqtt.codec import encode
from protocols.mqtt.packets import MQTT_3_1, MQTT_3_1_1, MQTT_5, Packet
from tests.protocols.mqtt.fuzz_decoder import TestOneInput as fuzz_one
from tests.protocols.mqtt.strategies import packets

LEVELS = (MQTT_3_1, MQTT_3_1_1, MQTT_5)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    fuzz_one(data)


@st.composite
def valid_streams(draw: st.DrawFn) -> bytes:
    level = draw(st.sampled_from(LEVELS))
    drawn: list[tuple[Packet, bool]] = draw(st.lists(packets(level), min_size=1, max_size=4))
    return b"".join(encode(packet, level) for packet, _ in drawn)


_MUTATIONS = st.lists(
    st.tuples(
        st.sampled_from(["flip", "set", "insert", "delete"]), st.integers(0), st.integers(0, 255)
    ),
    min_size=1,
    max_size=4,
)


def _mutate(data: bytes, mutations: list[tuple[str, int, int]]) -> bytes:
    out = bytearray(data)
    for kind, where, value in mutations:
        if not out:
            out.append(value)
            continue
        index = where % len(out)
        if kind == "flip":
            out[index] ^= 1 << (value % 8)
        elif kind == "set":
            out[index] = value
        elif kind == "insert":
            out.insert(index, value)
        else:
            del out[index]
    return bytes(out)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(selector=st.integers(0, 255), stream=valid_streams(), mutations=_MUTATIONS)
def test_mutated_valid_packets(
    selector: int, stream: bytes, mutations: list[tuple[str, int, int]]
) -> None:
    fuzz_one(bytes((selector,)) + _mutate(stream, mutations))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(selector=st.integers(0, 255), stream=valid_streams(), cut=st.integers(0))
def test_truncated_valid_packets(selector: int, stream: bytes, cut: int) -> None:
    fuzz_one(bytes((selector,)) + stream[: cut % (len(stream) + 1)])


def test_valid_streams_decode_through_the_target() -> None:
    # A smoke check that the target's round-trip oracle accepts ordinary traffic.
    fuzz_one(b"\x00" + b"\x30\x03\x00\x01t" + b"\xc0\x00")
