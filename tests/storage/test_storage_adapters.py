"""One contract, four adapters: memory, filesystem, moto server and SeaweedFS."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bucketq.errors import AlreadyExists, PreconditionFailed, StorageError
from bucketq.storage import FileStore, MemoryStore, ObjectStore, Storage
from bucketq.storage.faults import FaultyStore
from bucketq.storage.memory import etag_of
from bucketq.storage.port import prefixes_from_list
from bucketq.storage.s3 import S3Store
from tests.support.servers import S3Server

BACKENDS = [
    "memory",
    "file",
    pytest.param("moto", marks=pytest.mark.s3),
    pytest.param("seaweedfs", marks=pytest.mark.s3),
]


@pytest.fixture(params=BACKENDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ObjectStore]:
    """A fresh, empty store of each kind."""
    the_store: ObjectStore
    if request.param == "memory":
        the_store = MemoryStore()
    elif request.param == "file":
        the_store = FileStore(tmp_path / "bucket")
    else:
        server: S3Server = request.getfixturevalue(f"{request.param}_server")
        the_store = S3Store.from_settings(server.settings())
    try:
        yield the_store
    finally:
        await the_store.close()


async def put_many(store: ObjectStore, keys: list[str], parallel: int = 32) -> None:
    limit = asyncio.Semaphore(parallel)

    async def one(key: str) -> None:
        async with limit:
            await store.put(key, key.encode(), if_none_match=True)

    await asyncio.gather(*(one(k) for k in keys))


async def keys_of(store: ObjectStore, prefix: str, start_after: str | None = None) -> list[str]:
    return [info.key async for info in store.list(prefix, start_after=start_after)]


async def test_missing_key_reads_as_none(store: ObjectStore) -> None:
    assert await store.get("t/p0000/seg/0000000000000001.jsonl") is None
    assert await store.head("t/p0000/seg/0000000000000001.jsonl") is None


async def test_put_get_head_round_trip(store: ObjectStore) -> None:
    data = bytes(range(256)) * 3
    etag = await store.put("t/p0000/seg/0000000000000001.jsonl", data)
    assert etag == etag_of(data)  # S3's single-part ETag: quoted MD5

    blob = await store.get("t/p0000/seg/0000000000000001.jsonl")
    assert blob is not None
    assert blob.data == data
    assert blob.etag == etag
    assert abs(blob.last_modified - time.time()) < 30

    info = await store.head("t/p0000/seg/0000000000000001.jsonl")
    assert info is not None
    assert (info.key, info.size, info.etag) == ("t/p0000/seg/0000000000000001.jsonl", len(data), etag)


async def test_empty_object(store: ObjectStore) -> None:
    etag = await store.put("t/empty", b"", if_none_match=True)
    blob = await store.get("t/empty")
    assert blob is not None and blob.data == b"" and blob.etag == etag == etag_of(b"")


async def test_overwrite_replaces(store: ObjectStore) -> None:
    first = await store.put("t/head.json", b'{"seq": 1}')
    second = await store.put("t/head.json", b'{"seq": 2}')
    assert first != second
    blob = await store.get("t/head.json")
    assert blob is not None and blob.data == b'{"seq": 2}' and blob.etag == second


async def test_if_none_match_refuses_existing_key(store: ObjectStore) -> None:
    await store.put("t/log/0000000000000001.json", b"mine", if_none_match=True)
    with pytest.raises(AlreadyExists):
        await store.put("t/log/0000000000000001.json", b"theirs", if_none_match=True)
    blob = await store.get("t/log/0000000000000001.json")
    assert blob is not None and blob.data == b"mine"


async def test_if_match_compares_etags(store: ObjectStore) -> None:
    etag = await store.put("t/.topic", b"v1")
    new = await store.put("t/.topic", b"v2", if_match=etag)
    assert new == etag_of(b"v2")

    with pytest.raises(PreconditionFailed) as lost:
        await store.put("t/.topic", b"v3", if_match=etag)  # stale ETag
    assert not isinstance(lost.value, AlreadyExists)
    blob = await store.get("t/.topic")
    assert blob is not None and blob.data == b"v2"

    with pytest.raises(PreconditionFailed):
        await store.put("t/missing", b"x", if_match=etag)
    assert await store.head("t/missing") is None


def by_bytes(key: str) -> tuple[str, ...]:
    return (key,)


def by_components(key: str) -> tuple[str, ...]:
    return tuple(key.split("/"))


async def test_list_order_across_directories(store: ObjectStore, request: pytest.FixtureRequest) -> None:
    """S3 lists in byte order; SeaweedFS walks "directories" depth-first (component order).

    Both orders agree inside one directory level, which is all the engine relies on; and
    ``start_after`` pagination follows the server's own order, so nothing is skipped or repeated.
    """
    order = by_components if request.node.callspec.params["store"] == "seaweedfs" else by_bytes
    # '-' < '.' < '/' < '0': in byte order p/a-1 and p/a.b come before p/a/...
    keys = ["p/ab", "p/a0", "p/a/b/c", "p/a/1", "p/a.b", "p/a-1", "q/z", "o/z"]
    for key in keys:
        await store.put(key, key.encode())

    def expect(prefix: str, start_after: str | None = None) -> list[str]:
        chosen = [k for k in keys if k.startswith(prefix)]
        if start_after is not None:
            chosen = [k for k in chosen if order(k) > order(start_after)]
        return sorted(chosen, key=order)

    if order is by_bytes:
        assert expect("p/") == ["p/a-1", "p/a.b", "p/a/1", "p/a/b/c", "p/a0", "p/ab"]
    else:
        assert expect("p/") == ["p/a/1", "p/a/b/c", "p/a-1", "p/a.b", "p/a0", "p/ab"]
    for prefix, start_after in [
        ("p/", None),
        ("p/a", None),
        ("p/a/", None),
        ("p/a/b", None),
        ("p/a", "p/a/1"),
        ("p/", "p/a/"),
        ("p/", "p/a-1"),
        ("p/", "p/ab"),
        ("nothing/", None),
        ("", None),
    ]:
        assert await keys_of(store, prefix, start_after) == expect(prefix, start_after), (prefix, start_after)

    infos = [info async for info in store.list("p/a/")]
    assert [i.size for i in infos] == [len(b"p/a/1"), len(b"p/a/b/c")]
    assert infos[0].etag == etag_of(b"p/a/1")


async def test_pagination_and_batched_delete_past_1000_keys(store: ObjectStore) -> None:
    keys = [f"t/p0000/seg/{n:016d}.jsonl" for n in range(1005)]
    await put_many(store, keys)
    await store.put("t/p0001/seg/0000000000000000.jsonl", b"other partition")

    before = store.stats.requests["LIST"]
    listed = await keys_of(store, "t/p0000/")
    assert listed == keys
    assert store.stats.requests["LIST"] - before == 2  # 1000 + 5

    assert await keys_of(store, "t/p0000/", start_after=keys[998]) == keys[999:]

    before = store.stats.requests["DELETE"]
    await store.delete([*keys, "t/p0000/seg/never-written"])
    assert store.stats.requests["DELETE"] - before == 2  # batches of 1000
    assert await keys_of(store, "t/p0000/") == []
    assert await keys_of(store, "t/") == ["t/p0001/seg/0000000000000000.jsonl"]
    await store.delete(["t/does/not/exist"])  # missing keys are not an error


async def test_requests_are_counted_by_op_with_bytes(store: ObjectStore) -> None:
    data = b"x" * 1234
    await store.put("t/a", data)
    await store.get("t/a")
    await store.head("t/a")
    await keys_of(store, "t/")
    await store.delete(["t/a"])
    assert store.stats.snapshot() == {"PUT": 1, "GET": 1, "HEAD": 1, "LIST": 1, "DELETE": 1}
    assert store.stats.total == 5
    assert store.stats.bytes_out == 1234
    assert store.stats.bytes_in == 1234


async def test_list_prefixes_one_level(store: ObjectStore) -> None:
    storage = Storage(store)
    for key in ["orders/.topic", "orders/p0000/seg/1", "billing/.topic", "_registry/producers/a.json", "top"]:
        await storage.overwrite(key, b"x")
    assert await storage.list_prefixes("") == ["_registry/", "billing/", "orders/"]
    assert await storage.list_prefixes("orders/") == ["orders/p0000/"]
    await storage.delete(["billing/.topic"])
    assert await storage.list_prefixes("") == ["_registry/", "orders/"]  # no empty "directories"


async def test_list_prefixes_is_part_of_the_port_and_agrees_with_the_shared_fallback(
    store: ObjectStore,
) -> None:
    assert isinstance(store, ObjectStore)
    for key in [
        "orders/.topic",
        "orders/p0000/seg/1",
        "orders/p0001/seg/1",
        "order-x/a",
        "_registry/p/a.json",
    ]:
        await store.put(key, b"x")
    for prefix in ["", "orders/", "ord", "orders/p0000/", "missing/"]:
        assert await store.list_prefixes(prefix) == await prefixes_from_list(store, prefix), prefix
    assert await store.list_prefixes("ord") == ["order-x/", "orders/"]
    assert await FaultyStore(store).list_prefixes("orders/") == ["orders/p0000/", "orders/p0001/"]


# -- filesystem specifics ---------------------------------------------------------------------


async def test_file_store_hides_temporaries_and_rejects_bad_keys(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.put("t/a", b"1")
    (tmp_path / "t" / ".bq~tmp.deadbeef").write_bytes(b"half-written")
    assert await keys_of(store, "") == ["t/a"]
    for bad in ["", "/abs", "a//b", "a/../b", "a/./b", "t/.bq~x", "nul\x00"]:
        with pytest.raises(StorageError):
            await store.put(bad, b"x")


async def test_file_store_reports_key_directory_clash(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.put("a/b", b"object")
    with pytest.raises(StorageError, match="clashes"):
        await store.put("a/b/c", b"below an object")


async def test_file_store_prunes_empty_directories(tmp_path: Path) -> None:
    store = FileStore(tmp_path)
    await store.put("t/p0000/seg/1", b"1")
    await store.delete(["t/p0000/seg/1"])
    assert not (tmp_path / "t").exists()
    await store.put("t/p0000/seg/2", b"2")  # and writing there again works
    assert await keys_of(store, "t/") == ["t/p0000/seg/2"]


async def test_file_store_is_shared_by_two_instances(tmp_path: Path) -> None:
    one, two = FileStore(tmp_path), FileStore(tmp_path)
    etag = await one.put("k", b"1", if_none_match=True)
    with pytest.raises(AlreadyExists):
        await two.put("k", b"2", if_none_match=True)
    await two.put("k", b"3", if_match=etag)
    with pytest.raises(PreconditionFailed):
        await one.put("k", b"4", if_match=etag)
    blob = await one.get("k")
    assert blob is not None and blob.data == b"3"
