"""Storage: the object-store port, its adapters and the put-if-absent strategies.

The engine talks to a :class:`Storage` obtained from :func:`open_storage`. Adapters:
:class:`~bucketq.storage.memory.MemoryStore`, :class:`~bucketq.storage.filesystem.FileStore`
and ``bucketq.storage.s3.S3Store`` (imported on demand: it pulls in aioboto3).

Exported here is what a caller of the port uses; the machinery behind it (claim suffixes, the
strategy probe, building a store from settings, etags) is imported from the module defining it.
"""

from bucketq.storage.filesystem import FileStore
from bucketq.storage.memory import MemoryStore
from bucketq.storage.port import Blob, ObjectInfo, ObjectStore, RequestStats
from bucketq.storage.strategies import Storage, open_storage

__all__ = [
    "Blob",
    "FileStore",
    "MemoryStore",
    "ObjectInfo",
    "ObjectStore",
    "RequestStats",
    "Storage",
    "open_storage",
]
