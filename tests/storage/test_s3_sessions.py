"""Stores opened in one process share botocore's loaded data: one aioboto3 session per thread and
credentials. A fresh session costs ~0.1 CPU-second (botocore loads its data files), which every
Spark split, CLI command and sidecar store paid before; sharing must not share anything unsafe:
never a session across threads, never a client across event loops."""

from __future__ import annotations

import asyncio
import threading

import pytest

from bucketq.storage.s3 import S3Store, _session_for, certificate_verification
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


@pytest.mark.parametrize(
    ("endpoint", "proxies", "verify"),
    [
        (None, {}, None),  # AWS itself: always verified
        ("https://s3.example.com", {}, None),
        ("HTTPS://minio.example.com:9000", {}, None),
        ("http://seaweedfs.storage:8333", {}, False),  # no TLS at all: nothing to verify
        ("HTTP://127.0.0.1:9000", {}, False),
        # a proxy may be reached over TLS: its certificate is checked as before
        ("http://seaweedfs.storage:8333", {"HTTP_PROXY": "https://proxy.example.com:3128"}, None),
        ("http://seaweedfs.storage:8333", {"ALL_PROXY": "http://proxy.example.com:3128"}, None),
        ("http://seaweedfs.storage:8333", {"HTTPS_PROXY": "https://proxy.example.com:3128"}, False),
    ],
)
def test_certificates_are_verified_wherever_tls_can_happen(
    monkeypatch: pytest.MonkeyPatch, endpoint: str | None, proxies: dict[str, str], verify: bool | None
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name, value in proxies.items():
        monkeypatch.setenv(name, value)
    assert certificate_verification(endpoint) is verify


@pytest.mark.s3
def test_a_plain_http_store_loads_no_certificates_and_works(
    moto_server: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("HTTP_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    store = S3Store.from_settings(moto_server.settings())

    async def main() -> tuple[object, bytes | None]:
        await store.put("plain", b"http")
        client = await store._ensure_client()
        verify = client._endpoint.http_session._verify
        blob = await store.get("plain")
        await store.close()
        return verify, None if blob is None else blob.data

    assert moto_server.settings().s3_endpoint_url.startswith("http://")
    assert asyncio.run(main()) == (False, b"http")
