"""Stores opened in one process share botocore's loaded data: one aioboto3 session per thread and
credentials. A fresh session costs ~0.1 CPU-second (botocore loads its data files), which every
Spark split, CLI command and sidecar store paid before; sharing must not share anything unsafe:
never a session across threads, never a client across event loops."""

from __future__ import annotations

import asyncio
import threading

import pytest

from bucketq.storage.s3 import S3Store, _session_for
from tests.support.servers import S3Server


def test_one_session_per_thread_and_credentials() -> None:
    here = _session_for("key", "secret", "us-east-1")
    assert _session_for("key", "secret", "us-east-1") is here
    assert _session_for("other", "secret", "us-east-1") is not here
    assert _session_for("key", "secret", "eu-west-1") is not here
    elsewhere: list[object] = []
    thread = threading.Thread(target=lambda: elsewhere.append(_session_for("key", "secret", "us-east-1")))
    thread.start()
    thread.join()
    assert elsewhere and elsewhere[0] is not here


async def _round_trip(store: S3Store, key: str) -> bytes | None:
    await store.put(key, b"x" + key.encode())
    blob = await store.get(key)
    await store.close()
    return None if blob is None else blob.data


@pytest.mark.s3
def test_stores_sharing_a_session_work_in_successive_loops_and_threads(moto_server: S3Server) -> None:
    settings = moto_server.settings()
    # two event loops in this thread, one after the other (a Spark split runs each in its own)
    for n in range(2):
        assert asyncio.run(_round_trip(S3Store.from_settings(settings), f"loop{n}")) == f"xloop{n}".encode()
    # stores in threads at once, each with its own session
    results: dict[int, bytes | None] = {}

    def in_thread(n: int) -> None:
        results[n] = asyncio.run(_round_trip(S3Store.from_settings(settings), f"thread{n}"))

    threads = [threading.Thread(target=in_thread, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {n: f"xthread{n}".encode() for n in range(3)}
