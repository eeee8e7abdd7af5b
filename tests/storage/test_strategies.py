"""Put-if-absent strategies, the auto probe, fault injection and S3 failure modes."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import socket
import time
from collections import Counter
from pathlib import Path

import pytest

from bucketq.config import CsprngSettings, Settings
from bucketq.errors import (
    AlreadyExists,
    Contended,
    NotSupported,
    PreconditionFailed,
    StorageError,
    StorageTimeout,
)
from bucketq.storage import FileStore, MemoryStore, ObjectStore, Storage, open_storage
from bucketq.storage.faults import FaultyStore
from bucketq.storage.s3 import S3Store
from bucketq.storage.strategies import CLAIM_SUFFIX, build_store, probe_strategy
from tests.support.servers import FlakyProxy, S3Server, free_ports

FAST = CsprngSettings(verify_retries=2, jitter_min_ms=1, jitter_max_ms=5, claim_timeout_s=30.0)

# Failure paths must end in bounded time: far below botocore's own retry budget (~30 s) and a
# hang, far above the scheduling noise of a loaded CI machine.
HANG_BOUND_S = 10.0


def memory_settings(**extra: object) -> Settings:
    return Settings.from_dict({"backend": "memory", **extra})


async def race(storage: Storage, key: str, writers: int) -> tuple[list[int], Counter[str]]:
    """``writers`` concurrent creators of ``key``; returns the winners and the losers' errors."""

    async def one(i: int) -> int | None:
        try:
            await storage.create(key, f"writer-{i}".encode())
        except (AlreadyExists, Contended) as exc:
            errors[type(exc).__name__] += 1
            return None
        return i

    errors: Counter[str] = Counter()
    results = await asyncio.gather(*(one(i) for i in range(writers)))
    return [i for i in results if i is not None], errors


async def assert_one_winner(storage: Storage, key: str, writers: int) -> None:
    winners, errors = await race(storage, key, writers)
    assert len(winners) == 1, (winners, errors)
    assert sum(errors.values()) == writers - 1
    blob = await storage.get(key)
    assert blob is not None and blob.data == f"writer-{winners[0]}".encode()
    assert await storage.head(key + CLAIM_SUFFIX) is None  # the winner cleaned up its claim


# -- the auto probe ---------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["memory", "file"])
async def test_auto_probe_chooses_conditional_write_locally(
    backend: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bucketq.storage")
    settings = Settings.from_dict({"backend": backend, "file_path": str(tmp_path), "strategy": "auto"})
    async with await open_storage(settings) as storage:
        assert storage.strategy == "conditional_write"
        assert [i.key async for i in storage.list("")] == []  # the probe object is gone
    assert "storage strategy: conditional_write (probe got 412)" in caplog.messages


@pytest.mark.s3
@pytest.mark.parametrize("server_name", ["moto", "seaweedfs"])
async def test_auto_probe_chooses_conditional_write_on_s3_servers(
    server_name: str, request: pytest.FixtureRequest, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="bucketq.storage")
    server: S3Server = request.getfixturevalue(f"{server_name}_server")
    async with await open_storage(server.settings(strategy="auto")) as storage:
        assert storage.strategy == "conditional_write"
        assert [i.key async for i in storage.list("_probe/")] == []
        assert storage.stats.requests["PUT"] == 2
    assert "storage strategy: conditional_write (probe got 412)" in caplog.messages


async def test_s3_backend_fixture_gives_fresh_buckets(s3_backend: Settings) -> None:
    async with await open_storage(s3_backend) as storage:
        assert storage.strategy == "conditional_write"
        assert [i async for i in storage.list("")] == []
        await storage.create("a", b"1")
        assert (await storage.get("a")) is not None


async def test_probe_lives_under_the_root_prefix() -> None:
    store = FaultyStore(MemoryStore())
    watch = store.add(op="*", match="ns/x/_probe/*.probe", kind="latency", times=None)
    storage = await open_storage(memory_settings(strategy="auto"), store=store, root="/ns/x/")
    assert storage.strategy == "conditional_write"
    assert watch.fired == 3  # PUT, PUT (412), DELETE
    assert store.inner.keys() == []  # type: ignore[attr-defined]


async def test_probe_falls_back_to_csprng_when_if_none_match_is_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="bucketq.storage")
    store = MemoryStore(honour_conditions=False)
    storage = await open_storage(memory_settings(strategy="auto"), store=store)
    assert storage.strategy == "csprng_verify"
    assert store.keys() == []
    assert "storage strategy: csprng_verify (store ignored If-None-Match)" in caplog.messages


