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
