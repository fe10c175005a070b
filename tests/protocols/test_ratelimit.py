"""TokenBucket: debt-based consume (pause, never refuse) and refuse-without-debt admit."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocols.ratelimit import TokenBucket


def test_consume_within_burst_needs_no_pause():
    b = TokenBucket(10.0, 10.0, now=0.0)
    assert b.consume(10, 0.0) == 0.0
    assert b.tokens == 0.0


def test_consume_into_debt_gives_the_time_to_pay_it_off():
    b = TokenBucket(10.0, 10.0, now=0.0)
    assert b.consume(30, 0.0) == pytest.approx(2.0)  # 20 owed at 10/s
    # after the pause the balance is zero again, and refills from there
    assert b.consume(0, 2.0) == 0.0
    assert b.tokens == pytest.approx(0.0)
    assert b.consume(5, 2.5) == 0.0


def test_refill_is_capped_at_burst_and_ignores_a_clock_going_back():
    b = TokenBucket(100.0, 50.0, now=0.0)
    b.consume(50, 0.0)
    b.consume(0, 1000.0)
    assert b.tokens == 50.0
    b.consume(0, 10.0)  # earlier than the last stamp: nothing added, nothing lost
    assert b.tokens == 50.0


def test_admit_refuses_without_debt():
    b = TokenBucket(2.0, 2.0, now=0.0)
    assert [b.admit(0.0) for _ in range(5)] == [True, True, False, False, False]
    assert b.tokens == 0.0  # refusals cost nothing
    assert b.admit(0.5)  # one token back after half a second
    assert not b.admit(0.5)


def test_invalid_parameters():
    with pytest.raises(ValueError):
        TokenBucket(0.0, 1.0, 0.0)
    with pytest.raises(ValueError):
        TokenBucket(1.0, 0.0, 0.0)


@given(
    rate=st.floats(0.5, 1000),
    chunks=st.lists(st.tuples(st.floats(0, 5), st.floats(0, 2000)), min_size=1, max_size=50),
)
def test_long_run_rate_never_exceeds_rate_plus_burst(rate, chunks):
    """A client that always waits out its pause gets at most rate*t + burst in t seconds."""
    burst = max(1.0, rate)
    b = TokenBucket(rate, burst, now=0.0)
    now = 0.0
    total = 0.0
    for gap, n in chunks:
        total += n
        pause = b.consume(n, now)
        now += pause + gap
    # everything consumed so far was paid for by the time "now" (pauses waited out)
    assert total <= rate * now + burst + 1e-6 * max(1.0, total)
