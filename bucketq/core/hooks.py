"""What a consumer tells whoever watches it (the sidecar's metrics), as public types.

A watcher depends on these, not on the partition worker that produces the values: the worker's
result type may change with the loop, the counts it reports do not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class CommitCounts(Protocol):
    """What one commit of a member's cursor log did."""

    @property
    def ops(self) -> int:
        """Ops the delta carried (claims, settlements, ``seen``, ...)."""
        ...

    @property
    def conflicts(self) -> int:
        """Rebases: the delta's number was taken by another member first (a 412)."""
        ...

    @property
    def dead_lettered(self) -> int:
        """Messages the janitor dead-lettered (max deliveries), not the app's own dead-letters."""
        ...


# Consumer.on_commit: (topic, partition, what the commit did, seconds it took)
CommitHook = Callable[[str, int, CommitCounts, float], None]
