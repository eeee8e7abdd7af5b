"""Storage: the object-store port, its adapters and the put-if-absent strategies.

The engine talks to a :class:`Storage` obtained from :func:`open_storage`. Adapters:
:class:`~bucketq.storage.memory.MemoryStore`, :class:`~bucketq.storage.filesystem.FileStore`
and ``bucketq.storage.s3.S3Store`` (imported on demand: it pulls in aioboto3).
"""

from bucketq.storage.filesystem import FileStore
from bucketq.storage.memory import MemoryStore, etag_of
from bucketq.storage.port import Blob, ObjectInfo, ObjectStore, RequestStats
from bucketq.storage.strategies import (
    CLAIM_SUFFIX,
    Storage,
    StrategyName,
    build_store,
    open_storage,
    probe_strategy,
)

__all__ = [
    "CLAIM_SUFFIX",
    "Blob",
    "FileStore",
    "MemoryStore",
    "ObjectInfo",
    "ObjectStore",
    "RequestStats",
    "Storage",
    "StrategyName",
    "build_store",
    "etag_of",
    "open_storage",
    "probe_strategy",
]