async def test_probe_falls_back_to_csprng_when_conditions_are_rejected() -> None:
    class RejectsConditions(MemoryStore):
        async def put(
            self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None
        ) -> str:
            if if_none_match or if_match is not None:
                raise NotSupported("501 NotImplemented: If-None-Match")
            return await super().put(key, data)

    assert await probe_strategy(RejectsConditions()) == "csprng_verify"


async def test_probe_does_not_downgrade_on_a_transient_error() -> None:
    store = FaultyStore(MemoryStore())
    store.add(op="PUT", match="_probe/*", kind="error")
    with pytest.raises(StorageError, match="503"):
        await open_storage(memory_settings(strategy="auto"), store=store)


async def test_configured_strategy_skips_the_probe(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="bucketq.storage")
    storage = await open_storage(memory_settings(strategy="csprng_verify"))
    assert storage.strategy == "csprng_verify"
    assert storage.stats.total == 0
    assert "storage strategy: csprng_verify (configured)" in caplog.messages


# -- racing creators --------------------------------------------------------------------------


async def test_csprng_verify_has_one_winner_among_racing_creators() -> None:
    storage = Storage(MemoryStore(honour_conditions=False), "csprng_verify", csprng=FAST)
    for trial in range(20):
        await assert_one_winner(storage, f"t/log/{trial:016d}.json", writers=8)


async def test_csprng_verify_on_the_file_store(tmp_path: Path) -> None:
    # FileStore honours conditions natively, but the emulation must work on it too.
    storage = Storage(FileStore(tmp_path, fsync=False), "csprng_verify", csprng=FAST)
    for trial in range(5):
        await assert_one_winner(storage, f"t/seg/{trial:016d}.jsonl", writers=4)


async def test_conditional_write_has_one_winner_on_the_file_store(file_storage: Storage) -> None:
    for trial in range(20):
        await assert_one_winner(file_storage, f"t/log/{trial:016d}.json", writers=8)


async def test_conditional_write_has_one_winner_on_memory(memory_storage: Storage) -> None:
    for trial in range(20):
        await assert_one_winner(memory_storage, f"t/log/{trial:016d}.json", writers=8)


@pytest.mark.s3
async def test_conditional_write_race_on_moto(moto_server: S3Server) -> None:
    async with await open_storage(moto_server.settings(strategy="conditional_write")) as storage:
        for trial in range(3):
            await assert_one_winner(storage, f"t/log/{trial:016d}.json", writers=8)


@pytest.mark.s3
async def test_races_on_seaweedfs(seaweedfs_server: S3Server) -> None:
    # A losing conditional writer may wait seconds on SeaweedFS: keep these races tiny.
    async with await open_storage(seaweedfs_server.settings(strategy="conditional_write")) as storage:
        await assert_one_winner(storage, "t/log/0000000000000001.json", writers=2)
    settings = seaweedfs_server.settings(strategy="csprng_verify", csprng=FAST.model_dump())
    async with await open_storage(settings) as storage:
        assert storage.strategy == "csprng_verify"
        for trial in range(2):
            await assert_one_winner(storage, f"t/seg/{trial:016d}.jsonl", writers=2)


async def test_csprng_verify_refuses_existing_keys_and_live_claims() -> None:
    store = MemoryStore(honour_conditions=False)
    storage = Storage(store, "csprng_verify", csprng=FAST)
    etag = await storage.create("k", b"v1")
    assert (await storage.get("k")) is not None
    with pytest.raises(AlreadyExists):
        await storage.create("k", b"v2")
    assert (await store.get("k")).data == b"v1"  # type: ignore[union-attr]
    await store.put("other" + CLAIM_SUFFIX, b"someone else's nonce")
    with pytest.raises(Contended):
        await storage.create("other", b"x")
    assert await store.head("other") is None
    assert etag
    assert [i.key async for i in storage.list("")] == ["k"]  # claims are never listed


async def test_csprng_verify_clears_an_abandoned_claim() -> None:
    store = MemoryStore(honour_conditions=False)
    settings = CsprngSettings(verify_retries=1, jitter_min_ms=1, jitter_max_ms=2, claim_timeout_s=0.2)
    storage = Storage(store, "csprng_verify", csprng=settings)
    await store.put("k" + CLAIM_SUFFIX, b"a writer that died")
    with pytest.raises(Contended):
        await storage.create("k", b"mine")  # still young
    await asyncio.sleep(0.25)
    await storage.create("k", b"mine")
    assert storage.cleared_claims == 1
    assert store.keys() == ["k"]


