"""A timer still running when the operator's clean-up closes the storage connections ends quietly;
the same failure while the operator runs is a fault, raised for kopf to report and retry."""

from __future__ import annotations

import asyncio

import pytest

from bucketq.config import Settings
from bucketq.errors import BucketqError
from bucketq.operator.buckets import Buckets
from bucketq.operator.handlers import _until_stopped


async def _fails_on_a_closed_connection() -> None:
    await asyncio.sleep(0)
    raise BucketqError("Bucketq is not open: use 'async with Bucketq(...)' or 'await bq.open()'")


async def test_a_timer_failing_on_closed_connections_at_shutdown_ends_quietly() -> None:
    buckets = Buckets(Settings(backend="memory"))
    await buckets.close()
    assert buckets.stopping
    with pytest.raises(BucketqError, match="operator is stopping"):
        await buckets.get("default")
    await _until_stopped(asyncio.Event(), _fails_on_a_closed_connection(), lambda: buckets.stopping)


async def test_the_same_failure_while_running_is_raised() -> None:
    buckets = Buckets(Settings(backend="memory"))
    assert not buckets.stopping
    with pytest.raises(BucketqError, match="not open"):
        await _until_stopped(asyncio.Event(), _fails_on_a_closed_connection(), lambda: buckets.stopping)
    await buckets.close()


async def test_a_timer_whose_work_fails_after_its_cancellation_at_shutdown_ends_quietly() -> None:
    """kopf stops the timer while a step of its work finishes regardless of the cancellation and
    then meets the connections the clean-up closed: nothing is raised, neither by the timer nor
    by the work's task (kopf awaits the tasks still running at its exit and raises their errors)."""
    buckets = Buckets(Settings(backend="memory"))

    async def finishes_a_step_then_fails() -> None:
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            await buckets.close()  # the clean-up closed the connections meanwhile
            raise BucketqError(
                "Bucketq is not open: use 'async with Bucketq(...)' or 'await bq.open()'"
            ) from None

    stopped = asyncio.Event()
    before = asyncio.all_tasks()
    timer = asyncio.ensure_future(
        _until_stopped(stopped, finishes_a_step_then_fails(), lambda: buckets.stopping)
    )
    await asyncio.sleep(0.01)
    stopped.set()
    await timer
    for task in asyncio.all_tasks() - before - {asyncio.current_task()}:
        await task
