"""W3C trace context from publisher to subscriber, and OpenTelemetry spans when it is installed.

A publish request's ``traceparent`` (and ``tracestate``) header is stored on each message as the
message headers of the same names (a header the message sets itself wins), so it travels with the
message through the bucket: a pull returns it among the message's headers, a push sends it as the
request's ``traceparent``/``tracestate`` headers. An invalid ``traceparent`` is dropped (the W3C
rule: start a new trace rather than propagate garbage), and so is a ``tracestate`` without one.

With ``opentelemetry-api`` importable (the ``otel`` extra) the sidecar also makes spans through the
global tracer provider: a PRODUCER span per publish request, child of the request's context, whose
context is what the messages carry; a CONSUMER span per push, child of the message's context (or
linked to each message's context for a batch), whose context the push request carries. Without a
configured SDK (``opentelemetry-instrument``, or an app that sets a tracer provider) the API's
spans record nothing and the contexts pass through unchanged.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
MAX_TRACESTATE_CHARS = 512  # W3C: at least this much must be propagated; more may be cut
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[^\s]*)?$")


def valid_traceparent(value: str) -> bool:
    """A ``traceparent`` W3C Trace Context accepts (version 00 exactly; later versions may extend)."""
    match = _TRACEPARENT.match(value)
    if match is None:
        return False
    version, trace_id, parent_id, _, rest = match.groups()
    if version == "ff" or trace_id == "0" * 32 or parent_id == "0" * 16:
        return False
    return not (version == "00" and rest)


def trace_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The trace context of a request's (or message's) headers, validated; empty when none."""
    lowered = {k.lower(): v for k, v in headers.items() if k.lower() in (TRACEPARENT, TRACESTATE)}
    parent = lowered.get(TRACEPARENT, "").strip()
    if not valid_traceparent(parent):
        return {}
    out = {TRACEPARENT: parent}
    state = lowered.get(TRACESTATE, "").strip()
    if state and len(state) <= MAX_TRACESTATE_CHARS:
        out[TRACESTATE] = state
    return out


def with_trace(message_headers: Mapping[str, str], context: Mapping[str, str]) -> dict[str, str]:
    """``message_headers`` plus ``context``, unless the message carries a trace context of its own."""
    out = dict(message_headers)
    if context and not trace_headers(out):
        out.pop(TRACESTATE, None)
        out.update(context)
    return out


class Tracing:
    """Spans of publishes and pushes through OpenTelemetry when it is importable, else pass-through."""

    def __init__(self, tracer_provider: Any = None) -> None:
        try:
            from opentelemetry import trace
            from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
        except ImportError:
            self._trace: Any = None
            return
        self._trace = trace
        self._propagator = TraceContextTextMapPropagator()
        self._tracer = trace.get_tracer("bucketq.sidecar", tracer_provider=tracer_provider)

    @property
    def enabled(self) -> bool:
        return self._trace is not None

    @contextlib.contextmanager
    def publish(self, topic: str, request_headers: Mapping[str, str]) -> Iterator[dict[str, str]]:
        """Around one publish request: yields the trace context its messages carry."""
        context = trace_headers(request_headers)
        if self._trace is None:
            yield context
            return
        parent = self._propagator.extract(context)
        with self._tracer.start_as_current_span(
            f"publish {topic}",
            context=parent,
            kind=self._trace.SpanKind.PRODUCER,
            attributes=_attributes(topic, "publish"),
        ):
            carried: dict[str, str] = {}
            self._propagator.inject(carried)
            yield trace_headers(carried) or context

    @contextlib.contextmanager
    def deliver(self, topic: str, messages: Sequence[Mapping[str, str]]) -> Iterator[dict[str, str]]:
        """Around one push of messages (their headers): yields the trace context the request carries."""
        contexts = [trace_headers(h) for h in messages]
        single = contexts[0] if len(contexts) == 1 else {}
        if self._trace is None:
            yield single
            return
        parent = self._propagator.extract(single)
        links = []
        if len(contexts) > 1:
            for c in contexts:
                span_context = self._trace.get_current_span(self._propagator.extract(c)).get_span_context()
                if span_context.is_valid:
                    links.append(self._trace.Link(span_context))
        with self._tracer.start_as_current_span(
            f"process {topic}",
            context=parent,
            kind=self._trace.SpanKind.CONSUMER,
            links=links,
            attributes={**_attributes(topic, "process"), "messaging.batch.message_count": len(contexts)},
        ):
            carried: dict[str, str] = {}
            self._propagator.inject(carried)
            yield trace_headers(carried) or single


def _attributes(topic: str, operation: str) -> dict[str, Any]:
    # OpenTelemetry's messaging semantic conventions
    return {
        "messaging.system": "bucketq",
        "messaging.destination.name": topic,
        "messaging.operation.type": operation,
    }
