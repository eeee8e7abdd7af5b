"""Objects bucketq did not write, met in a listing of one of its data prefixes (invariant I8).

A bucket is shared with people and tools: a ``.keep`` or ``README.txt`` dropped into a partition's
``seg/``, an S3 console's folder marker, a sync tool's lock file in a cursor log. Every listing of
a data prefix takes only the names bucketq writes (``keys.seq_of``, ``keys.heartbeat_member``,
``keys.is_dedup_key``, ``keys.is_topic_object``) and passes anything else to :func:`skip_foreign`:
such an object is never parsed, applied, or deleted by GC; it is logged once per key (a warning
that names it) and counted. No foreign object ends a loop, stops a GC run or blocks a join.
"""

from __future__ import annotations

import logging

log = logging.getLogger("bucketq.foreign")

# Keys remembered to log each once; beyond this many, foreign objects are still skipped and
# counted, only no longer logged (a bucket full of junk must not grow a process's memory).
MAX_REMEMBERED = 10_000

_logged: set[str] = set()
_sightings = 0


def skip_foreign(key: str, where: str) -> None:
    """Note that a listing met ``key``, a name bucketq does not write, while ``where`` (what the
    listing was for) and skipped it: log it the first time, count every sighting."""
    global _sightings
    _sightings += 1
    if key in _logged or len(_logged) >= MAX_REMEMBERED:
        return
    _logged.add(key)
    log.warning(
        "%s: skipped %s, an object bucketq did not write (a foreign object in one of its prefixes; "
        "remove it, or keep such files outside the queue's root)",
        where,
        key,
    )


def foreign_objects() -> int:
    """Distinct foreign objects this process has met (up to MAX_REMEMBERED)."""
    return len(_logged)


def foreign_sightings() -> int:
    """How many times a listing of this process skipped a foreign object (a counter)."""
    return _sightings