async def test_csprng_verify_loses_when_its_claim_is_replaced() -> None:
    store = MemoryStore(honour_conditions=False)
    storage = Storage(store, "csprng_verify", csprng=FAST)

    async def thief() -> None:
        # Overwrite our claim as soon as it appears, before our first verification.
        while await store.head("k" + CLAIM_SUFFIX) is None:
            await asyncio.sleep(0)
        await store.put("k" + CLAIM_SUFFIX, b"a faster writer")

    task = asyncio.create_task(thief())
    with pytest.raises(Contended, match="replaced"):
        await storage.create("k", b"mine")
    await task
    assert await store.head("k") is None


# -- several processes on one directory -------------------------------------------------------


def _file_racer(
    root: str, writer: int, keys: int, start: multiprocessing.synchronize.Event, out: object
) -> None:
    async def main() -> list[int]:
        store = FileStore(root)
        won = []
        for n in range(keys):
            try:
                await store.put(f"t/log/{n:016d}.json", f"writer-{writer}".encode(), if_none_match=True)
                won.append(n)
            except AlreadyExists:
                pass
        return won

    start.wait()
    out.put((writer, asyncio.run(main())))  # type: ignore[attr-defined]


@pytest.mark.e2e  # real processes
def test_file_store_put_if_absent_across_processes(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    writers, keys = 4, 60
    procs = [
        ctx.Process(target=_file_racer, args=(str(tmp_path), w, keys, start, out)) for w in range(writers)
    ]
    for p in procs:
        p.start()
    start.set()
    results = dict(out.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    winners: dict[int, list[int]] = {}
    for writer, won in results.items():
        for n in won:
            winners.setdefault(n, []).append(writer)
    assert sorted(winners) == list(range(keys))
    assert all(len(w) == 1 for w in winners.values()), winners
    for n, (writer,) in winners.items():
        assert (tmp_path / "t" / "log" / f"{n:016d}.json").read_bytes() == f"writer-{writer}".encode()
    assert [p.name for p in (tmp_path / "t" / "log").iterdir() if p.name.startswith(".bq~")] == []


# -- fault injection --------------------------------------------------------------------------


async def test_fault_error_and_timeout_do_not_reach_the_store() -> None:
    store = FaultyStore(MemoryStore())
    store.add(op="PUT", match="*/log/*", kind="error")
    with pytest.raises(StorageError, match="injected"):
        await store.put("t/log/1", b"x")
    await store.put("t/log/1", b"x")  # times=1: the next one goes through
    store.add(op="GET", kind="timeout", latency_s=0.05)
    started = time.monotonic()
    with pytest.raises(StorageTimeout) as timed_out:
        await store.get("t/log/1")
    assert time.monotonic() - started >= 0.05
    assert isinstance(timed_out.value, TimeoutError)
    assert store.injected == Counter({"error": 1, "timeout": 1})
    assert store.stats.snapshot() == {"PUT": 1}  # shared with the inner store


async def test_fault_precondition_and_drop_after_write() -> None:
    store = FaultyStore(MemoryStore())
    store.add(op="PUT", match="a", kind="precondition")
    with pytest.raises(AlreadyExists):
        await store.put("a", b"x", if_none_match=True)
    assert await store.head("a") is None  # nothing was written
    etag = await store.put("a", b"x", if_none_match=True)
    store.add(op="PUT", match="a", kind="precondition")
    with pytest.raises(PreconditionFailed) as failed:
        await store.put("a", b"y", if_match=etag)
    assert not isinstance(failed.value, AlreadyExists)

    store.add(op="PUT", match="b", kind="drop_after_write")
    with pytest.raises(StorageError, match="response was lost"):
        await store.put("b", b"landed", if_none_match=True)
    blob = await store.get("b")
    assert blob is not None and blob.data == b"landed"

    store.add(op="DELETE", kind="drop_after_write")
    with pytest.raises(StorageError):
        await store.delete(["a", "b"])
    assert await store.head("a") is None and await store.head("b") is None


async def test_fault_held_response_writes_first_and_answers_late() -> None:
    store = FaultyStore(MemoryStore())
    with pytest.raises(ValueError, match="only applies to PUT"):
        store.add(op="GET", kind="held_response")
    store.add(op="PUT", match="seg/*", kind="held_response", latency_s=0.2)
    putting = asyncio.create_task(store.put("seg/1", b"landed", if_none_match=True))
    await asyncio.sleep(0.05)
    blob = await store.get("seg/1")
    assert blob is not None and blob.data == b"landed", "the write took effect before the answer"
    assert not putting.done()
    assert await putting == blob.etag
    assert store.injected == Counter({"held_response": 1})


async def test_fault_latency_glob_times_probability_and_clear() -> None:
    store = FaultyStore(MemoryStore(), seed=7)
    slow = store.add(op="HEAD", match="slow/*", kind="latency", latency_s=0.05, times=2)
    await store.head("fast/1")
    assert slow.fired == 0 and store.injected["latency"] == 0  # the glob did not match
    for _ in range(3):
        await store.head("slow/1")
    assert slow.fired == 2

    flaky = store.add(op="GET", kind="error", times=None, probability=0.5)
    failures = 0
    for _ in range(200):
        try:
            await store.get("x")
        except StorageError:
            failures += 1
    assert 60 < failures < 140 and flaky.fired == failures

    store.add(op="LIST", match="t/*", kind="error")
    with pytest.raises(StorageError):
        [i async for i in store.list("t/")]
    store.add(op="*", kind="error", times=None)
    store.clear()
    await store.put("ok", b"1")
    assert store.total_injected == 2 + failures + 1

    with pytest.raises(ValueError):
        store.add(op="GET", kind="precondition")
    with pytest.raises(ValueError):
        store.add(op="GET", kind="drop_after_write")
    with pytest.raises(ValueError):
        store.add(op="POST", kind="error")  # type: ignore[arg-type]


async def test_storage_over_a_faulty_store_surfaces_errors() -> None:
    store = FaultyStore(MemoryStore())
    storage = Storage(store)
    store.add(op="PUT", match="*", kind="drop_after_write")
    with pytest.raises(StorageError):
        await storage.create("seg/1", b"data")
    # The write landed: a retry sees 412, which may be our own write; reading back tells.
    with pytest.raises(AlreadyExists):
        await storage.create("seg/1", b"data")
    assert (await storage.get("seg/1")).data == b"data"  # type: ignore[union-attr]


# -- S3 failure modes -------------------------------------------------------------------------


def closed_port() -> int:
    (port,) = free_ports(1)
    return port


async def test_unreachable_endpoint_fails_fast_with_a_clear_error() -> None:
    port = closed_port()
    settings = Settings.from_dict(
        {
            "backend": "s3",
            "s3_endpoint_url": f"http://127.0.0.1:{port}",
            "s3_bucket": "orders",
            "s3_access_key_id": "k",
            "s3_secret_access_key": "s",
        }
    )
    started = time.monotonic()
    with pytest.raises(StorageError) as failed:
        await open_storage(settings)
    assert time.monotonic() - started < HANG_BOUND_S
    assert f"127.0.0.1:{port}" in str(failed.value) and "orders" in str(failed.value)
    assert "cannot reach" in str(failed.value)

    store = build_store(settings)
    started = time.monotonic()
    with pytest.raises(StorageError, match="cannot reach"):
        await store.get("t/.topic")
    # a refused connection fails at once; the bound only leaves room for a loaded CI machine
    assert time.monotonic() - started < HANG_BOUND_S
    await store.close()


@pytest.mark.slow  # waits on wall-clock time: not in make test-fast
async def test_silent_endpoint_times_out_instead_of_hanging() -> None:
    with socket.socket() as silent:  # accepts connections (kernel backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        store = S3Store(
            "orders",
            endpoint_url=f"http://127.0.0.1:{port}",
            access_key_id="k",
            secret_access_key="s",
            read_timeout_s=0.3,
            max_attempts=2,
            op_timeout_s=2.0,
        )
        started = time.monotonic()
        with pytest.raises(StorageError) as failed:
            await store.head("t/.topic")
        elapsed = time.monotonic() - started
        await store.close()
    # the 2 s operation deadline ends it; without it a silent endpoint would hold the call far longer
    assert elapsed < HANG_BOUND_S
    assert "timed out" in str(failed.value) or "no answer" in str(failed.value)


@pytest.mark.s3
@pytest.mark.parametrize("server_name", ["moto", "seaweedfs"])
async def test_missing_bucket_is_named(server_name: str, request: pytest.FixtureRequest) -> None:
    server: S3Server = request.getfixturevalue(f"{server_name}_server")
    settings = server.settings().model_copy(update={"s3_bucket": "bq-no-such-bucket"})
    with pytest.raises(
        StorageError, match=r"bucket 'bq-no-such-bucket' does not exist at http://127\.0\.0\.1"
    ):
        await open_storage(settings)
    store = S3Store.from_settings(settings)
    with pytest.raises(StorageError, match="does not exist"):
        await store.get("k")
    with pytest.raises(StorageError, match="does not exist"):
        await store.put("k", b"x", if_none_match=True)
    await store.close()


@pytest.mark.s3
async def test_wrong_credentials_are_access_denied(seaweedfs_server: S3Server) -> None:
    settings = seaweedfs_server.settings(s3_secret_access_key="not-the-secret")
    with pytest.raises(StorageError, match=r"access denied.*check s3_access_key_id"):
        await open_storage(settings)


@pytest.mark.s3
async def test_s3_retries_slowdown_and_counts_every_request(moto_server: S3Server) -> None:
    proxy = FlakyProxy(moto_server.endpoint_url)
    url = await proxy.start()
    try:
        settings = moto_server.settings(s3_endpoint_url=url, s3_max_attempts=3)
        store = S3Store.from_settings(settings)
        proxy.fail("PUT", 2, "slowdown")
        etag = await store.put("t/seg/1", b"data", if_none_match=True)
        assert etag
        assert store.stats.requests["PUT"] == 3  # botocore retried twice
        assert (await store.get("t/seg/1")).data == b"data"  # type: ignore[union-attr]

        proxy.fail("GET", None, "slowdown")
        store2 = S3Store.from_settings(settings.model_copy(update={"s3_max_attempts": 2}))
        store2.retry_attempts = 2
        started = time.monotonic()
        with pytest.raises(StorageError, match="503 SlowDown"):
            await store2.get("t/seg/1")
        assert time.monotonic() - started < HANG_BOUND_S
        assert store2.stats.requests["GET"] == 4  # 2 of ours x 2 of botocore's
        await store.close()
        await store2.close()
    finally:
        await proxy.stop()


@pytest.mark.s3
async def test_lost_put_response_comes_back_as_412_on_retry(moto_server: S3Server) -> None:
    """botocore retries a PUT whose response was lost; the retry meets our own write."""
    proxy = FlakyProxy(moto_server.endpoint_url)
    url = await proxy.start()
    try:
        store = S3Store.from_settings(moto_server.settings(s3_endpoint_url=url))
        await store.head("warm-up")  # the endpoint has answered: connection errors are retried now
        proxy.fail("PUT", 1, "drop")
        with pytest.raises(AlreadyExists):
            await store.put("t/seg/1", b"mine", if_none_match=True)
        assert proxy.seen["PUT"] == 2
        assert (await store.get("t/seg/1")).data == b"mine"  # type: ignore[union-attr]
        await store.close()
    finally:
        await proxy.stop()


@pytest.mark.s3
async def test_injected_5xx_on_s3_surfaces_as_storage_error(moto_server: S3Server) -> None:
    inner = S3Store.from_settings(moto_server.settings())
    store = FaultyStore(inner)
    storage = await open_storage(moto_server.settings(strategy="conditional_write"), store=store)
    store.add(op="PUT", match="t/seg/*", kind="error")
    with pytest.raises(StorageError, match="503"):
        await storage.create("t/seg/1", b"x")
    assert await storage.head("t/seg/1") is None
    await storage.create("t/seg/1", b"x")
    assert inner.stats is storage.stats
    await storage.close()


@pytest.mark.s3
def test_s3_store_pickles_without_its_client(moto_server: S3Server) -> None:
    import pickle

    store = S3Store.from_settings(moto_server.settings())

    async def use(s: S3Store) -> bytes | None:
        await s.put("k", b"v")
        blob = await s.get("k")
        await s.close()
        return blob.data if blob else None

    assert asyncio.run(use(store)) == b"v"
    clone = pickle.loads(pickle.dumps(store))
    assert clone._client is None
    assert asyncio.run(use(clone)) == b"v"


def test_build_store_picks_the_adapter(tmp_path: Path) -> None:
    assert isinstance(build_store(memory_settings()), MemoryStore)
    assert isinstance(
        build_store(Settings.from_dict({"backend": "file", "file_path": str(tmp_path)})), FileStore
    )
    s3 = build_store(Settings.from_dict({"backend": "s3", "s3_bucket": "b", "s3_endpoint_url": "http://x:1"}))
    assert isinstance(s3, S3Store) and s3.bucket == "b"
    store: ObjectStore = s3
    assert store.stats.total == 0
