"""The per-topic wake object: a cheap signal that an idle topic has new work (invariant I13).

An idle consumer member would otherwise poll every partition of every topic it reads. Instead,
while its topics are idle, it polls each topic's ``.wake`` object (one GET per topic) and the
partitions only at a slow fallback cadence. Producers overwrite the object after a durable append
when they have not done so for WAKE_REFRESH_S, so a topic that starts receiving messages wakes its
idle readers within one wake poll; a ``seek`` touches it too, so an idle group reads the new op.

The object is advisory: a lost or failed touch only delays pickup until the fallback poll, never
loses or duplicates anything (correctness rests on the segments and cursor logs alone).
"""

from __future__ import annotations

import json
import logging
import time

from bucketq.core.keys import Keys
from bucketq.errors import StorageError
from bucketq.storage import Storage

log = logging.getLogger("bucketq.wake")

# A producer touches a topic's wake object at most this often while it keeps publishing, so a
# reader that saw a touch stays active WAKE_ACTIVE_S and never misses a producer that is busy.
WAKE_REFRESH_S = 20.0
WAKE_ACTIVE_S = 3 * WAKE_REFRESH_S


async def touch_wake(storage: Storage, keys: Keys, topic: str, by: str) -> bool:
    """Overwrite the topic's wake object; False (logged) when the store refused (advisory only)."""
    body = json.dumps({"at": time.time(), "by": by}).encode()
    try:
        await storage.overwrite(keys.wake(topic), body)
    except StorageError as exc:
        log.debug("wake object of %s not touched: %s", topic, exc)
        return False
    return True


class WakeWatch:
    """One reader's view of a topic's wake object: did it change since the last look?"""

    def __init__(self, storage: Storage, keys: Keys, topic: str) -> None:
        self.storage = storage
        self.key = keys.wake(topic)
        self.etag: str | None = None
        self.read = False  # read at least once

    async def changed(self) -> bool:
        """GET the object; True when it differs from the last read (the first read included, so a
        touch made before this reader started or while it was busy is not missed). Store errors
        count as unchanged (the fallback poll covers them)."""
        try:
            blob = await self.storage.get(self.key)
        except StorageError:
            return False
        etag = blob.etag if blob is not None else None
        changed = etag is not None and (etag != self.etag or not self.read)
        self.etag, self.read = etag, True
        return changed
