"""How one reconciliation ends: status phase, conditions, metrics, and kopf's retry or give-up."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import kopf

from bucketq.errors import StorageError
from bucketq.operator.buckets import Buckets
from bucketq.operator.metrics import QueueMetrics
from bucketq.operator.models import Phase
from bucketq.operator.status import READY, STORAGE_REACHABLE, Cond, merge_conditions, patch_status


class InvalidSpec(Exception):
    """The spec cannot be applied as it is; only a spec change helps (no retry)."""


class Waiting(Exception):
    """Something the resource needs does not exist yet (retried with backoff)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Outcome:
    """Collects the status a reconciliation wants to write."""

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}
        self.conditions: list[Cond] = []

    def set(self, **fields: Any) -> None:
        self.fields.update(fields)

    def condition(self, cond: Cond) -> None:
        self.conditions.append(cond)


class Reconciler:
    """Turns the end of a reconciliation into a status patch and a kopf outcome."""

    def __init__(
        self, buckets: Buckets, metrics: QueueMetrics, retry_min_s: float, retry_max_s: float
    ) -> None:
        self.buckets = buckets
        self.metrics = metrics
        self.retry_min_s = retry_min_s
        self.retry_max_s = retry_max_s

    def backoff(self, retry: int) -> float:
        return float(min(self.retry_max_s, self.retry_min_s * 2 ** min(retry, 30)))

    @asynccontextmanager
    async def reconciling(
        self,
        kind: str,
        namespace: str,
        body: Mapping[str, Any],
        patch: Any,
        *,
        retry: int = 0,
        raise_errors: bool = True,
    ) -> AsyncIterator[Outcome]:
        """Run a reconciliation; write phase, conditions and fields into ``patch.status``.

        StorageError and Waiting end in kopf.TemporaryError (retry with exponential backoff),
        InvalidSpec in kopf.PermanentError; with ``raise_errors=False`` (timers) only the status
        is written.
        """
        status: Mapping[str, Any] = body.get("status") or {}
        generation = (body.get("metadata") or {}).get("generation")
        # Degraded (not Pending) once the resource was ever in sync: ``observedGeneration`` is set
        # by every successful reconciliation and never removed, so a handler that runs with a stale
        # body (a retry scheduled during an earlier outage) cannot turn Degraded into Pending
        was_ready = status.get("phase") in (Phase.READY, Phase.DEGRADED) or (
            status.get("observedGeneration") is not None and status.get("phase") != Phase.FAILED
        )
        out = Outcome()
        error: Exception | None = None
        phase = Phase.READY
        try:
            yield out
        except StorageError as exc:
            message = self.buckets.redact(str(exc))
            phase = Phase.DEGRADED if was_ready else Phase.PENDING
            out.condition(Cond(READY, False, "StorageUnavailable", message))
            out.condition(Cond(STORAGE_REACHABLE, False, "Unreachable", message))
            self.metrics.storage_reachable.labels(namespace).set(0)
            self.metrics.reconcile_errors.labels(kind, "StorageUnavailable").inc()
            error = kopf.TemporaryError(message, delay=self.backoff(retry))
        except Waiting as exc:
            message = self.buckets.redact(str(exc))
            phase = Phase.PENDING
            out.condition(Cond(READY, False, exc.reason, message))
            self.metrics.reconcile_errors.labels(kind, exc.reason).inc()
            error = kopf.TemporaryError(message, delay=self.backoff(retry))
        except InvalidSpec as exc:
            message = self.buckets.redact(str(exc))
            phase = Phase.FAILED
            out.condition(Cond(READY, False, "InvalidSpec", message))
            out.set(observedGeneration=generation)
            self.metrics.reconcile_errors.labels(kind, "InvalidSpec").inc()
            error = kopf.PermanentError(message)
        except Exception as exc:
            message = self.buckets.redact(f"{type(exc).__name__}: {exc}")
            phase = Phase.DEGRADED if was_ready else Phase.PENDING
            out.condition(Cond(READY, False, "InternalError", message))
            self.metrics.reconcile_errors.labels(kind, "InternalError").inc()
            error = kopf.TemporaryError(message, delay=self.backoff(retry))
        else:
            out.condition(Cond(READY, True, "Reconciled", f"{kind} is in sync with the bucket"))
            out.condition(Cond(STORAGE_REACHABLE, True, "Reachable", "the bucket answered"))
            out.set(observedGeneration=generation)
            self.metrics.storage_reachable.labels(namespace).set(1)
        self.metrics.reconciles.labels(kind, "error" if error else "ok").inc()
        desired = {**out.fields, "phase": str(phase)}
        desired["conditions"] = merge_conditions(status.get("conditions"), out.conditions, generation)
        patch_status(patch.status, status, desired)
        if error is not None and raise_errors:
            raise error
