"""One engine connection per namespace, rooted at ``{root}/{namespace}``; secrets kept out of messages."""

from __future__ import annotations

import asyncio
import logging

from bucketq.config import Settings
from bucketq.core.app import Bucketq
from bucketq.core.keys import namespace_root
from bucketq.errors import BucketqError

log = logging.getLogger("bucketq.operator")


class Buckets:
    """Opens a :class:`Bucketq` per namespace on first use; a failed open is retried on next use."""

    def __init__(self, engine: Settings) -> None:
        self.engine = engine
        self._open: dict[str, Bucketq] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._closed = False

    @property
    def stopping(self) -> bool:
        """The operator's clean-up closed the connections (a handler still running fails on them)."""
        return self._closed

    def settings_for(self, namespace: str) -> Settings:
        return self.engine.model_copy(update={"root": namespace_root(self.engine.root, namespace)})

    async def get(self, namespace: str) -> Bucketq:
        """The open connection of ``namespace`` (raises StorageError while S3 is unreachable)."""
        bq = self._open.get(namespace)
        if bq is not None:
            return bq
        if self._closed:
            raise BucketqError("the operator is stopping: no new storage connections")
        lock = self._locks.setdefault(namespace, asyncio.Lock())
        async with lock:
            bq = self._open.get(namespace)
            if bq is None:
                bq = Bucketq(self.settings_for(namespace))
                try:
                    await bq.open()
                except BaseException:
                    await bq.close()
                    raise
                log.info(
                    "namespace %s: storage root %r (strategy %s)", namespace, bq.settings.root, bq.strategy
                )
                self._open[namespace] = bq
            return bq

    async def close(self) -> None:
        self._closed = True
        for bq in self._open.values():
            await bq.close()
        self._open.clear()

    def secrets(self) -> list[str]:
        """Secret values that must never appear in a log line, an event or a status."""
        out = []
        for secret in (self.engine.s3_access_key_id, self.engine.s3_secret_access_key):
            if secret is not None and secret.get_secret_value():
                out.append(secret.get_secret_value())
        return out

    def redact(self, text: str) -> str:
        """``text`` with every secret value masked."""
        for secret in self.secrets():
            text = text.replace(secret, "***")
        return text
