"""The mutating admission webhook: kopf's server, and the handler that injects the sidecar."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import kopf

from bucketq.config import Settings
from bucketq.operator.api_reads import ApiReadError, read_namespaced
from bucketq.operator.certs import self_signed
from bucketq.operator.config import OperatorSettings
from bucketq.operator.injection import (
    CONSUMER_LABEL,
    INJECT_LABEL,
    TOPICS,
    InjectionError,
    annotations_of,
    consumer_name,
    plan,
    wants_injection,
)
from bucketq.operator.models import GROUP, VERSION, ConsumerSpec

log = logging.getLogger("bucketq.operator")


class NamespacedWebhookServer(kopf.WebhookServer):
    """kopf's webhook server, with the object's namespace filled in from the AdmissionReview.

    The apiserver may send a pod under creation without ``metadata.namespace`` (the namespace
    is in ``request.namespace``); the handler needs it to find the pod's Consumer.
    """

    async def __call__(self, fn: Any) -> AsyncIterator[Any]:
        async def with_namespace(request: dict[str, Any], **kwargs: Any) -> Any:
            review = request.get("request") or {}
            obj, namespace = review.get("object"), review.get("namespace")
            if isinstance(obj, dict) and namespace:
                meta = obj.setdefault("metadata", {})
                if not meta.get("namespace"):
                    meta["namespace"] = namespace
            return await fn(request, **kwargs)

        wrapped: Any = with_namespace
        async for client_config in super().__call__(wrapped):
            yield client_config


def webhook_server(settings: OperatorSettings) -> kopf.WebhookServer:
    """The webhook server: plain HTTP (tests), a mounted certificate, or a generated self-signed one."""
    addr, port, host = settings.webhook_addr, settings.webhook_port, settings.webhook_host
    if settings.webhook_insecure:
        return NamespacedWebhookServer(addr=addr, port=port, host=host, insecure=True)
    certfile, keyfile = settings.webhook_cert_file, settings.webhook_key_file
    if certfile is None or keyfile is None:
        hosts = [settings.webhook_host or "localhost", "localhost", "127.0.0.1"]
        if settings.webhook_addr not in ("0.0.0.0", "::", ""):
            hosts.append(settings.webhook_addr)
        cert, key = self_signed(hosts, Path(tempfile.mkdtemp(prefix="bucketq-webhook-")))
        certfile, keyfile = str(cert), str(key)
    return NamespacedWebhookServer(
        addr=addr, port=port, host=host, certfile=certfile, pkeyfile=keyfile, cafile=settings.webhook_ca_file
    )


# The webhook's handlers: one per objectSelector (a label selector cannot say "this label OR that
# one"). Their selectors are disjoint, so a pod is sent to one of them at most. kopf serves each
# at /{id} and, when it manages the configuration, names the webhook "{id}.bucketq.io".
CONSUMER_HANDLER = "inject-consumer"
INJECT_HANDLER = "inject-sidecar"
SELECTORS: dict[str, dict[str, Any]] = {
    # a pod labelled with its Consumer
    CONSUMER_HANDLER: {CONSUMER_LABEL: kopf.PRESENT},
    # a pod labelled bucketq.io/inject: "true" and no Consumer label (publish-only, or the Consumer
    # named by annotation)
    INJECT_HANDLER: {INJECT_LABEL: "true", CONSUMER_LABEL: kopf.ABSENT},
}
_POLL_S = 0.05
# The API server's answer to a Consumer read, once the index has waited: bounded so that the
# webhook answers well inside an admission review's deadline (10 s by default).
API_READ_TIMEOUT_S = 2.0
# What the webhook reads besides its index: the chart's roles grant exactly this (tests/ship).
DIRECT_READS = frozenset({(GROUP, "consumers", "get")})

ReadConsumer = Callable[[str, str], Awaitable[dict[str, Any] | None]]


async def read_consumer(namespace: str, name: str) -> dict[str, Any] | None:
    """The Consumer from the API server (None: there is none; raises ApiReadError)."""
    return await read_namespaced(GROUP, VERSION, "consumers", namespace, name, timeout_s=API_READ_TIMEOUT_S)


class SidecarInjector:
    """The sidecar-injecting mutating handler (pods on CREATE)."""

    def __init__(
        self, engine: Settings, settings: OperatorSettings, *, read: ReadConsumer = read_consumer
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.read = read

    async def mutate(
        self,
        body: Mapping[str, Any],
        patch: kopf.Patch,
        warnings: list[str],
        consumer_index: Mapping[Any, Any],
        **_: Any,
    ) -> None:
        """Inject the sidecar into a pod that asks for it (once).

        A pod that already has a ``bucketq-sidecar`` is planned too: ``plan`` admits it unchanged
        only if that container is exactly the one the webhook injects, so that nobody can bring a
        sidecar of their own (another namespace's root, other credentials) past the webhook.
        """
        namespace = (body.get("metadata") or {}).get("namespace") or "default"
        try:
            if not wants_injection(body):
                return
            name = consumer_name(body)
            spec = await self._consumer(consumer_index, namespace, name, warnings)
            injection = plan(body, spec, engine=self.engine, settings=self.settings)
        except InjectionError as exc:
            raise kopf.AdmissionError(f"bucketq sidecar injection: {exc}", code=400) from None
        if name is not None and spec is None and TOPICS not in annotations_of(body):
            warnings.append(f"bucketq: no topics known for consumer {name!r}: the sidecar runs publish-only")
        for key, value in injection.spec.items():
            patch.spec[key] = value
        for key, value in injection.labels.items():
            patch.metadata.labels[key] = value
        for key, value in injection.annotations.items():
            patch.metadata.annotations[key] = value
        warnings.extend(injection.warnings)

    async def _consumer(
        self, index: Mapping[Any, Any], namespace: str, name: str | None, warnings: list[str]
    ) -> ConsumerSpec | None:
        if name is None:
            return None
        raw = await self._lookup(index, namespace, name)
        if raw is not None:
            try:
                return ConsumerSpec.model_validate(raw)
            except ValueError as exc:
                raise InjectionError(f"Consumer {name!r} has an invalid spec: {exc}") from None
        message = (
            f"Consumer {name!r} does not exist in namespace {namespace!r} (label or annotation "
            f"bucketq.io/consumer): create it first (kubectl apply -f consumer.yaml) or fix the name"
        )
        if self.settings.missing_consumer == "reject":
            raise InjectionError(message)
        warnings.append(f"bucketq: {message}; the pod is admitted anyway")
        return None

    async def _lookup(self, index: Mapping[Any, Any], namespace: str, name: str) -> dict[str, Any] | None:
        """The Consumer's spec: from the watch-fed index, then from the API server itself.

        The index trails the API server: a Consumer applied in the same ``kubectl apply`` as its
        Deployment, or any Consumer in a namespace a replica has only just started to watch,
        arrives moments after the first pod. Waiting (bounded, well inside the webhook's timeout)
        turns that race into a short delay; a read from the API server then settles it, so a pod
        is refused only when the API server too has no such Consumer. When that read fails the
        index's answer stands (logged): the webhook never admits a pod on a guess.
        """
        deadline = asyncio.get_running_loop().time() + self.settings.webhook_consumer_wait_s
        while True:
            for raw in index.get((namespace, name)) or ():
                return dict(raw)
            if asyncio.get_running_loop().time() >= deadline:
                break
            await asyncio.sleep(_POLL_S)
        try:
            body = await self.read(namespace, name)
        except ApiReadError as exc:
            log.warning(
                "Consumer %s/%s: not in the index, and the API server not asked: %s", namespace, name, exc
            )
            return None
        if body is None:
            return None
        log.info(
            "Consumer %s/%s read from the API server: the watch has not delivered it yet", namespace, name
        )
        spec = body.get("spec")
        return dict(spec) if isinstance(spec, Mapping) else {}
