"""Bad input gets a 4xx JSON error naming the problem, and changes nothing."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bucketq.client import (
    BadRequest,
    Busy,
    Client,
    DeliveredMessage,
    LeaseLost,
    PublishBatchResponse,
    TooLarge,
    TopicNotFound,
    Unauthorized,
    message,
)
from bucketq.config import Settings
from tests.sidecar.sidecar_procs import SidecarFactory, SidecarProc, create_topics, eventually
from tests.support.servers import S3Server
from tests.support.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.s3, pytest.mark.e2e]


def raw(
    sc: SidecarProc,
    path: str,
    body: bytes | None,
    content_type: str = "application/json",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any], dict[str, str]]:
    """POST raw bytes; returns (status, JSON body, headers)."""
    req = urllib.request.Request(
        sc.url + path, data=body, method="POST", headers={"Content-Type": content_type, **(headers or {})}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


def pull_n(sc: SidecarProc, n: int, timeout: float = 20) -> list[DeliveredMessage]:
    got: list[DeliveredMessage] = []
    deadline = time.monotonic() + timeout
    with sc.client() as client:
        while len(got) < n:
            assert time.monotonic() < deadline, f"pulled {len(got)} of {n} within {timeout:g}s"
            got += client.pull(max_messages=n - len(got), wait=1)
    return got


async def test_bad_requests_are_4xx_and_change_nothing(
    moto_settings: Settings, sidecars: SidecarFactory
) -> None:
    await create_topics(moto_settings, "small", max_message_bytes=1024)
    sc = sidecars(
        moto_settings, "errors", consumer="c", topics="small", max_body_bytes=65536, visibility_timeout_s=1.5
    )

    cases = [
        ("/v1/publish/small", b'{"payload": ', "application/json", 400, "malformed_json"),
        ("/v1/publish/small", b"[1, 2]", "application/json", 400, "invalid_request"),
        ("/v1/publish/small", b'{"key": "k"}', "application/json", 400, "invalid_request"),
        ("/v1/publish/small", b'{"payload": 1, "colour": "red"}', "application/json", 400, "invalid_request"),
        ("/v1/publish/small", b'{"data_b64": "@@@"}', "application/json", 400, "invalid_request"),
        (
            "/v1/publish/small",
            b'{"payload": 1, "priority": "high"}',
            "application/json",
            400,
            "invalid_request",
        ),
        # a publish takes any type (a raw body); the other endpoints JSON only
        ("/v1/pull", b'{"max_messages": 1}', "text/plain", 415, "unsupported_media_type"),
        ("/v1/publish/small/batch", b'{"messages": []}', "text/plain", 415, "unsupported_media_type"),
        ("/v1/publish/Not_A_Topic", b'{"payload": 1}', "application/json", 400, "invalid_name"),
        ("/v1/publish/ghost", b'{"payload": 1}', "application/json", 404, "topic_not_found"),
        (
            "/v1/publish/small",
            json.dumps({"payload": "x" * 2000}).encode(),
            "application/json",
            413,
            "message_too_large",
        ),
        (
            "/v1/publish/small",
            json.dumps({"payload": "x" * 100_000}).encode(),
            "application/json",
            413,
            "body_too_large",
        ),
        ("/v1/publish/small/batch", b'{"messages": []}', "application/json", 400, "invalid_request"),
        (
            "/v1/publish/small/batch",
            json.dumps({"messages": [{"payload": 1}, {"payload": "x" * 2000}]}).encode(),
            "application/json",
            413,
            "message_too_large",
        ),
        (
            # within the limit as a record without a producer id, over it as the record stored (the
            # producer's id adds 34 bytes): checked as stored, so the batch is refused whole
            "/v1/publish/small/batch",
            json.dumps({"messages": [{"payload": 1}, {"payload": "x" * 795}]}).encode(),
            "application/json",
            413,
            "message_too_large",
        ),
        ("/v1/pull", b'{"max_messages": 0}', "application/json", 400, "invalid_request"),
        ("/v1/pull", b'{"max_messages": 100000}', "application/json", 400, "invalid_request"),
        ("/v1/ack", b"{}", "application/json", 400, "invalid_request"),
        ("/v1/ack", b'{"receipt": "garbage"}', "application/json", 400, "invalid_receipt"),
        ("/v1/ack", b'{"receipt": "other:0:0:0:abc"}', "application/json", 400, "invalid_receipt"),
        (
            "/v1/extend",
            b'{"receipt": "small:0:0:0:abc", "seconds": -1}',
            "application/json",
            400,
            "invalid_request",
        ),
        ("/v1/nothing", b"{}", "application/json", 404, "not_found"),
    ]
    for path, body, ctype, status, code in cases:
        got_status, got_body, _ = raw(sc, path, body, ctype)
        assert (got_status, got_body.get("error")) == (status, code), (path, body[:60], got_body)
        assert got_body["message"], got_body

    with sc.client() as client:
        with pytest.raises(TopicNotFound):
            client.publish("ghost", 1)
        with pytest.raises(TooLarge):
            client.publish("small", "x" * 2000)
        with pytest.raises(BadRequest):
            client.ack("garbage")
        # nothing above was published: the only message is this one
        ok = client.publish("small", {"fine": True})
        (msg,) = pull_n(sc, 1)
        assert msg.id == ok.id
        assert client.pull(max_messages=10, wait=0.5) == []

        # 409: a receipt that was settled differently, and one whose lease expired and moved on
        client.ack(msg.receipt or "")
        client.ack(msg.receipt or "")  # the same settlement again is fine
        with pytest.raises(LeaseLost) as stale:
            client.nack(msg.receipt or "")
        assert stale.value.status == 409 and "lease" in stale.value.message

        client.publish("small", {"n": 2})
        (first,) = pull_n(sc, 1)
        (second,) = pull_n(sc, 1, timeout=30)  # not settled: redelivered after the lease expired
        assert (second.id, second.deliveries) == (first.id, 2)
        with pytest.raises(LeaseLost):
            client.ack(first.receipt or "")
        batch = client.ack_batch([first.receipt or "", second.receipt or ""])
        assert [(r.status, r.error) for r in batch.results] == [(409, "lease_lost"), (200, None)]
        assert batch.failed == 1


async def test_full_publish_buffer_answers_429(moto_server: S3Server, sidecars: SidecarFactory) -> None:
    """Five publishes wait in a buffer of five (the bucket is cut off, so their segment cannot be
    written: a buffer drained by a fast write would make this a race); a sixth is refused with
    429 at once, and all five land once the bucket answers again."""
    target = urlsplit(moto_server.endpoint_url)
    with TcpProxy(target.hostname or "127.0.0.1", target.port or 80) as proxy:
        settings = moto_server.settings(s3_endpoint_url=proxy.url)
        await create_topics(settings, "busy")
        sc = sidecars(settings, "busy", publish_buffer_size=5)
        with sc.client() as client:
            client.publish("busy", "warm-up")  # the topic's configuration is cached from here on
        results: list[PublishBatchResponse] = []

        def fill() -> None:
            with sc.client() as client:
                results.append(client.publish_batch("busy", [message(i) for i in range(5)]))

        proxy.down()
        filler = threading.Thread(target=fill)
        filler.start()
        try:
            eventually(lambda: sc.status()["publish_pending"] == 5, 10, "5 publishes pending in the buffer")
            status, body, headers = raw(sc, "/v1/publish/busy", b'{"payload": "one too many"}')
            assert (status, body["error"]) == (429, "buffer_full"), body
            assert headers.get("Retry-After") == "1"
            with sc.client() as client, pytest.raises(Busy) as busy:
                client.publish("busy", "again")
            assert busy.value.retry_after == 1.0
            status, body, _ = raw(
                sc,
                "/v1/publish/busy/batch",
                json.dumps({"messages": [{"payload": i} for i in range(6)]}).encode(),
            )
            assert (status, body["error"]) == (413, "batch_too_large"), body
        finally:
            proxy.up()
            filler.join(timeout=30)
        assert results and results[0].failed == 0, results
        with sc.client() as client:  # the buffer drained: publishing works again
            client.publish("busy", "after")


async def test_client_retries_a_full_buffer_until_it_drains(
    moto_server: S3Server, sidecars: SidecarFactory
) -> None:
    """A real sidecar's 429: the client (default retry policy) waits its Retry-After and tries
    again, and the publish lands once the bucket answers and the buffer drains."""
    target = urlsplit(moto_server.endpoint_url)
    with TcpProxy(target.hostname or "127.0.0.1", target.port or 80) as proxy:
        settings = moto_server.settings(s3_endpoint_url=proxy.url)
        await create_topics(settings, "retried")
        sc = sidecars(settings, "retried", publish_buffer_size=1)
        with sc.client() as client:
            client.publish("retried", "warm-up")
        proxy.down()
        done: list[Any] = []

        def publish(client: Client, payload: str) -> None:
            with client:
                done.append(client.publish("retried", payload))

        threads = [threading.Thread(target=publish, args=(sc.client(), "fills the buffer"))]
        threads[0].start()
        try:
            eventually(lambda: sc.status()["publish_pending"] == 1, 10, "the buffer to be full")
            # Client(...) as an app makes it: the default retry policy
            threads.append(threading.Thread(target=publish, args=(Client(sc.url), "retried")))
            threads[1].start()

            def refused() -> bool:
                with urllib.request.urlopen(sc.metrics_url, timeout=5) as resp:
                    families = text_string_to_metric_families(resp.read().decode())
                return any(
                    s.name == "bucketq_publish_errors_total"
                    and s.labels["error"] == "buffer_full"
                    and s.value >= 1
                    for f in families
                    for s in f.samples
                )

            eventually(refused, 10, "the second publish to be refused with 429")
        finally:
            proxy.up()
            for t in threads:
                t.join(timeout=30)
        assert len(done) == 2, "a publish did not land"
        assert {r.topic for r in done} == {"retried"}


async def test_bearer_token(moto_settings: Settings, sidecars: SidecarFactory, tmp_path: Path) -> None:
    await create_topics(moto_settings, "secure")
    token_file = tmp_path / "token"
    token_file.write_text("s3cr3t\n")
    sc = sidecars(moto_settings, "secure", token_file=str(token_file))
    with sc.client() as client, pytest.raises(Unauthorized):
        client.publish("secure", 1)
    with sc.client(token="wrong") as client, pytest.raises(Unauthorized):
        client.publish("secure", 1)
    with sc.client(token="s3cr3t") as client:
        assert client.publish("secure", 1).topic == "secure"
        assert client.ready()  # probes stay open
    with urllib.request.urlopen(sc.url + "/readyz", timeout=5) as resp:
        assert resp.status == 200


@pytest.mark.slow  # 8-14 s: started early, so it never runs alone at the end
async def test_topic_deleted_while_publishing_is_never_acknowledged(
    moto_settings: Settings, sidecars: SidecarFactory
) -> None:
    """Deleting a topic fences the sidecar's publishes (no 200 once the purge began, nothing left
    but the floor tombstones) and tells its consumers (pull 404, /readyz 503)."""
    from bucketq import Bucketq
    from bucketq.core.keys import Keys

    await create_topics(moto_settings, "doomed")
    sc = sidecars(moto_settings, "deleted", consumer="c", topics="doomed")
    stop = threading.Event()
    acknowledged_at: list[float] = []

    def publish_loop() -> None:
        with sc.client() as client:
            while not stop.is_set():
                try:
                    client.publish("doomed", {"n": len(acknowledged_at)})
                except TopicNotFound:
                    pass
                else:
                    acknowledged_at.append(time.monotonic())
                time.sleep(0.02)

    publisher = threading.Thread(target=publish_loop)
    publisher.start()
    try:
        eventually(lambda: len(acknowledged_at) > 5 or None, 20, "publishes before the deletion")
        async with Bucketq(moto_settings) as admin:
            await admin.delete_topic("doomed")  # marks it deleting, waits out the fence, purges
            purged_at = time.monotonic()
            time.sleep(2.0)  # keep publishing after the purge
            stop.set()
            publisher.join()
            keys = Keys(moto_settings.root)
            left = [i.key async for i in admin.storage.list(keys.topic_prefix("doomed"))]
        assert all(t < purged_at for t in acknowledged_at), "a publish was acknowledged after the purge"
        assert left and all(k.endswith("/floor.json") for k in left), left
        with sc.client() as client, pytest.raises(TopicNotFound):
            eventually(
                lambda: client.pull(max_messages=1, wait=0.2) and None, 30, "pull to report the deletion"
            )
        status, body, _ = raw_get(sc, "/readyz")
        assert status == 503 and "deleted" in body["reason"]
    finally:
        stop.set()
        publisher.join()


def raw_get(sc: SidecarProc, path: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    try:
        with urllib.request.urlopen(sc.url + path, timeout=10) as resp:
            return resp.status, json.loads(resp.read()), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)
