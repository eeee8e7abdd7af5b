"""The store checks (``bucketq doctor``) run by the operator at start, and what it reports of them.

The operator is where a cluster first touches its bucket: it runs the checks of
:mod:`bucketq.storage.checks` once when it starts (in the background: reconciliation does not
wait), and reports them three ways (docs/operator.md, "Store checks"):

* a ``StoreChecked`` condition on every Topic it reconciles (True when every check passed, False
  naming the failed checks, Unknown while they run or when they could not run);
* ``bucketq_store_check_passed{check}`` (1 passed, 0 failed) in its metrics;
* a log line per failed check (WARNING) or one INFO line when all passed.

A failed check does not stop the operator: the store may be fine for reading while an admin
replaces it, and stopping would hide the status. The condition is what alerts and humans read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from bucketq.config import Settings
from bucketq.errors import StorageError
from bucketq.operator.status import Cond
from bucketq.storage import open_storage
from bucketq.storage.checks import StoreReport, check_store

log = logging.getLogger("bucketq.operator")

STORE_CHECKED = "StoreChecked"
Redactor = Callable[[str], str]
ReportSink = Callable[[StoreReport], None]


class StoreCheckRun:
    """One run of the checks on the operator's bucket, and the condition it yields."""

    def __init__(self, engine: Settings, redact: Redactor) -> None:
        self.engine = engine
        self.redact = redact
        self.report: StoreReport | None = None
        self.error: str | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self, on_report: ReportSink) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(on_report))

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self, on_report: ReportSink) -> None:
        try:
            storage = await open_storage(self.engine)
        except StorageError as exc:
            self.error = self.redact(str(exc))
            log.warning("store checks could not run: %s", self.error)
            return
        try:
            report = await check_store(
                storage, self.engine.root, clock_tolerance_s=self.engine.consumer.clock_skew_s
            )
        finally:
            await storage.close()
        self.report = report
        on_report(report)
        for check in report.checks:
            if check.failed:
                log.warning("store check %s FAILED: %s", check.name, self.redact(check.summary))
        if report.ok:
            log.info(
                "store checks passed (strategy %s): the store does what bucketq assumes", report.strategy
            )
        else:
            log.warning(
                "the store failed %d check(s) (%s): bucketq can lose or duplicate messages on it "
                "(docs/operations.md, 'Checking your store')",
                len(report.failed),
                ", ".join(c.name for c in report.failed),
            )

    def condition(self) -> Cond:
        """The ``StoreChecked`` condition for a Topic's status."""
        if self.report is None:
            if self.error is not None:
                return Cond(
                    STORE_CHECKED, None, "ChecksNotRun", f"the store checks could not run: {self.error}"
                )
            return Cond(STORE_CHECKED, None, "Checking", "the store checks run since the operator started")
        if self.report.ok:
            return Cond(
                STORE_CHECKED,
                True,
                "ChecksPassed",
                f"the store passed every check at operator start (strategy {self.report.strategy})",
            )
        failed = "; ".join(f"{c.name}: {c.summary}" for c in self.report.failed)
        return Cond(
            STORE_CHECKED,
            False,
            "ChecksFailed",
            self.redact(
                f"the store failed at operator start: {failed} (docs/operations.md, 'Checking your store')"
            ),
        )
