"""S3 outage: publishes answer 503 after the timeout instead of hanging, and service recovers."""

from __future__ import annotations

import time
import urllib.error
import urllib.request

import pytest

from bucketq.client import Unavailable
from tests.sidecar.sidecar_procs import SidecarFactory, create_topics, eventually
from tests.support.servers import S3Server
from tests.support.tcp_proxy import TcpProxy

pytestmark = [pytest.mark.s3, pytest.mark.e2e]


def _http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.slow  # 8-14 s: started early, so it never runs alone at the end
async def test_s3_outage_503_then_recovery(moto_server: S3Server, sidecars: SidecarFactory) -> None:
    with TcpProxy.to(moto_server.endpoint_url) as proxy:
        settings = moto_server.settings(s3_endpoint_url=proxy.url, s3_max_attempts=1)
        await create_topics(settings, "outage")
        sc = sidecars(
            settings,
            "outage",
            consumer="c",
            topics="outage",
            publish_timeout_s=2,
            settle_timeout_s=2,
            s3_stall_s=2,
        )
        with sc.client() as client:
            before = client.publish("outage", {"n": 1})
            (held,) = eventually(lambda: client.pull(max_messages=1, wait=1), 20, "the first message")
            assert held.id == before.id

            proxy.down()
            started = time.monotonic()
            with pytest.raises(Unavailable) as failed:
                client.publish("outage", {"n": 2})
            assert failed.value.code in {"publish_timeout", "timeout", "storage_unavailable"}, failed.value
            assert failed.value.retry_after == 1.0
            assert time.monotonic() - started < 20, "a publish during the outage hung"
            eventually(lambda: _http_status(sc.url + "/readyz") == 503, 30, "/readyz to report the outage")
            assert _http_status(sc.url + "/healthz") == 200
            with pytest.raises(Unavailable):
                client.ack(held.receipt or "")  # queued; confirmed only when the bucket answers

            proxy.up()
            eventually(lambda: _http_status(sc.url + "/readyz") == 200, 30, "/readyz to recover")
            client.ack(held.receipt or "")  # the queued ack went through (same receipt: idempotent)
            after = eventually(lambda: _try_publish(client), 30, "publishing to work again")

            seen: set[str] = set()
            deadline = time.monotonic() + 20
            while after not in seen:
                assert time.monotonic() < deadline, "the message published after the outage was not delivered"
                msgs = client.pull(max_messages=10, wait=1)
                seen |= {m.id for m in msgs}
                if msgs:
                    client.ack_batch([m.receipt or "" for m in msgs])
            assert before.id not in seen, "the message acked across the outage was redelivered"


def _try_publish(client: object) -> str | None:
    from bucketq.client import Client

    assert isinstance(client, Client)
    try:
        return client.publish("outage", {"n": 3}).id
    except Unavailable:
        return None
