"""When the sidecar clients retry a request by themselves: an answer that says "later".

A 429 (``buffer_full``: nothing was published) and a 503 (starting, the bucket did not answer in
time) are retried after the wait the sidecar asks for in ``Retry-After`` (a little more, jittered,
so that many callers told the same wait do not come back at the same instant), or, without one,
after an exponential backoff. A 503 ``draining`` is not retried: the sidecar is shutting down and
will not serve this pod again. The retries are bounded twice: at most ``attempts`` tries in all,
and at most ``budget_s`` seconds of waiting, a wait that would go past the budget is not started
(the error is raised at once instead of after a pointless sleep).

Retrying is at-least-once: a publish answered 503 ``publish_timeout`` may still land (the sidecar
says so), so its retry can publish the message twice; give it a ``dedup_id`` and the copy is
dropped by the topic's deduplication. Settlements (ack, nack, extend) are idempotent for a receipt
settled lately, so retrying them is safe.
"""

from __future__ import annotations

import email.utils
import random
import time
from dataclasses import dataclass

from bucketq.errors import SidecarError

DRAINING = "draining"


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How many times and how long a client retries 429 and 503 answers (see the module doc).

    ``RetryPolicy(attempts=1)`` (or ``retry=None`` on a client) never retries.
    """

    attempts: int = 4  # tries in all, the first included
    budget_s: float = 20.0  # seconds of waiting in all, per call
    backoff_s: float = 0.5  # the first wait when the answer names none; it doubles, up to max_backoff_s
    max_backoff_s: float = 5.0
    jitter: float = 0.1  # a Retry-After wait is stretched by up to this fraction

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {self.attempts}")
        for name in ("budget_s", "backoff_s", "max_backoff_s", "jitter"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")

    def begin(self, rng: random.Random | None = None) -> Retries:
        """The retry state of one call."""
        return Retries(self, rng or random.Random())


NO_RETRY = RetryPolicy(attempts=1)


def retryable(error: SidecarError) -> bool:
    """An answer that says "try again later" (429, 503 other than ``draining``)."""
    return error.status == 429 or (error.status == 503 and error.code != DRAINING)


@dataclass
class Retries:
    """One call's tries so far: :meth:`wait_after` says how long to wait before the next, if any."""

    policy: RetryPolicy
    rng: random.Random
    tries: int = 1
    waited: float = 0.0

    def wait_after(self, error: SidecarError) -> float | None:
        """Seconds to wait before trying again after ``error``; None: give up and raise it."""
        policy = self.policy
        if not retryable(error) or self.tries >= policy.attempts:
            return None
        if error.retry_after is not None:
            wait = max(0.0, error.retry_after) * (1 + policy.jitter * self.rng.random())
        else:
            ceiling = min(policy.max_backoff_s, policy.backoff_s * 2 ** (self.tries - 1))
            wait = ceiling / 2 + self.rng.random() * ceiling / 2
        if self.waited + wait > policy.budget_s:
            return None
        self.tries += 1
        self.waited += wait
        return wait


def parse_retry_after(raw: str | None, now: float | None = None) -> float | None:
    """``Retry-After`` in seconds: delta-seconds (``"1"``, fractions accepted) or an HTTP date."""
    if raw is None:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))
