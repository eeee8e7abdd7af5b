"""Publishing as Dapr users do: raw bodies of any type, CloudEvents (binary, structured, batch),
W3C trace context carried from publish to delivery, and OpenTelemetry spans.

The sidecar runs in this process (its real API app, runtime and engine on a file bucket), so the
OpenTelemetry SDK's in-memory exporter sees its spans; what a message looks like on delivery is
read back through the API (pull, in both the JSON and the CloudEvents forms).
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from bucketq.config import Settings
from bucketq.sidecar.config import SidecarConfig, SidecarSettings
from bucketq.sidecar.process import Sidecar
from bucketq.sidecar.server import build_api_app
from bucketq.sidecar.tracecontext import Tracing
from tests.sidecar.sidecar_procs import create_topics

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
CE_BATCH = "application/cloudevents-batch+json"


class Api:
    def __init__(self, client: TestClient[Any, Any], sidecar: Sidecar) -> None:
        self.client, self.sidecar = client, sidecar

    async def post(
        self, path: str, body: bytes, content_type: str | None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        all_headers = dict(headers or {})
        if content_type is not None:
            all_headers["Content-Type"] = content_type
        async with self.client.post(
            path, data=body, headers=all_headers, skip_auto_headers=["Content-Type"]
        ) as resp:
            return resp.status, await resp.json()

    async def pull_one(self) -> dict[str, Any]:
        for _ in range(50):
            status, body = await self.post(
                "/v1/pull", b'{"max_messages": 1, "wait_seconds": 0.2}', "application/json"
            )
            assert status == 200, body
            if body["messages"]:
                (msg,) = body["messages"]
                await self.post(
                    "/v1/ack", json.dumps({"receipt": msg["receipt"]}).encode(), "application/json"
                )
                return dict(msg)
        raise AssertionError("nothing to pull")


@pytest.fixture
async def api(tmp_path: Path) -> AsyncIterator[Api]:
    engine = Settings.from_dict(
        {"backend": "file", "file_path": str(tmp_path / "bucket"), "strategy": "conditional_write"}
    )
    await create_topics(engine, "orders")
    sidecar = Sidecar(SidecarConfig(SidecarSettings(consumer="c", topics=["orders"]), engine))
    await sidecar.runtime.connect()
    try:
        async with TestClient(TestServer(build_api_app(sidecar.api, token=None))) as client:
            yield Api(client, sidecar)
    finally:
        await sidecar.runtime.close(10)


# -- raw bodies ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "content_type", "stored"),
    [
        (b"hello, world", "text/plain; charset=utf-8", {"data_b64": b"hello, world"}),
        (bytes(range(256)), "application/octet-stream", {"data_b64": bytes(range(256))}),
        (b"<order id='1'/>", "application/xml", {"data_b64": b"<order id='1'/>"}),
        (b"", "application/octet-stream", {"data_b64": b""}),
        (
            b'{"id": 1, "payload": "mine"}',
            "application/vnd.acme.order+json",
            {"payload": {"id": 1, "payload": "mine"}},
        ),
        (b"[1, 2, 3]", "text/json", {"payload": [1, 2, 3]}),
    ],
)
async def test_a_raw_body_is_published_with_its_content_type(
    api: Api, body: bytes, content_type: str, stored: dict[str, Any]
) -> None:
    status, answer = await api.post("/v1/publish/orders", body, content_type)
    assert status == 200, answer
    msg = await api.pull_one()
    assert msg["id"] == answer["id"] and msg["content_type"] == content_type
    if "payload" in stored:
        assert msg["payload"] == stored["payload"] and "data_b64" not in msg
    else:
        assert base64.b64decode(msg["data_b64"]) == stored["data_b64"]


async def test_json_stays_json_with_raw_and_the_envelope_stays_the_envelope(api: Api) -> None:
    status, _ = await api.post("/v1/publish/orders?raw=true", b'{"payload": {"a": 1}}', "application/json")
    assert status == 200
    msg = await api.pull_one()
    assert msg["payload"] == {"payload": {"a": 1}} and msg["content_type"] == "application/json"
    status, _ = await api.post("/v1/publish/orders", b'{"payload": {"a": 1}}', "application/json")
    assert status == 200
    assert (await api.pull_one())["payload"] == {"a": 1}


async def test_raw_options_come_as_query_parameters(api: Api) -> None:
    query = "key=customer-7&priority=-5&dedup_id=order-1&delay_seconds=0"
    status, first = await api.post(f"/v1/publish/orders?{query}", b"one", "text/plain")
    assert status == 200 and not first["duplicate"]
    status, again = await api.post(f"/v1/publish/orders?{query}", b"one", "text/plain")
    assert status == 200 and again["duplicate"] and again["id"] == first["id"]
    msg = await api.pull_one()
    assert (msg["key"], msg["priority"]) == ("customer-7", -5)


@pytest.mark.parametrize(
    ("path", "body", "content_type", "status", "code"),
    [
        ("/v1/publish/orders?priority=high", b"x", "text/plain", 400, "invalid_request"),
        ("/v1/publish/orders?colour=red", b"x", "text/plain", 400, "invalid_request"),
        ("/v1/publish/orders?priority=5000", b"x", "text/plain", 400, "invalid_request"),
        ("/v1/publish/orders?key=k", b'{"payload": 1}', "application/json", 400, "invalid_request"),
        ("/v1/publish/orders", b'{"id": ', "application/problem+json", 400, "malformed_json"),
        ("/v1/publish/orders", b"[" * 100 + b"]" * 100, "application/vnd.x+json", 400, "too_deep"),
        ("/v1/publish/orders", b"[" + b"1," * 200_000 + b"1]", "text/json", 413, "too_many_values"),
        ("/v1/publish/ghost", b"x", "text/plain", 404, "topic_not_found"),
        ("/v1/publish/orders/batch", b"x", "text/plain", 415, "unsupported_media_type"),
    ],
)
async def test_bad_raw_publishes_are_refused_and_publish_nothing(
    api: Api, path: str, body: bytes, content_type: str, status: int, code: str
) -> None:
    got, answer = await api.post(path, body, content_type)
    assert (got, answer["error"]) == (status, code), answer
    assert api.sidecar.metrics.published.labels("orders")._value.get() == 0


# -- CloudEvents in ---------------------------------------------------------------------------------------


async def test_binary_mode_event_keeps_its_attributes(api: Api) -> None:
    headers = {
        "ce-specversion": "1.0",
        "ce-id": "evt-1",
        "ce-source": "/shop/checkout",
        "ce-type": "com.example.order.placed",
        "ce-subject": "order%2042",
        "ce-time": "2026-01-02T03:04:05Z",
        "ce-partitionkey": "customer-7",
        "ce-tenant": "acme",
    }
    status, _ = await api.post("/v1/publish/orders", b'{"total": 12.5}', "application/json", headers)
    assert status == 200
    msg = await api.pull_one()
    assert msg["payload"] == {"total": 12.5} and msg["content_type"] == "application/json"
    assert msg["key"] == "customer-7"
    assert {k: v for k, v in msg["headers"].items() if k.startswith("ce-")} == {
        "ce-specversion": "1.0",
        "ce-id": "evt-1",
        "ce-source": "/shop/checkout",
        "ce-type": "com.example.order.placed",
        "ce-subject": "order 42",  # percent-decoded, as the HTTP binding says
        "ce-time": "2026-01-02T03:04:05Z",
        "ce-tenant": "acme",
    }


async def test_structured_mode_events_text_and_binary_data(api: Api) -> None:
    base = {"specversion": "1.0", "id": "e", "source": "/s", "type": "t"}
    text = {**base, "datacontenttype": "text/plain", "data": "hello"}
    status, _ = await api.post(
        "/v1/publish/orders", json.dumps(text).encode(), "application/cloudevents+json"
    )
    assert status == 200
    msg = await api.pull_one()
    assert base64.b64decode(msg["data_b64"]) == b"hello" and msg["content_type"] == "text/plain"
    raw = {**base, "datacontenttype": "image/png", "data_base64": base64.b64encode(b"\x89PNG").decode()}
    status, _ = await api.post("/v1/publish/orders", json.dumps(raw).encode(), "application/cloudevents+json")
    assert status == 200
    msg = await api.pull_one()
    assert base64.b64decode(msg["data_b64"]) == b"\x89PNG" and msg["content_type"] == "image/png"


@pytest.mark.parametrize(
    "event",
    [
        {"specversion": "1.0", "id": "e", "type": "t"},  # no source
        {"specversion": "0.2", "id": "e", "source": "/s", "type": "t"},
        {"specversion": "1.0", "id": "", "source": "/s", "type": "t"},
        {"specversion": "1.0", "id": "e", "source": "/s", "type": "t", "Bad-Name": "x"},
        ["not", "an", "event"],
    ],
)
async def test_invalid_events_are_refused(api: Api, event: Any) -> None:
    status, answer = await api.post(
        "/v1/publish/orders", json.dumps(event).encode(), "application/cloudevents+json"
    )
    assert (status, answer["error"]) == (400, "invalid_cloudevent"), answer
    headers = {"ce-specversion": "1.0", "ce-id": "e", "ce-type": "t"}  # binary, no ce-source
    status, answer = await api.post("/v1/publish/orders", b"{}", "application/json", headers)
    assert (status, answer["error"]) == (400, "invalid_cloudevent"), answer


async def test_a_cloudevents_batch_publishes_each_event(api: Api) -> None:
    events = [
        {"specversion": "1.0", "id": f"e{i}", "source": "/s", "type": "t", "data": {"n": i}} for i in range(3)
    ]
    status, answer = await api.post("/v1/publish/orders/batch", json.dumps(events).encode(), CE_BATCH)
    assert status == 200 and answer["failed"] == 0 and len(answer["results"]) == 3
    got = [await api.pull_one() for _ in range(3)]
    assert sorted(m["headers"]["ce-id"] for m in got) == ["e0", "e1", "e2"]


# -- CloudEvents out (pull) -----------------------------------------------------------------------------------


async def test_pull_as_cloudevents_and_ack_with_the_receipt_extension(api: Api) -> None:
    event = {
        "specversion": "1.0",
        "id": "e1",
        "source": "/shop",
        "type": "placed",
        "subject": "o-1",
        "data": {"n": 1},
    }
    await api.post("/v1/publish/orders", json.dumps(event).encode(), "application/cloudevents+json")
    status, plain = await api.post("/v1/publish/orders?key=k9", b"plain text", "text/plain")
    assert status == 200
    got: list[dict[str, Any]] = []
    for _ in range(50):
        async with api.client.post(
            "/v1/pull", json={"max_messages": 10, "wait_seconds": 0.2}, headers={"Accept": CE_BATCH}
        ) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"] == CE_BATCH
            got += await resp.json()
        if len(got) == 2:
            break
    first, second = sorted(got, key=lambda e: e["bucketqreceipt"])
    ours = next(e for e in got if e["id"] == "e1")
    assert {k: ours[k] for k in ("specversion", "source", "type", "subject", "data")} == {
        "specversion": "1.0",
        "source": "/shop",
        "type": "placed",
        "subject": "o-1",
        "data": {"n": 1},
    }
    other = next(e for e in got if e["id"] == plain["id"])
    assert other["source"] == "/bucketq/topics/orders" and other["type"] == "io.bucketq.message"
    assert (
        base64.b64decode(other["data_base64"]) == b"plain text" and other["datacontenttype"] == "text/plain"
    )
    assert other["partitionkey"] == "k9" and other["bucketqdeliveries"] == 1 and other["time"]
    for e in (first, second):
        status, answer = await api.post(
            "/v1/ack", json.dumps({"receipt": e["bucketqreceipt"]}).encode(), "application/json"
        )
        assert (status, answer["outcome"]) == (200, "acked")


# -- trace context and spans ------------------------------------------------------------------------------------


async def test_trace_context_travels_with_the_message(api: Api) -> None:
    api.sidecar.runtime.tracing = Tracing(tracer_provider=_no_sdk())
    trace = {"traceparent": PARENT, "tracestate": "vendor=abc"}
    await api.post("/v1/publish/orders", b"raw", "text/plain", trace)
    assert (await api.pull_one())["headers"] == trace
    await api.post("/v1/publish/orders", b'{"payload": 1}', "application/json", trace)
    assert (await api.pull_one())["headers"] == trace
    own = f"00-{'1' * 32}-{'2' * 16}-01"
    body = json.dumps({"payload": 1, "headers": {"traceparent": own}}).encode()
    await api.post("/v1/publish/orders", body, "application/json", trace)
    assert (await api.pull_one())["headers"] == {"traceparent": own}, "the message's own context wins"
    for bad in ("00-xyz", f"00-{'0' * 32}-00f067aa0ba902b7-01", f"ff-{TRACE_ID}-00f067aa0ba902b7-01"):
        await api.post("/v1/publish/orders", b"raw", "text/plain", {"traceparent": bad, "tracestate": "a=b"})
        assert (await api.pull_one())["headers"] == {}, bad


async def test_publish_spans_with_opentelemetry(api: Api) -> None:
    sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="the OpenTelemetry SDK is a dev dependency")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    api.sidecar.runtime.tracing = Tracing(tracer_provider=provider)
    status, _ = await api.post("/v1/publish/orders", b"raw", "text/plain", {"traceparent": PARENT})
    assert status == 200
    (span,) = exporter.get_finished_spans()
    assert span.kind == SpanKind.PRODUCER and span.name == "publish orders"
    assert span.attributes["messaging.destination.name"] == "orders"
    assert f"{span.context.trace_id:032x}" == TRACE_ID and f"{span.parent.span_id:016x}" == "00f067aa0ba902b7"
    msg = await api.pull_one()
    # the message carries the publish span's context: a consumer's span is its child
    assert msg["headers"]["traceparent"] == f"00-{TRACE_ID}-{span.context.span_id:016x}-01"


def _no_sdk() -> Any:
    from opentelemetry.trace import NoOpTracerProvider

    return NoOpTracerProvider()


def test_push_spans_continue_the_messages_trace() -> None:
    """One pushed message: a CONSUMER span, child of the message's context, whose context the push
    carries; a batch: one span linked to each message's context."""
    sdk = pytest.importorskip("opentelemetry.sdk.trace", reason="the OpenTelemetry SDK is a dev dependency")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import SpanKind

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Tracing(tracer_provider=provider)
    with tracing.deliver("orders", [{"traceparent": PARENT, "other": "x"}]) as carried:
        pass
    (span,) = exporter.get_finished_spans()
    assert span.kind == SpanKind.CONSUMER and span.name == "process orders"
    assert f"{span.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert carried == {"traceparent": f"00-{TRACE_ID}-{span.context.span_id:016x}-01"}
    exporter.clear()
    second = f"00-{'1' * 32}-{'2' * 16}-01"
    with tracing.deliver("orders", [{"traceparent": PARENT}, {"traceparent": second}, {}]):
        pass
    (span,) = exporter.get_finished_spans()
    assert span.parent is None and span.attributes["messaging.batch.message_count"] == 3
    assert sorted(f"{link.context.span_id:016x}" for link in span.links) == ["00f067aa0ba902b7", "2" * 16]
    without = Tracing(tracer_provider=_no_sdk())
    with without.deliver("orders", [{"traceparent": PARENT}]) as carried:
        assert carried == {"traceparent": PARENT}, "without an SDK the context passes through"


def test_without_opentelemetry_the_context_passes_through(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    for name in [m for m in sys.modules if m == "opentelemetry" or m.startswith("opentelemetry.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # import opentelemetry fails
    tracing = Tracing()
    assert not tracing.enabled
    with tracing.publish("orders", {"Traceparent": PARENT, "tracestate": "a=b"}) as carried:
        assert carried == {"traceparent": PARENT, "tracestate": "a=b"}
    with tracing.deliver("orders", [{"traceparent": PARENT}, {}]) as carried:
        assert carried == {}
