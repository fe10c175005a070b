"""Token buckets for rate limits, sans-IO: the caller passes the time.

Two ways to spend tokens:

- :meth:`TokenBucket.consume` (a client's message and byte rates): the tokens are taken
  whatever the balance, which may go negative (a debt). The answer is how long the caller
  should stop reading so that the debt is paid off; reading resumes at a zero balance.
  Over any long stretch a client thus gets ``rate`` units per second, plus at most one
  ``burst``, however its reads are split, and nothing it sent is ever refused.
- :meth:`TokenBucket.admit` (a listener's connection rate): one token or a refusal; a
  refused attempt costs nothing, so a flood cannot push the bucket into debt.

Invariants: ``tokens <= burst``; refilling is ``rate`` tokens per second of the time
passed in (a clock that goes backwards adds nothing); ``rate > 0`` and ``burst > 0``.
"""

from __future__ import annotations

__all__ = ["TokenBucket"]


class TokenBucket:
    """``rate`` tokens per second, holding at most ``burst``; full at ``now``."""

    __slots__ = ("rate", "burst", "tokens", "stamp")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError(f"rate and burst must be positive (got {rate}, {burst})")
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def _refill(self, now: float) -> float:
        elapsed = now - self.stamp
        if elapsed > 0:
            self.stamp = now
            tokens = self.tokens + elapsed * self.rate
            self.tokens = tokens if tokens < self.burst else self.burst
        return self.tokens

    def consume(self, n: float, now: float) -> float:
        """Take ``n`` tokens (into debt if need be); the seconds to pause, 0.0 for none."""
        tokens = self._refill(now) - n
        self.tokens = tokens
        return 0.0 if tokens >= 0 else -tokens / self.rate

    def admit(self, now: float) -> bool:
        """Take one token if there is one; False (and nothing taken) otherwise."""
        if self._refill(now) >= 1.0:
            self.tokens -= 1.0
            return True
        return False
