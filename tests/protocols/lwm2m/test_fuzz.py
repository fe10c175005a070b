"""Run the LwM2M fuzz target under hypothesis."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.protocols.lwm2m.fuzz_content import TestOneInput as fuzz_one


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    fuzz_one(data)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 300), st.binary(max_size=20)),
                max_size=5))
def test_tlv_shaped(items: list[tuple[int, int, bytes]]) -> None:
    from protocols.lwm2m import content

    raw = b"".join(content.tlv_header(k, i, len(v)) + v for k, i, v in items)
    fuzz_one(raw)
    fuzz_one(raw[:-1])
