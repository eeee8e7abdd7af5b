"""The per-topic wake object: a cheap signal that an idle topic has new work (invariant I13).

An idle consumer member would otherwise poll every partition of every topic it reads. Instead,
while its topics are idle, it polls each topic's ``.wake`` object (one GET per topic) and the
partitions only at a slow fallback cadence. Producers overwrite the object after a durable append
when they have not done so for WAKE_REFRESH_S, so a topic that starts receiving messages wakes its
idle readers within one wake poll; a ``seek`` touches it too, so an idle group reads the new op.

A member joining or leaving the group touches it too, marked ``"why": "members"``: the idle
members then re-read the member list and look at the partitions once, on their next turn, without
turning the topic active (a touch of either kind may hide the other, so each kind looks at every
partition once). Whose turn it is to read the object (one member a slot, ``next_wake_turn``)
is decided in ``core/cadence.py``, with every other "when next".

The object is advisory: a lost or failed touch only delays pickup until the fallback poll, never
loses or duplicates anything (correctness rests on the segments and cursor logs alone).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Literal

from bucketq.core.keys import Keys
from bucketq.errors import PreconditionFailed, StorageError
from bucketq.storage import Storage

log = logging.getLogger("bucketq.wake")

# A producer touches a topic's wake object at most this often while it keeps publishing, so a
# reader that saw a touch stays active WAKE_ACTIVE_S and never misses a producer that is busy.
WAKE_REFRESH_S = 20.0
WAKE_ACTIVE_S = 3 * WAKE_REFRESH_S
# Why a wake object changed: "publish" (a producer appended, a job committed, a seek moved the
# cursors: the topic turns active) or "members" (the group changed: look once, stay idle).
WakeReason = Literal["publish", "members"]


def _wake_body(by: str, why: WakeReason) -> bytes:
    return json.dumps({"at": time.time(), "by": by, "why": why}).encode()


async def touch_wake(
    storage: Storage, keys: Keys, topic: str, by: str, why: WakeReason = "publish"
) -> str | None:
    """Overwrite the topic's wake object; its ETag, or None (logged) when the store refused
    (advisory only)."""
    try:
        return await storage.overwrite(keys.wake(topic), _wake_body(by, why))
    except StorageError as exc:
        log.debug("wake object of %s not touched: %s", topic, exc)
        return None


async def retouch_wake(
    storage: Storage, keys: Keys, topic: str, by: str, etag: str | None
) -> tuple[str | None, bool]:
    """A producer's touch (``"publish"``) that also tells whether anyone else touched the object
    since this writer's last touch (``etag``): (the new ETag or None, touched by another).

    Where the store has conditional writes the overwrite is made ``If-Match`` that ETag first; a
    412 (a member joined or left, another producer or a job touched it) is answered by a plain
    overwrite, as is any other refusal of the conditional write (the object gone: a store may
    answer 404; an outage), which also counts as touched by another (nobody knows). Without an
    ETag, or without conditional writes, it is a plain touch (and says nothing about others).
    Advisory, like every touch: it never raises.
    """
    if etag is None or storage.strategy != "conditional_write":
        return await touch_wake(storage, keys, topic, by), False
    try:
        return await storage.store.put(keys.wake(topic), _wake_body(by, "publish"), if_match=etag), False
    except PreconditionFailed:
        pass
    except StorageError as exc:
        log.debug("conditional touch of the wake object of %s refused: %s", topic, exc)
    return await touch_wake(storage, keys, topic, by), True


class WakeWatch:
    """One reader's view of a topic's wake object: did it change since the last look, and why?"""

    def __init__(self, storage: Storage, keys: Keys, topic: str) -> None:
        self.storage = storage
        self.key = keys.wake(topic)
        self.etag: str | None = None
        self.read = False  # read at least once

    async def look(self) -> WakeReason | None:
        """GET the object; its reason when it differs from the last read, else None.

        The first read counts as a change (a touch made before this reader started is not
        missed), as "publish" only while that touch is younger than WAKE_ACTIVE_S. A body this
        version cannot read (a later writer's) counts as "publish". Store errors count as
        unchanged (the fallback poll covers them).
        """
        try:
            blob = await self.storage.get(self.key)
        except StorageError:
            return None
        first = not self.read
        self.read = True
        if blob is None:
            self.etag = None
            return None
        if blob.etag == self.etag and not first:
            return None
        self.etag = blob.etag
        try:
            body = json.loads(blob.data)
            why = body.get("why", "publish")
            at = float(body.get("at", 0.0))
        except (ValueError, TypeError, AttributeError):
            return "publish"
        if why == "members":
            return "members"
        if first and time.time() - at > WAKE_ACTIVE_S:
            return "members"  # an old touch: look once, the topic need not turn active
        return "publish"
