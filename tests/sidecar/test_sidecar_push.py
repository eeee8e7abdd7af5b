"""Push mode: the sidecar POSTs to an app (running in this test process) that answers SUCCESS/RETRY/DROP."""

from __future__ import annotations

import asyncio
import signal
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bucketq import Bucketq
from bucketq.client import DeliveredMessage, PushServer, message
from bucketq.config import Settings
from bucketq.sidecar.push import interpret
from tests.sidecar.sidecar_procs import SidecarFactory, aeventually, create_topics


def test_interpret_answers() -> None:
    ids = ["a", "b"]
    assert interpret(204, b"", ids) == {"a": "SUCCESS", "b": "SUCCESS"}
    assert interpret(200, b"not json", ids) == {"a": "SUCCESS", "b": "SUCCESS"}
    assert interpret(200, b'{"status": "drop"}', ids) == {"a": "DROP", "b": "DROP"}
    assert interpret(200, b'{"status": "bogus"}', ids) == {"a": "RETRY", "b": "RETRY"}
    assert interpret(404, b"", ids) == {"a": "DROP", "b": "DROP"}
    assert interpret(500, b'{"status": "SUCCESS"}', ids) == {"a": "RETRY", "b": "RETRY"}
    assert interpret(200, b'{"statuses": [{"id": "a", "status": "SUCCESS"}]}', ids) == {
        "a": "SUCCESS",
        "b": "RETRY",
    }
    # a reply that tries to say something and cannot be understood is a RETRY, never an ack
    assert interpret(200, b'{"status": 42}', ids) == {"a": "RETRY", "b": "RETRY"}
    assert interpret(200, b'{"status": ["RETRY"]}', ids) == {"a": "RETRY", "b": "RETRY"}
    assert interpret(200, b'["SUCCESS"]', ids) == {"a": "RETRY", "b": "RETRY"}
    assert interpret(200, b'{"statuses": "SUCCESS"}', ids) == {"a": "RETRY", "b": "RETRY"}
    assert interpret(200, b"{}", ids) == {"a": "SUCCESS", "b": "SUCCESS"}
    # per entry: one malformed entry does not decide the others
    mixed = b'{"statuses": [{"id": "a", "status": "SUCCESS"}, {"id": "b", "status": 7}, 5]}'
    assert interpret(200, mixed, ids) == {"a": "SUCCESS", "b": "RETRY"}
    twice = b'{"statuses": [{"id": "a", "status": "SUCCESS"}, {"id": "a", "status": "DROP"}]}'
    assert interpret(200, twice, ids) == {"a": "RETRY", "b": "RETRY"}


@pytest.mark.slow  # 8-14 s: started early, so it never runs alone at the end
@pytest.mark.s3
@pytest.mark.e2e
async def test_push_success_retry_drop_and_lease_extension(
    moto_settings: Settings, sidecars: SidecarFactory
) -> None:
    await create_topics(moto_settings, "mail")
    seen: dict[str, list[int]] = defaultdict(list)

    async def handle(msg: DeliveredMessage) -> str:
        kind = msg.payload["kind"]
        seen[kind].append(msg.deliveries)
        if kind == "slow":
            await asyncio.sleep(6.5)  # twice the visibility timeout: the sidecar must extend, twice
        if kind == "retry-once" and msg.deliveries == 1:
            return "RETRY"
        if kind == "boom" and msg.deliveries == 1:
            raise RuntimeError("handler crashed")  # an exception is a retry
        return "DROP" if kind == "drop" else "SUCCESS"

    async with PushServer(handle, port=0) as app:
        sc = sidecars(
            moto_settings,
            "push",
            consumer="mailer",
            topics="mail",
            delivery="push",
            app_port=app.port,
            push_concurrency=4,
            push_retry_initial_s=0.05,
            visibility_timeout_s=3.0,
        )
        async with sc.aclient() as client:
            kinds = ["ok", "ok", "ok", "retry-once", "boom", "drop", "slow"]
            ids = {k: (await client.publish("mail", {"kind": k})).id for k in kinds[2:]}
            await client.publish_batch("mail", [message({"kind": "ok"}) for _ in range(2)])

        def done() -> bool:
            counters = sc.status()["counters"]
            return bool(counters["acked"] >= 6 and counters["dead_lettered"] >= 1)

        await aeventually(done, 30, "6 acks and 1 dead letter through push")
        await asyncio.sleep(2)  # a lost lease or a stray retry would show up now
    assert sorted(seen["ok"]) == [1, 1, 1]
    assert seen["retry-once"] == [1, 2]
    assert seen["boom"] == [1, 2]
    assert seen["drop"] == [1]
    assert seen["slow"] == [1], "the lease of a slow request expired and the message was redelivered"

    async with Bucketq(moto_settings) as bq:
        dlq = await bq.register_consumer("inspect", ["mail.dlq"])
        dead = await dlq.poll(max_messages=5, wait=10)
        assert [m.id for m in dead] == [ids["drop"]]
        assert dead[0].headers["bucketq-dlq-reason"] == "dropped by the app"
        await dlq.close()


