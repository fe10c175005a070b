"""Run the CoAP fuzz target under hypothesis: random bytes and mutated messages."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols.coap.codec import Message, encode
from tests.protocols.coap.fuzz_decoder import TestOneInput as fuzz_one
from tests.protocols.coap.strategies import messages

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
        if not out and kind != "insert":
            continue
        i = where % (len(out) + (1 if kind == "insert" else 0))
        if kind == "flip":
            out[i] ^= 1 << (value % 8)
        elif kind == "set":
            out[i] = value
        elif kind == "insert":
            out.insert(i, value)
        else:
            del out[i]
    return bytes(out)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.binary(max_size=120))
def test_random_bytes(data: bytes) -> None:
    fuzz_one(data)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(messages(), _MUTATIONS)
def test_mutated_messages(p: Message, mutations: list[tuple[str, int, int]]) -> None:
    fuzz_one(_mutate(encode(p), mutations))


@settings(max_examples=200, deadline=None)
@given(messages(), st.integers(0, 600))
def test_truncated_messages(p: Message, cut: int) -> None:
    raw = encode(p)
    fuzz_one(raw[: cut % (len(raw) + 1)])
