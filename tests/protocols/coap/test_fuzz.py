"""Run the CoAP fuzz target under hypothesis: random bytes and mutated messages."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocols.coap.codec import Message, encode
from tests.protocols.coap.fuzz_decoder import TestOneInput as fuzz_one
from tests.protocols.coap.strategies import messages
from tests.protocols.mutations import MUTATIONS, mutate


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.binary(max_size=120))
def test_random_bytes(data: bytes) -> None:
    fuzz_one(data)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(messages(), MUTATIONS)
def test_mutated_messages(p: Message, mutations: list[tuple[str, int, int]]) -> None:
    fuzz_one(mutate(encode(p), mutations))


@settings(max_examples=200, deadline=None)
@given(messages(), st.integers(0, 600))
def test_truncated_messages(p: Message, cut: int) -> None:
    raw = encode(p)
    fuzz_one(raw[: cut % (len(raw) + 1)])
