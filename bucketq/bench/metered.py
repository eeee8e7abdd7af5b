"""A pass-through object store that counts calls by operation and by kind of key (where requests go)."""

from __future__ import annotations

import builtins
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

from bucketq.core import keys
from bucketq.errors import PreconditionFailed
from bucketq.storage import Blob, ObjectInfo, ObjectStore, RequestStats
from bucketq.storage.strategies import CLAIM_SUFFIX


def key_kind(key: str) -> str:
    """The protocol object a key (or LIST prefix) names: segment, delta, head, member, ...

    The layout is :func:`bucketq.core.keys.key_kind`'s; only the ``csprng_verify`` strategy's claim
    objects (``{key}`` plus :data:`~bucketq.storage.strategies.CLAIM_SUFFIX`) are told apart here,
    because the storage layer, not the key layout, adds them.
    """
    return "claim" if key.endswith(CLAIM_SUFFIX) else keys.key_kind(key)


class MeteredStore:
    """Wraps an :class:`ObjectStore`; ``calls`` counts ``"OP kind"`` (``"GET segment miss"`` for 404s).

    Counts are calls made by the engine; ``stats`` (the wrapped store's) counts requests on the
    wire, retries included.
    """

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.stats: RequestStats = inner.stats
        self.calls: Counter[str] = Counter()

    def __getattr__(self, name: str) -> Any:  # check(), list_prefixes() and adapter extras
        attr = getattr(self.inner, name)
        if name == "list_prefixes":

            async def list_prefixes(prefix: str, delimiter: str = "/") -> builtins.list[str]:
                self.calls[f"LIST {key_kind(prefix)}"] += 1
                result: builtins.list[str] = await attr(prefix, delimiter)
                return result

            return list_prefixes
        return attr

    async def get(self, key: str) -> Blob | None:
        blob = await self.inner.get(key)
        self.calls[f"GET {key_kind(key)}" + (" miss" if blob is None else "")] += 1
        return blob

    async def head(self, key: str) -> ObjectInfo | None:
        info = await self.inner.head(key)
        self.calls[f"HEAD {key_kind(key)}" + (" miss" if info is None else "")] += 1
        return info

    async def put(
        self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        name = f"PUT {key_kind(key)}"
        try:
            etag = await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)
        except PreconditionFailed:
            self.calls[name + " 412"] += 1
            raise
        self.calls[name] += 1
        return etag

    async def delete(self, keys: list[str]) -> None:
        self.calls[f"DELETE {key_kind(keys[0]) if keys else 'none'}"] += 1
        await self.inner.delete(keys)

    async def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        self.calls[f"LIST {key_kind(prefix)}"] += 1
        async for info in self.inner.list(prefix, start_after=start_after):
            yield info

    async def now(self) -> float:
        self.calls["HEAD clock"] += 1
        return await self.inner.now()

    async def close(self) -> None:
        await self.inner.close()