@pytest.mark.s3
@pytest.mark.e2e
async def test_batch_push_with_per_message_statuses(
    moto_settings: Settings, sidecars: SidecarFactory
) -> None:
    await create_topics(moto_settings, "bulk")
    batches: list[int] = []
    deliveries: dict[int, list[int]] = defaultdict(list)

    async def receive(request: web.Request) -> web.Response:
        body: dict[str, Any] = await request.json()
        batches.append(len(body["messages"]))
        statuses = []
        for m in body["messages"]:
            n = m["payload"]["n"]
            deliveries[n].append(m["deliveries"])
            statuses.append(
                {"id": m["id"], "status": "RETRY" if n % 5 == 0 and m["deliveries"] == 1 else "SUCCESS"}
            )
        return web.json_response({"statuses": statuses})

    app = web.Application()
    app.router.add_post("/events", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        sc = sidecars(
            moto_settings,
            "bulk",
            consumer="bulk",
            topics="bulk",
            delivery="push",
            app_port=port,
            app_path="events",
            push_batch_size=10,
            push_concurrency=2,
            push_retry_delay_s=0.05,  # the deprecated name still works (and says so in the log)
        )
        async with sc.aclient() as client:
            await client.publish_batch("bulk", [message({"n": i}) for i in range(40)])
        await aeventually(lambda: sc.status()["counters"]["acked"] >= 40, 30, "40 acks through batch push")
    finally:
        await runner.cleanup()
    assert sorted(deliveries) == list(range(40))
    assert {n: d for n, d in deliveries.items() if d != ([1, 2] if n % 5 == 0 else [1])} == {}
    assert max(batches) > 1, f"messages were not batched: {batches}"
    assert "PUSH_RETRY_DELAY_S is deprecated" in sc.log(200), sc.log()


@pytest.mark.s3
@pytest.mark.e2e
async def test_sigterm_lets_open_push_requests_finish(
    moto_settings: Settings, sidecars: SidecarFactory
) -> None:
    await create_topics(moto_settings, "slow")
    started = asyncio.Event()
    finished: list[str] = []

    async def handle(msg: DeliveredMessage) -> str:
        started.set()
        await asyncio.sleep(2.0)
        finished.append(msg.id)
        return "SUCCESS"

    async with PushServer(handle, port=0) as app:
        sc = sidecars(
            moto_settings,
            "slow",
            consumer="s",
            topics="slow",
            delivery="push",
            app_port=app.port,
            push_concurrency=1,
            drain_grace_s=20,
        )
        async with sc.aclient() as client:
            first = await client.publish("slow", {"n": 1})
            await client.publish("slow", {"n": 2})
        await asyncio.wait_for(started.wait(), 20)
        sc.signal(signal.SIGTERM)
        code = await asyncio.to_thread(sc.wait_exit, 30)
    assert code == 0, sc.log()
    assert finished == [first.id], "the open request did not finish, or a new one started while draining"

    async with Bucketq(moto_settings) as bq:
        (stats,) = await bq.stats("slow", "s")
    assert (stats.acked, stats.backlog + stats.in_flight) == (1, 1), stats


@pytest.mark.e2e
async def test_push_carries_the_app_token(tmp_path: Path, sidecars: SidecarFactory) -> None:
    """With APP_TOKEN_FILE set every push says ``Authorization: Bearer <token>``; an app that
    refuses a push (401) gets it again, so nothing is lost to a wrong token."""
    engine = Settings.from_dict(
        {"backend": "file", "file_path": str(tmp_path / "bucket"), "strategy": "conditional_write"}
    )
    await create_topics(engine, "authed")
    token_file = tmp_path / "app-token"
    token_file.write_text("s3cret\n")
    seen: list[str | None] = []

    async def receive(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        ok = request.headers.get("Authorization") == "Bearer s3cret"
        return web.json_response({"status": "SUCCESS"}, status=200 if ok else 401)

    app = web.Application()
    app.router.add_post("/bucketq", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        sc = sidecars(
            engine,
            "authed",
            BUCKETQ_FILE_PATH=str(engine.file_path),
            consumer="c",
            topics="authed",
            delivery="push",
            app_port=port,
            app_token_file=str(token_file),
        )
        async with sc.aclient() as client:
            await client.publish("authed", {"n": 1})
        await aeventually(lambda: sc.status()["counters"]["acked"] >= 1, 30, "the push to be acked")
    finally:
        await runner.cleanup()
    assert seen and all(h == "Bearer s3cret" for h in seen)
