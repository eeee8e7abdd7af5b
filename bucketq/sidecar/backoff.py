"""The delay before a pushed message that failed is delivered again: exponential, capped, jittered.

For a message whose ``n``-th push attempt failed (``n`` = its delivery count, 1 after the first)::

    base(n)  = min(max_s, initial_s * multiplier ** (n - 1))
    delay(n) = base(n) / 2 + uniform(0, base(n) / 2)        # "equal jitter"

Equal jitter keeps every delay within [base/2, base]: a retry never comes sooner than half its
step (so the schedule keeps growing under load), and pods that failed together spread out instead
of retrying in lock-step.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryBackoff:
    """A retry schedule; construct it from validated settings (``initial_s`` > 0, ``max_s`` >=
    ``initial_s``, ``multiplier`` >= 1)."""

    initial_s: float
    max_s: float
    multiplier: float

    def __post_init__(self) -> None:
        if not self.initial_s > 0:
            raise ValueError(f"initial retry delay must be positive, not {self.initial_s!r}")
        if not self.max_s >= self.initial_s:
            raise ValueError(f"maximum retry delay {self.max_s!r} is below the initial {self.initial_s!r}")
        if not self.multiplier >= 1.0:
            raise ValueError(f"retry multiplier must be at least 1, not {self.multiplier!r}")

    def base(self, failures: int) -> float:
        """The un-jittered delay after ``failures`` failed attempts (at least 1)."""
        steps = max(failures, 1) - 1
        if self.multiplier == 1.0 or steps == 0:
            return self.initial_s
        # compare in logs: multiplier ** steps overflows a float long before deliveries run out
        if steps * math.log(self.multiplier) >= math.log(self.max_s / self.initial_s):
            return self.max_s
        return min(self.max_s, self.initial_s * self.multiplier**steps)

    def delay(self, failures: int, uniform: Callable[[], float] = random.random) -> float:
        """The jittered delay: ``base/2 + uniform() * base/2`` with ``uniform()`` in [0, 1)."""
        half = self.base(failures) / 2
        return half + uniform() * half
