"""The sidecar clients retry 429 and 503 by themselves, after the Retry-After the answer names.

Against a real aiohttp server (in its own thread, so that the blocking client can talk to it) that
answers from a script: each request takes the next scripted answer, and the server records when it
arrived and what it carried. Waits are asserted from below only (a retry never comes before the
Retry-After it was given); the upper side is the attempts and budget, counted in requests.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from bucketq.client import (
    AsyncClient,
    BadRequest,
    Busy,
    Client,
    RetryPolicy,
    Unavailable,
)
from bucketq.client.retry import Retries, parse_retry_after, retryable
from bucketq.errors import SidecarError

PUBLISHED = {
    "id": "0190c0de-0000-7000-8000-000000000001",
    "topic": "orders",
    "partition": 0,
    "seq": 1,
    "index": 0,
    "offset": 1,
    "duplicate": False,
}


@dataclass
class Answer:
    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def busy(retry_after: str | None = "0.2") -> Answer:
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    return Answer(429, {"error": "buffer_full", "message": "the publish buffer is full"}, headers)


def unavailable(code: str = "storage_unavailable", retry_after: str | None = "0.1") -> Answer:
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    return Answer(503, {"error": code, "message": f"{code}: try later"}, headers)


OK = Answer(200, PUBLISHED)


@dataclass
class Arrival:
    at: float
    path: str
    body: bytes


class ScriptedSidecar:
    """An aiohttp server answering every request with the next scripted answer (the last repeats)."""

    def __init__(self) -> None:
        self.script: list[Answer] = []
        self.arrivals: list[Arrival] = []
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None

    def answer(self, *answers: Answer) -> None:
        self.script = list(answers)
        self.arrivals.clear()

    def gaps(self) -> list[float]:
        return [b.at - a.at for a, b in zip(self.arrivals, self.arrivals[1:], strict=False)]

    async def _handle(self, request: web.Request) -> web.Response:
        self.arrivals.append(Arrival(time.monotonic(), request.path, await request.read()))
        answer = self.script.pop(0) if len(self.script) > 1 else self.script[0]
        return web.json_response(answer.body, status=answer.status, headers=answer.headers)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"

    def start(self) -> ScriptedSidecar:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedSidecar]:
    s = ScriptedSidecar().start()
    try:
        yield s
    finally:
        s.stop()


# -- the blocking client --------------------------------------------------------------------------------


def test_a_full_buffer_is_retried_after_retry_after(server: ScriptedSidecar) -> None:
    server.answer(busy("0.2"), busy("0.2"), OK)
    with Client(server.url) as client:
        result = client.publish("orders", {"n": 1}, key="k")
    assert result.id == PUBLISHED["id"]
    assert len(server.arrivals) == 3
    assert all(gap >= 0.2 for gap in server.gaps()), server.gaps()
    # the same request each time
    assert len({a.body for a in server.arrivals}) == 1
    assert json.loads(server.arrivals[0].body) == {"payload": {"n": 1}, "key": "k", "priority": 0}


def test_an_unavailable_sidecar_is_retried_for_pull_and_settle(server: ScriptedSidecar) -> None:
    with Client(server.url) as client:
        server.answer(unavailable("not_ready", "0.1"), Answer(200, {"messages": []}))
        assert client.pull(max_messages=5, wait=0) == []
        assert [a.path for a in server.arrivals] == ["/v1/pull", "/v1/pull"]
        assert server.gaps()[0] >= 0.1
        acked = {"receipt": "orders:0:1:0:tok", "outcome": "acked"}
        server.answer(unavailable("settle_timeout", "0.1"), Answer(200, acked))
        assert client.ack("orders:0:1:0:tok").outcome == "acked"
        assert len(server.arrivals) == 2


def test_without_retry_after_it_backs_off(server: ScriptedSidecar) -> None:
    server.answer(unavailable(retry_after=None), unavailable(retry_after=None), OK)
    policy = RetryPolicy(backoff_s=0.2, max_backoff_s=1.0)
    with Client(server.url, retry=policy) as client:
        client.publish("orders", 1)
    first, second = server.gaps()
    # equal jitter: at least half the backoff, which doubles
    assert first >= 0.1 and second >= 0.2, server.gaps()


def test_attempts_bound_the_retries(server: ScriptedSidecar) -> None:
    server.answer(unavailable(retry_after="0.05"))
    with Client(server.url, retry=RetryPolicy(attempts=3)) as client, pytest.raises(Unavailable) as failed:
        client.publish("orders", 1)
    assert len(server.arrivals) == 3
    assert failed.value.code == "storage_unavailable" and failed.value.retry_after == 0.05


def test_a_wait_past_the_budget_is_not_slept(server: ScriptedSidecar) -> None:
    server.answer(busy("120"))
    started = time.monotonic()
    with Client(server.url) as client, pytest.raises(Busy) as failed:
        client.publish("orders", 1)
    assert len(server.arrivals) == 1 and time.monotonic() - started < 10
    assert failed.value.retry_after == 120
    # a budget fits some waits and not the next: 0.3 + 0.3 fit in 0.7, a third does not
    server.answer(busy("0.3"))
    policy = RetryPolicy(attempts=10, budget_s=0.7, jitter=0)
    with Client(server.url, retry=policy) as client, pytest.raises(Busy):
        client.publish("orders", 1)
    assert len(server.arrivals) == 3


@pytest.mark.parametrize(
    "answer",
    [
        unavailable("draining"),  # the sidecar is shutting down: it will not serve this pod again
        Answer(400, {"error": "invalid_request", "message": "no"}),
        Answer(409, {"error": "lease_lost", "message": "stale"}),
        Answer(500, {"error": "internal", "message": "bug"}, {"Retry-After": "0.01"}),
    ],
)
def test_answers_that_do_not_say_later_are_not_retried(server: ScriptedSidecar, answer: Answer) -> None:
    server.answer(answer, OK)
    with Client(server.url) as client, pytest.raises(SidecarError) as failed:
        client.publish("orders", 1)
    assert failed.value.status == answer.status and len(server.arrivals) == 1


def test_retry_none_raises_at_once(server: ScriptedSidecar) -> None:
    server.answer(busy("0.01"), OK)
    with Client(server.url, retry=None) as client, pytest.raises(Busy):
        client.publish("orders", 1)
    assert len(server.arrivals) == 1


def test_readiness_is_asked_once(server: ScriptedSidecar) -> None:
    server.answer(unavailable("not_ready", "0.01"), Answer(200, {"status": "ready"}))
    with Client(server.url) as client:
        assert client.ready() is False
    assert len(server.arrivals) == 1


def test_an_http_date_retry_after_is_honoured(server: ScriptedSidecar) -> None:
    past = email.utils.formatdate(time.time() - 60, usegmt=True)
    server.answer(busy(past), OK)
    with Client(server.url) as client:
        client.publish("orders", 1)
    assert len(server.arrivals) == 2


# -- the asyncio client -----------------------------------------------------------------------------------


async def test_async_client_retries_the_same(server: ScriptedSidecar) -> None:
    server.answer(unavailable("publish_timeout", "0.1"), busy("0.2"), OK)
    async with AsyncClient(server.url) as client:
        result = await client.publish("orders", {"n": 1}, dedup_id="order-1")
    assert result.id == PUBLISHED["id"]
    first, second = server.gaps()
    assert first >= 0.1 and second >= 0.2
    assert len({a.body for a in server.arrivals}) == 1  # the dedup_id travels with every try
    server.answer(busy("0.01"))
    async with AsyncClient(server.url, retry=RetryPolicy(attempts=2)) as client:
        with pytest.raises(Busy):
            await client.publish_batch("orders", [{"payload": 1}])
        assert len(server.arrivals) == 2
        server.answer(unavailable("draining"))
        with pytest.raises(Unavailable):
            await client.pull()
        assert len(server.arrivals) == 1
        server.answer(unavailable("not_ready"))
        assert await client.ready() is False
        assert len(server.arrivals) == 1
    with pytest.raises(BadRequest):
        server.answer(Answer(400, {"error": "invalid_request", "message": "no"}))
        async with AsyncClient(server.url) as client:
            await client.publish("orders", 1)
    assert len(server.arrivals) == 1


# -- the policy's rules ---------------------------------------------------------------------------------


def test_policy_rules() -> None:
    assert retryable(SidecarError(429, "buffer_full", ""))
    assert retryable(SidecarError(503, "timeout", ""))
    assert not retryable(SidecarError(503, "draining", ""))
    assert not retryable(SidecarError(0, "connection_failed", ""))
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)
    with pytest.raises(ValueError, match="budget_s"):
        RetryPolicy(budget_s=-1)
    tries: Retries = RetryPolicy(jitter=0.1).begin()
    wait = tries.wait_after(SidecarError(429, "buffer_full", "", retry_after=2.0))
    assert wait is not None and 2.0 <= wait <= 2.2
    assert parse_retry_after("1") == 1.0 and parse_retry_after("0.25") == 0.25
    assert parse_retry_after("-3") == 0.0 and parse_retry_after("soon") is None
    assert parse_retry_after(None) is None
    now = 1_700_000_000.0
    assert parse_retry_after(email.utils.formatdate(now + 30, usegmt=True), now=now) == 30.0
