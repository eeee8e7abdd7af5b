"""Push in the app's format (the API's JSON, CloudEvents structured or binary), with the message's
trace context on the request: a real sidecar process pushing to a real aiohttp app."""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from bucketq.config import Settings
from tests.sidecar.sidecar_procs import SidecarFactory, SidecarProc, aeventually, create_topics

pytestmark = [pytest.mark.e2e]

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@asynccontextmanager
async def app(received: list[tuple[dict[str, str], bytes]]) -> AsyncIterator[int]:
    async def receive(request: web.Request) -> web.Response:
        received.append(({k.lower(): v for k, v in request.headers.items()}, await request.read()))
        return web.json_response({"status": "SUCCESS"})

    application = web.Application()
    application.router.add_post("/bucketq", receive)
    runner = web.AppRunner(application)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


def publish(sc: SidecarProc, body: bytes, content_type: str, **headers: str) -> None:
    request = urllib.request.Request(
        sc.url + "/v1/publish/orders?key=k1",
        data=body,
        method="POST",
        headers={"Content-Type": content_type, **headers},
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200


@asynccontextmanager
async def pushing_sidecar(
    tmp_path: Path,
    sidecars: SidecarFactory,
    push_format: str,
    received: list[tuple[dict[str, str], bytes]],
    **config: Any,
) -> AsyncIterator[SidecarProc]:
    """A sidecar pushing topic ``orders`` in ``push_format`` to an app recording into ``received``."""
    engine = Settings.from_dict(
        {"backend": "file", "file_path": str(tmp_path / "bucket"), "strategy": "conditional_write"}
    )
    await create_topics(engine, "orders")
    async with app(received) as port:
        yield sidecars(
            engine,
            push_format,
            BUCKETQ_FILE_PATH=str(engine.file_path),
            consumer="c",
            topics="orders",
            delivery="push",
            app_port=port,
            push_format=push_format,
            **config,
        )


async def pushed(tmp_path: Path, sidecars: SidecarFactory, push_format: str, count: int = 2) -> list[Any]:
    """Two messages (a raw text and a binary-mode CloudEvent) pushed in ``push_format``."""
    received: list[tuple[dict[str, str], bytes]] = []
    async with pushing_sidecar(tmp_path, sidecars, push_format, received) as sc:
        publish(sc, b"hello", "text/plain", traceparent=PARENT, tracestate="v=1")
        publish(
            sc,
            b'{"total": 3}',
            "application/json",
            **{"ce-specversion": "1.0", "ce-id": "evt-9", "ce-source": "/shop", "ce-type": "placed"},
        )
        await aeventually(lambda: len(received) >= count, 30, f"{count} pushes")
    return sorted(received, key=lambda r: r[0].get("bucketq-id", ""))


async def test_json_push_carries_the_trace_context(tmp_path: Path, sidecars: SidecarFactory) -> None:
    received = await pushed(tmp_path, sidecars, "json")
    traced = [h for h, _ in received if "traceparent" in h]
    (headers,) = traced
    assert (headers["traceparent"], headers["tracestate"]) == (PARENT, "v=1")
    bodies = [json.loads(b) for _, b in received]
    assert {b["content_type"] for b in bodies} == {"text/plain", "application/json"}
    text = next(b for b in bodies if b["content_type"] == "text/plain")
    assert base64.b64decode(text["data_b64"]) == b"hello" and text["headers"]["traceparent"] == PARENT


async def test_structured_cloudevents_push(tmp_path: Path, sidecars: SidecarFactory) -> None:
    received = await pushed(tmp_path, sidecars, "cloudevents-structured")
    assert all(h["content-type"] == "application/cloudevents+json" for h, _ in received)
    events = {e["type"]: e for e in (json.loads(b) for _, b in received)}
    placed = events["placed"]
    assert (placed["id"], placed["source"], placed["data"], placed["partitionkey"]) == (
        "evt-9",
        "/shop",
        {"total": 3},
        "k1",
    )
    plain = events["io.bucketq.message"]
    assert base64.b64decode(plain["data_base64"]) == b"hello" and plain["traceparent"] == PARENT
    assert plain["bucketqdeliveries"] == 1 and "bucketqreceipt" not in plain


async def test_binary_cloudevents_push(tmp_path: Path, sidecars: SidecarFactory) -> None:
    received = await pushed(tmp_path, sidecars, "cloudevents-binary")
    by_type = {h["ce-type"]: (h, b) for h, b in received}
    headers, body = by_type["placed"]
    assert (headers["ce-id"], headers["ce-source"], headers["ce-specversion"]) == ("evt-9", "/shop", "1.0")
    assert headers["content-type"] == "application/json" and json.loads(body) == {"total": 3}
    headers, body = by_type["io.bucketq.message"]
    assert body == b"hello" and headers["content-type"] == "text/plain"
    assert headers["traceparent"] == PARENT and headers["ce-partitionkey"] == "k1"


def test_binary_mode_pushes_one_message_at_a_time() -> None:
    from bucketq.errors import ConfigError
    from bucketq.sidecar.config import load_config

    with pytest.raises(ConfigError, match="push_batch_size must be 1"):
        load_config(
            overrides={
                "consumer": "c",
                "topics": ["orders"],
                "delivery": "push",
                "app_port": 8080,
                "push_format": "cloudevents-binary",
                "push_batch_size": 10,
            }
        )


@pytest.mark.parametrize(
    ("push_format", "content_type"),
    [("json", "application/json"), ("cloudevents-structured", "application/cloudevents-batch+json")],
)
async def test_a_batched_subscription_gets_the_batch_shape_for_a_lone_message(
    tmp_path: Path, sidecars: SidecarFactory, push_format: str, content_type: str
) -> None:
    """An app set up for batches (PUSH_BATCH_SIZE > 1) must not get a single message's shape
    when a poll happens to find one: the shape would then depend on timing (it did, and an app
    reading ``body["messages"]`` failed every such push until its retries ran out)."""
    received: list[tuple[dict[str, str], bytes]] = []
    async with pushing_sidecar(tmp_path, sidecars, push_format, received, push_batch_size=10) as sc:
        publish(sc, b"one", "text/plain")
        await aeventually(lambda: len(received) >= 1, 30, "one push")
    ((headers, body),) = received
    assert headers["content-type"].split(";")[0] == content_type
    batch = json.loads(body)
    messages = batch["messages"] if push_format == "json" else batch
    assert isinstance(messages, list) and len(messages) == 1
