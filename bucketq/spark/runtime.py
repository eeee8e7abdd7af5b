"""Opening the engine's storage inside a Spark process (driver planner, executor task, job commit).

Nothing here is ever pickled: every process builds its own store and event loop from the plain
settings dict that travels with the reader or writer.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

from bucketq.config import Settings
from bucketq.core.keys import Keys
from bucketq.storage import Storage, open_storage

# reads never create objects, so they skip the strategy probe
READ_STRATEGY = "conditional_write"


def settings_of(data: dict[str, Any], *, strategy: str | None = None) -> Settings:
    """Settings from a :func:`~bucketq.spark.options.resolve_settings` dict."""
    if strategy is not None:
        data = {**data, "strategy": strategy}
    return Settings.from_dict(data)


@asynccontextmanager
async def storage_for(data: dict[str, Any], *, strategy: str | None = None) -> AsyncIterator[Storage]:
    """An opened :class:`Storage` for the settings dict, closed on exit."""
    storage = await open_storage(settings_of(data, strategy=strategy))
    try:
        yield storage
    finally:
        await storage.close()


@contextmanager
def paused_gc(enabled: bool = True) -> Iterator[None]:
    """No cyclic garbage collection inside the block (a task's hot loop), one collection after.

    A task creates and drops millions of short-lived objects while tens of thousands stay alive
    (publishes in flight, decoded segments); Python's generational collector would then spend
    about half the task walking them. Reference counting still frees almost everything at once.
    """
    if not enabled:  # nothing per message in Python here: nothing to spare the collector
        yield
        return
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
            gc.collect()


def keys_of(data: dict[str, Any]) -> Keys:
    return Keys(str(data.get("root") or "").strip("/"))


async def delete_prefix(storage: Storage, prefix: str) -> int:
    """Delete every object under ``prefix`` (batches of 1000); returns how many."""
    batch: list[str] = []
    deleted = 0
    async for info in storage.store.list(prefix):
        batch.append(info.key)
        if len(batch) >= 1000:
            await storage.delete(batch)
            deleted += len(batch)
            batch = []
    if batch:
        await storage.delete(batch)
        deleted += len(batch)
    return deleted
