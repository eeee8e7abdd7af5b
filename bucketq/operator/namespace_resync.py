"""Serving every matching namespace, including one kopf's namespace watch missed.

An operator scoped to namespaces (``BUCKETQ_OPERATOR_NAMESPACES``, names or globs) learns which
namespaces exist from kopf's namespace observer: one LIST at start-up, then a watch. The watch
begins with a LIST of its own, and kopf ignores the objects of that LIST (it treats them as
already known). A namespace created between the two LISTs is therefore never served: its Topics
and Consumers stay unreconciled and its pods are refused by the webhook, until the operator
restarts. The same gap opens whenever the watch restarts after ``410 Gone``.

:class:`NamespaceResync` closes it: every ``namespace_resync_s`` it lists the namespaces and adds
each matching one kopf does not serve, through kopf's own revision of its insights (the call its
observer makes), so kopf starts the watches for it as it does for any namespace it sees.

Invariant: a matching namespace that exists is served within ``namespace_resync_s`` of the
operator being ready, whatever the watch missed. The resync only adds (and lets kopf drop a
namespace that is being deleted); removals stay with the watch's DELETED events, which it does not
miss. Adding a namespace deleted just after the LIST costs a watch that sees no objects.

kopf exposes no public call for this. It accepts an ``Insights`` object in ``kopf.operator`` and
revises it with ``observation.revise_namespaces``; kopf is pinned (``>=1.45.2,<1.46``) and
``tests/operator/test_namespace_resync.py`` makes the start-up race happen against the API
emulator, so a kopf release that moves these names fails the tests first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import kopf
from kopf._cogs.clients import fetching
from kopf._cogs.structs import references
from kopf._core.engines import posting
from kopf._core.reactor import observation

log = logging.getLogger("bucketq.operator")


class NamespaceResync:
    """Lists the namespaces every ``interval_s`` and has kopf serve each matching one it missed."""

    def __init__(self, patterns: list[str], interval_s: float) -> None:
        self.patterns = list(patterns)
        self.interval_s = interval_s
        # Created here and handed to kopf.operator: kopf's observers revise this very object.
        self.insights = references.Insights()
        self._task: asyncio.Task[None] | None = None

    def register(self, registry: kopf.OperatorRegistry) -> None:
        """Start with the operator, stop at its clean-up (kopf's context carries its credentials)."""
        kopf.on.startup(id="namespace_resync", registry=registry)(self._start)
        kopf.on.cleanup(id="namespace_resync", registry=registry)(self._stop)

    async def _start(self, **_: Any) -> None:
        # A task started from a kopf activity inherits kopf's context: its API credentials and
        # settings, which fetch_objs needs.
        self._task = asyncio.create_task(self._run(), name="bucketq namespace resync")

    async def _stop(self, **_: Any) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        await self.insights.ready_namespaces.wait()
        while True:
            await asyncio.sleep(self.interval_s)
            try:
                await self.resync()
            except Exception as exc:  # the API server unreachable: the next round tries again
                log.warning("could not list the namespaces to serve: %r", exc)

    async def resync(self) -> list[str]:
        """One LIST of the namespaces; returns the matching ones kopf was not serving (now served)."""
        settings = posting.settings_var.get()
        resource = await self.insights.backbone.wait_for(references.NAMESPACES)
        added: list[str] = []
        async for chunk, _ in fetching.fetch_objs(
            settings=settings, resource=resource, namespace=None, logger=log
        ):
            async with self.insights.revised:
                before = set(self.insights.namespaces)
                observation.revise_namespaces(
                    raw_bodies=chunk, insights=self.insights, namespaces=self.patterns
                )
                added += sorted(str(ns) for ns in self.insights.namespaces - before if ns is not None)
                self.insights.revised.notify_all()
        for namespace in added:
            log.warning("namespace %r was missed by the namespace watch; serving it now", namespace)
        return added
