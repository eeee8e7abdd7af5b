"""The OpenAPI 3.1 description of the localhost API, built from the pydantic models.

``python -m bucketq.sidecar.openapi > openapi/sidecar.yaml`` regenerates the checked-in file; a
test fails when the file and this module disagree.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from bucketq import api_models as m

SCHEMAS: list[type[BaseModel]] = [
    m.ErrorBody,
    m.OutgoingMessage,
    m.PublishBatchRequest,
    m.PublishResponse,
    m.PublishEntryResult,
    m.PublishBatchResponse,
    m.PullRequest,
    m.DeliveredMessage,
    m.PullResponse,
    m.AckRequest,
    m.AckBatchRequest,
    m.NackRequest,
    m.NackBatchRequest,
    m.ExtendRequest,
    m.ExtendBatchRequest,
    m.SettleResponse,
    m.SettleEntryResult,
    m.SettleBatchResponse,
    m.PushBatch,
    m.PushReply,
]

ERRORS = {
    "400": "Malformed JSON in an envelope or a JSON-typed raw body (also NaN, Infinity, integers over "
    "4300 digits, nesting deeper than 64), a missing or wrong field (types are strict: no "
    "string-to-number coercion), an invalid CloudEvent (`invalid_cloudevent`), an invalid receipt or "
    "name; nothing was applied.",
    "401": "Missing or wrong bearer token (only when a token file is configured).",
    "404": "Unknown topic.",
    "408": "The request body did not arrive within the body timeout; the connection is closed.",
    "409": "Stale receipt: not a lease this sidecar holds (expired, settled otherwise, or forged); "
    "refused without a bucket request.",
    "413": "A message, a batch, the body, its count of JSON values or the publish buffer's bytes is "
    "over its limit; nothing was published.",
    "405": "The path exists, not for this method (e.g. GET /v1/pull); the `Allow` header names the "
    "methods it takes. Answered on every path of this document for any method it does not list.",
    "415": "The body's type is not one the path takes (a publish takes any type; a batch JSON or a "
    "CloudEvents batch; `unsupported_media_type`), or it was sent with a `Content-Encoding` other "
    "than `identity` (`unsupported_content_encoding`: compressed bodies are refused unread, never "
    "inflated); nothing was applied.",
    "429": "The publish buffer is full; retry after `Retry-After` seconds.",
    "503": "Starting, draining, or the bucket did not answer in time; retry after `Retry-After`.",
}


BATCH = "application/cloudevents-batch+json"
# A CloudEvent in the JSON format (structured mode): the required attributes; data or data_base64.
CLOUD_EVENT: dict[str, Any] = {
    "type": "object",
    "description": "A CloudEvents 1.0 event (JSON format). Extensions are lower-case alphanumeric "
    "attributes; a pulled event also has bucketqreceipt, bucketqleaseuntil and bucketqdeliveries.",
    "required": ["specversion", "id", "source", "type"],
    "properties": {
        "specversion": {"const": "1.0"},
        "id": {"type": "string", "minLength": 1},
        "source": {"type": "string", "minLength": 1},
        "type": {"type": "string", "minLength": 1},
        "datacontenttype": {"type": "string"},
        "subject": {"type": "string"},
        "time": {"type": "string"},
        "data": {},
        "data_base64": {"type": "string"},
    },
}
RAW_OPTIONS: list[dict[str, Any]] = [
    {
        "name": "raw",
        "in": "query",
        "schema": {"type": "boolean"},
        "description": "With `application/json`: the body is the message's JSON payload, not the envelope.",
    },
    *(
        {
            "name": name,
            "in": "query",
            "schema": schema,
            "description": f"For a raw body or CloudEvents: the envelope's `{name}` (an envelope refuses it).",
        }
        for name, schema in (
            ("key", {"type": "string"}),
            ("dedup_id", {"type": "string", "minLength": 1}),
            ("priority", {"type": "integer", "minimum": -1000, "maximum": 1000}),
            ("delay_seconds", {"type": "number", "minimum": 0, "maximum": 366 * 86400}),
            ("not_before", {"type": "number", "minimum": 0}),
        )
    ),
]
TRACE_HEADERS: list[dict[str, Any]] = [
    {
        "name": name,
        "in": "header",
        "schema": {"type": "string"},
        "description": f"W3C Trace Context `{name}`: stored on the message, sent with its deliveries.",
    }
    for name in ("traceparent", "tracestate")
]


def _ref(name: str) -> dict[str, Any]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(name: str) -> dict[str, Any]:
    return {"application/json": {"schema": _ref(name)}}


def _op(
    summary: str, request: str | None, response: str, errors: list[str], description: str = ""
) -> dict[str, Any]:
    op: dict[str, Any] = {"summary": summary}
    if description:
        op["description"] = description
    if request is not None:
        op["requestBody"] = {"required": request != "PullRequest", "content": _json(request)}
    op["responses"] = {"200": {"description": "OK", "content": _json(response)}}
    if request is not None:  # every body is bounded in time, bytes, values and depth
        errors = sorted({*errors, "400", "408", "413", "415"})
    for code in errors:
        op["responses"][code] = {"$ref": f"#/components/responses/E{code}"}
    return {"post": op}


def build() -> dict[str, Any]:
    """The OpenAPI document as a dict."""
    _, defs = models_json_schema(
        [(s, "validation") for s in SCHEMAS], ref_template="#/components/schemas/{model}"
    )
    topic = {
        "name": "topic",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
        "description": "Topic name (DNS-1123: lower-case letters, digits, '-' and '.').",
    }
    publish = _op(
        "Publish one message",
        "OutgoingMessage",
        "PublishResponse",
        ["400", "401", "404", "413", "415", "429", "503"],
        "Answers once the message is durable in the bucket, with its id and position.",
    )
    publish["post"]["requestBody"]["content"].update(
        {
            "application/cloudevents+json": {"schema": CLOUD_EVENT},
            "*/*": {
                "schema": {"type": "string", "format": "binary"},
                "description": "Any other type: the body is the message, stored with its Content-Type "
                "(a JSON payload for a JSON type, else bytes). With `ce-specversion`, `ce-id`, "
                "`ce-source` and `ce-type` headers it is a CloudEvent in binary mode.",
            },
        }
    )
    publish["post"]["parameters"] = [dict(topic), *RAW_OPTIONS, *TRACE_HEADERS]
    batch = _op(
        "Publish a batch",
        "PublishBatchRequest",
        "PublishBatchResponse",
        ["400", "401", "404", "413", "415", "429", "503"],
        "The whole request is validated first (nothing is published if one message is invalid). "
        "Each entry then reports its own status; when every entry failed alike the response has "
        "that status (e.g. 503).",
    )
    batch["post"]["requestBody"]["content"][BATCH] = {"schema": {"type": "array", "items": CLOUD_EVENT}}
    batch["post"]["parameters"] = [dict(topic), *RAW_OPTIONS[1:], *TRACE_HEADERS]
    settle_errors = ["400", "401", "409", "415", "503"]
    batch_errors = ["400", "401", "413", "415"]
    paths: dict[str, Any] = {
        "/v1/publish/{topic}": publish,
        "/v1/publish/{topic}/batch": batch,
        "/v1/pull": _op(
            "Pull leased messages (long poll)",
            "PullRequest",
            "PullResponse",
            ["400", "401", "415", "503"],
            "Up to `max_messages`, waiting up to `wait_seconds` for the first. Each message "
            "carries an opaque `receipt`; settle it before `lease_until`. The body may be empty. "
            f"With `Accept: {BATCH}` the answer is an array of CloudEvents (the receipt is "
            "`bucketqreceipt`).",
        ),
        "/v1/ack": _op("Acknowledge a message", "AckRequest", "SettleResponse", settle_errors),
        "/v1/ack/batch": _op(
            "Acknowledge many",
            "AckBatchRequest",
            "SettleBatchResponse",
            batch_errors,
            "Each entry has its own status (409 for a stale receipt).",
        ),
        "/v1/nack": _op(
            "Give a message back, or dead-letter it", "NackRequest", "SettleResponse", settle_errors
        ),
        "/v1/nack/batch": _op("Nack many", "NackBatchRequest", "SettleBatchResponse", batch_errors),
        "/v1/extend": _op("Extend a lease", "ExtendRequest", "SettleResponse", settle_errors),
        "/v1/extend/batch": _op("Extend many", "ExtendBatchRequest", "SettleBatchResponse", batch_errors),
        "/v1/status": {
            "get": {
                "summary": "What the sidecar is doing (JSON for humans and scripts)",
                "responses": {
                    "200": {
                        "description": "OK",
                        "content": {"application/json": {"schema": {"type": "object"}}},
                    }
                },
            }
        },
        "/healthz": {
            "get": {
                "summary": "Liveness: the process serves requests",
                "responses": {"200": {"description": "alive"}},
            }
        },
        "/readyz": {
            "get": {
                "summary": "Readiness: connected, strategy chosen, bucket answering, not draining",
                "description": "Unauthenticated: answers `ready`, `state` and a generic `reason` "
                "only (connecting, shutting down, bucket not answering, a subscribed topic was "
                "deleted). The details are on the authenticated `/v1/status`.",
                "responses": {"200": {"description": "ready"}, "503": {"description": "not ready"}},
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics (names prefixed bucketq_)",
                "responses": {
                    "200": {
                        "description": "text exposition format",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
    }
    paths["/v1/pull"]["post"]["responses"]["200"]["content"][BATCH] = {
        "schema": {"type": "array", "items": CLOUD_EVENT}
    }
    responses = {
        f"E{code}": {"description": text, "content": _json("ErrorBody")} for code, text in ERRORS.items()
    }
    for code in ("429", "503"):
        responses[f"E{code}"]["headers"] = {
            "Retry-After": {"schema": {"type": "integer"}, "description": "Seconds to wait before retrying."}
        }
    responses["E405"]["headers"] = {
        "Allow": {"schema": {"type": "string"}, "description": "The methods the path takes, e.g. `POST`."}
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "bucketq sidecar localhost API",
            "version": "1",
            "description": "The HTTP/1.1 + JSON API a bucketq sidecar serves to the app next to it "
            "(default http://127.0.0.1:3580). See docs/sidecar-api.md. In push mode the "
            "sidecar POSTs `DeliveredMessage` (or `PushBatch`) to the app, which answers "
            "`PushReply`. A method a path does not list is answered 405 `method_not_allowed` "
            "(`#/components/responses/E405`) with an `Allow` header.",
        },
        "servers": [{"url": "http://127.0.0.1:3580"}],
        "security": [{}, {"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": defs["$defs"],
            "responses": responses,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "Only when BUCKETQ_SIDECAR_TOKEN_FILE is set.",
                }
            },
        },
    }


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def render() -> str:
    header = "# Generated by `python -m bucketq.sidecar.openapi`; edit bucketq/sidecar/openapi.py instead.\n"
    return header + yaml.dump(build(), Dumper=_Dumper, sort_keys=False, width=110, allow_unicode=True)


if __name__ == "__main__":
    print(render(), end="")
