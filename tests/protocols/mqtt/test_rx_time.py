"""``last_rx`` is rounded up to a shared 1/64 s mark (one float for the connections that
receive within a grain): never earlier than the true time, at most a grain later, and
the same object within a grain, whatever the clock (virtual clocks start anew per test)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from protocols.mqtt.channel import RX_GRAIN, _rx_time

times = st.floats(min_value=0.0, max_value=1e7, allow_nan=False)


@given(st.lists(times, min_size=1, max_size=20))
def test_rounded_up_by_less_than_a_grain(seq: list[float]) -> None:
    for now in seq:
        mark = _rx_time(now)
        assert now <= mark <= now + RX_GRAIN


@given(times)
def test_one_object_within_a_grain(now: float) -> None:
    mark = _rx_time(now)
    assert _rx_time(now) is mark
    assert _rx_time(mark) is mark
