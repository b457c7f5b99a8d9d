"""What bounds a peer's cost to the learner and the agent server, shared by both:
a token bucket for how fast new sessions or sender ids open, and the cadence at
which a counted refusal is logged (the first 5, then the 10th, 100th, 1000th and
every 10,000th: a flood shows in the log without flooding it).
"""
from __future__ import annotations


class TokenBucket:
    """Allows `rate` events per second on average and `burst` at once."""

    def __init__(self, rate: float, burst: int, now: float):
        self.rate = rate
        self.burst = burst
        self.tokens = float(burst)
        self.t = now

    def take(self, now: float) -> bool:
        self.tokens = min(float(self.burst), self.tokens + max(0.0, now - self.t) * self.rate)
        self.t = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


def worth_logging(n: int) -> bool:
    """Whether the n-th refusal of one reason gets a log line."""
    return n <= 5 or n in (10, 100, 1000) or n % 10000 == 0
