"""The bucket's storage format marker ``R/_bucketq/format.json`` (docs/protocol.md).

Format 2 adds GC fences, topic incarnations and the ``expire`` op; format 3 the ``seek`` op and
the topic retention limits; format 4 stamps cursor deltas and checkpoints with the topic
incarnation (I6); format 5 reference segments and columnar chunks (job commits that copy nothing,
I17-I19); format 6 the ``stand`` op (standing claims, docs/protocol.md). Every older object is a
valid object of the newest format, so an older bucket is upgraded in place when a process of this
version opens it (3 -> 4 -> 5 -> 6 in one step: the changes add to each other); processes of an
older format refuse the bucket when they next start (stop them first: a format-3 process would
apply a delta of another incarnation that newer replicas refuse, a format-3 or 4 reader cannot
read a reference segment and would take it for a corrupt one, and a format-5 reader would drop a
``stand`` op and let other members claim what it covers). A bucket of a newer format is refused.
"""

from __future__ import annotations

import json
import logging

from bucketq.core.keys import Keys
from bucketq.errors import AlreadyExists, BucketqError, Contended, PreconditionFailed
from bucketq.storage import Storage

log = logging.getLogger("bucketq")

FORMAT = 6
UPGRADABLE_FORMATS = (1, 2, 3, 4, 5)


async def ensure_format(storage: Storage, keys: Keys) -> None:
    """Create the marker, upgrade an older one in place, or refuse a newer format."""
    key = keys.format_marker()
    try:
        await storage.create(key, json.dumps({"format": FORMAT}).encode())
        return
    except (AlreadyExists, Contended):
        pass
    blob = await storage.get(key)
    if blob is None:
        return  # removed between the two calls: the next open writes it again
    found = json.loads(blob.data).get("format")
    if found in UPGRADABLE_FORMATS:
        log.warning(
            "upgrading bucket storage format %s to %s in place; stop processes of older versions: "
            "they cannot read what this version writes",
            found,
            FORMAT,
        )
        try:
            await storage.store.put(key, json.dumps({"format": FORMAT}).encode(), if_match=blob.etag)
        except PreconditionFailed:
            pass  # another process upgraded it at the same moment
        return
    if found != FORMAT:
        raise BucketqError(
            f"bucket holds bucketq storage format {found}; this version speaks {FORMAT}"
            + (": upgrade bucketq" if isinstance(found, int) and found > FORMAT else "")
        )
