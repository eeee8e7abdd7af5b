"""The shutdown budget: one deadline from SIGTERM to process exit, and the watchdog that keeps it.

Phases, all measured from the signal (``t0``)::

    t0 ── drain ──▶ t0 + drain_s ── requeue, release, flush, close ──▶ t0 + budget_s  (exit)
                                                                      + HARD_EXIT_AFTER_S (forced)

* drain: no new claims or publishes; open push requests, accepted publishes and the app's
  settlements may finish. It lasts at most ``drain_s = min(drain_grace_s, budget_s - reserve_s)``:
  ``DRAIN_GRACE_S`` is clipped so that a share of the budget (``reserve_s``, a fifth of it, at
  most 5 s) is left to give back what the app still holds and to close the engine.
* requeue/release/close: bounded by what remains of the budget. During an S3 outage these
  requests cannot succeed; the sidecar gives up at the deadline and the leases it still held expire
  on their own after the visibility timeout (safe by the protocol: an expired lease is redelivered).
* the :class:`Watchdog` ends the process ``HARD_EXIT_AFTER_S`` after the deadline even if the event
  loop or the interpreter's own shutdown is stuck (a blocked thread, a task that ignores
  cancellation).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from dataclasses import dataclass, field

log = logging.getLogger("bucketq.sidecar")

MAX_RESERVE_S = 5.0
RESERVE_SHARE = 0.2
HARD_EXIT_AFTER_S = 1.0


@dataclass(frozen=True, slots=True)
class ShutdownPlan:
    """Deadlines of one shutdown, started at ``started`` (``time.monotonic()``)."""

    budget_s: float
    drain_grace_s: float
    started: float = field(default_factory=time.monotonic)

    @property
    def reserve_s(self) -> float:
        """The part of the budget kept for requeue, release and close after the drain."""
        return min(MAX_RESERVE_S, self.budget_s * RESERVE_SHARE)

    @property
    def drain_s(self) -> float:
        """How long the drain phase may last: DRAIN_GRACE_S clipped to the budget minus the reserve."""
        return max(0.0, min(self.drain_grace_s, self.budget_s - self.reserve_s))

    @property
    def clipped(self) -> bool:
        """Whether the budget cut the configured drain grace short."""
        return self.drain_s < self.drain_grace_s

    @property
    def deadline(self) -> float:
        return self.started + self.budget_s

    def drain_left(self) -> float:
        """Seconds left of the drain phase (0 once it is over)."""
        return max(0.0, self.started + self.drain_s - time.monotonic())

    def left(self) -> float:
        """Seconds left of the whole budget (0 once it is spent)."""
        return max(0.0, self.deadline - time.monotonic())


class Watchdog:
    """Ends the process with ``code`` at ``deadline`` (monotonic) unless :meth:`disarm` came first.

    A daemon thread, so it never delays a normal exit; it uses ``os._exit`` because by then the
    orderly path has already failed to finish and nothing that waits on the event loop can be
    trusted to return.
    """

    def __init__(self, deadline: float, code: int) -> None:
        self.deadline = deadline
        self.code = code
        self._disarmed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="shutdown-watchdog", daemon=True)

    def arm(self) -> Watchdog:
        self._thread.start()
        return self

    def disarm(self) -> None:
        self._disarmed.set()

    def _run(self) -> None:
        if self._disarmed.wait(max(0.0, self.deadline - time.monotonic())):
            return
        log.error("shutdown did not finish in time: exiting with code %d", self.code)
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stderr.flush()
        os._exit(self.code)
