"""The kopf handlers: Topic, Consumer and DeadLetterPolicy reconciliation, timers, and the webhook.

Everything is registered on an explicit :class:`kopf.OperatorRegistry` by :meth:`Operator.register`,
so that several operators (tests, restarts) can live in one process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

import kopf
from aiohttp import web
from pydantic import ValidationError

from bucketq.config import Settings
from bucketq.core.keys import validate_name
from bucketq.errors import BucketqError, InvalidName, StorageError
from bucketq.operator.buckets import Buckets
from bucketq.operator.config import OperatorSettings
from bucketq.operator.consumers import (
    MissingTopics,
    apply_consumer,
    consumer_figures,
    delete_consumer,
    unsubscribe,
)
from bucketq.operator.metrics import GC_KINDS, QueueMetrics
from bucketq.operator.models import (
    GROUP,
    VERSION,
    ConsumerSpec,
    CrdModel,
    DeadLetterPolicySpec,
    DeletionPolicy,
    Phase,
    TopicSpec,
)
from bucketq.operator.outcome import InvalidSpec, Reconciler, Waiting
from bucketq.operator.status import DEAD_LETTER_POLICY, Cond, now_iso
from bucketq.operator.store_checks import StoreCheckRun
from bucketq.operator.topics import apply_topic, current_config, delete_topic, topic_config, topic_figures
from bucketq.operator.webhook import SELECTORS, SidecarInjector

log = logging.getLogger("bucketq.operator")

M = TypeVar("M", bound=CrdModel)
DEPRECATED_POLICY = (
    "spec.deadLetterPolicy of a Consumer is deprecated and ignored (removed in the next API version): "
    "dead-letter settings belong to each Topic's spec.deadLetterPolicy; remove the field"
)
Index = Mapping[Any, Any]


def _fn(handler: Callable[..., Any]) -> Any:
    """A handler as kopf takes it (kopf's protocols list every keyword; ours take what they use)."""
    return handler


async def _until_stopped(
    stopped: Any, work: Coroutine[Any, Any, None], stopping: Callable[[], bool] = lambda: False
) -> None:
    """Run a timer's work, cancelled as soon as kopf stops the timer (so that shutdown is prompt).

    A timer still running when the operator's clean-up closed the storage connections fails on a
    closed connection: once ``stopping()``, that failure ends the timer quietly (it is shutdown,
    not a fault, and kopf would end the operator with it). The work's own task swallows it, so
    the failure is quiet also when it comes after the timer was cancelled (a step that finishes
    despite the cancellation, then meets the closed connection): kopf awaits the tasks still
    running at its exit and would raise it from there."""

    async def quiet_at_shutdown() -> None:
        try:
            await work
        except BucketqError as exc:
            if not stopping():
                raise
            log.debug("a timer ended at shutdown: %s", exc)

    task = asyncio.ensure_future(quiet_at_shutdown())
    waiter = asyncio.ensure_future(stopped.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for pending in (task, waiter):
            if not pending.done():
                pending.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pending
    if task.done() and not task.cancelled():
        task.result()


def _parse(model: type[M], spec: Mapping[str, Any], kind: str) -> M:
    try:
        return model.model_validate(dict(spec))
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise InvalidSpec(f"invalid {kind} spec: {problems}") from None


def _name(name: str, what: str) -> None:
    try:
        validate_name(name, what)
    except InvalidName as exc:
        raise InvalidSpec(str(exc)) from None


def _lookup(index: Index, namespace: str, name: str) -> dict[str, Any] | None:
    store = index.get((namespace, name))
    for value in store or ():
        return dict(value)
    return None


class Operator:
    """The bucketq operator: state (connections, metrics) plus every kopf handler as a method."""

    def __init__(self, engine: Settings, settings: OperatorSettings | None = None) -> None:
        self.engine = engine
        self.settings = settings or OperatorSettings()
        self.buckets = Buckets(engine)
        self.metrics = QueueMetrics()
        self.reconciler = Reconciler(
            self.buckets, self.metrics, self.settings.retry_min_s, self.settings.retry_max_s
        )
        self.injector = SidecarInjector(engine, self.settings)
        self.store_checks = StoreCheckRun(engine, self.buckets.redact)
        self._metrics_runner: web.AppRunner | None = None

    # -- registration ----------------------------------------------------------------------------

    def register(self, registry: kopf.OperatorRegistry) -> kopf.OperatorRegistry:
        """Register every handler of this operator on ``registry`` (webhook-only: the injector alone)."""
        if self.settings.webhook_only:
            # The injector reads Consumers from this index only; nothing else is watched or written.
            kopf.index(GROUP, VERSION, "consumers", id="consumer_index", registry=registry)(
                _fn(self.index_spec)
            )
        else:
            self._register_reconcilers(registry)
        if self.settings.webhook:
            self._register_webhook(registry)
        return registry

    def _register_reconcilers(self, reg: kopf.OperatorRegistry) -> None:
        s = self.settings
        kopf.on.startup(id="startup", registry=reg)(_fn(self.startup))
        kopf.on.cleanup(id="cleanup", registry=reg)(_fn(self.cleanup))
        for plural, index_id in (
            ("topics", "topic_index"),
            ("consumers", "consumer_index"),
            ("deadletterpolicies", "dlp_index"),
        ):
            kopf.index(GROUP, VERSION, plural, id=index_id, registry=reg)(_fn(self.index_spec))
        for plural, reconcile, finalize in (
            ("topics", self.reconcile_topic, self.finalize_topic),
            ("consumers", self.reconcile_consumer, self.finalize_consumer),
            ("deadletterpolicies", self.reconcile_policy, None),
        ):
            for on in (kopf.on.create, kopf.on.update, kopf.on.resume):
                on(GROUP, VERSION, plural, id="reconcile", registry=reg)(_fn(reconcile))
            kopf.timer(GROUP, VERSION, plural, id="refresh", interval=s.status_interval_s, registry=reg)(
                _fn(self.refresh)
            )
            if finalize is not None:
                kopf.on.delete(GROUP, VERSION, plural, id="finalize", registry=reg)(_fn(finalize))
        kopf.timer(GROUP, VERSION, "topics", id="gc", interval=s.gc_interval_s, registry=reg)(
            _fn(self.collect_garbage)
        )
        self.register_scaling_watch(reg)

    def register_scaling_watch(self, reg: kopf.OperatorRegistry) -> None:
        """Follow every Consumer's ``status.scaling`` (a watch only: no writes, no finalizer), so
        that the scaling endpoint answers from the last persisted figures until this operator's
        own refresh has them (after a start; all along on a standby replica)."""
        kopf.on.event(GROUP, VERSION, "consumers", id="scaling_watch", registry=reg)(_fn(self.follow_scaling))

    def follow_scaling(
        self, type: str | None, namespace: str, name: str, body: Mapping[str, Any], **_: Any
    ) -> None:
        if type == "DELETED":
            self.metrics.forget_scaling(namespace, name)
            return
        self.metrics.remember_scaling(namespace, name, (body.get("status") or {}).get("scaling"))

    def _register_webhook(self, reg: kopf.OperatorRegistry) -> None:
        """The injector, once per objectSelector (webhook.SELECTORS), with one failure policy.

        ``persistent``: when kopf manages the configuration it keeps these webhooks while the
        operator is down, so that with failurePolicy Fail a pod asking for a sidecar waits for the
        webhook instead of starting without one.
        """
        for handler_id, labels in SELECTORS.items():
            kopf.on.mutate(
                "v1",
                "pods",
                id=handler_id,
                operations=["CREATE"],
                labels=labels,
                ignore_failures=self.settings.webhook_failure_policy == "Ignore",
                persistent=True,
                side_effects=False,
                registry=reg,
            )(_fn(self.injector.mutate))

    async def startup(self, **_: Any) -> None:
        if self.settings.store_checks:
            self.store_checks.start(self.metrics.set_store_checks)
        await self.serve_metrics()

    async def serve_metrics(self) -> None:
        """Serve /metrics and /scaling on the metrics port (once; a standby serves them too)."""
        if self.settings.metrics_port and self._metrics_runner is None:
            self._metrics_runner = await self.metrics.serve(
                self.settings.metrics_host, self.settings.metrics_port
            )
            log.info(
                "queue metrics on http://%s:%d/metrics",
                self.settings.metrics_host,
                self.settings.metrics_port,
            )

    async def stop_metrics(self) -> None:
        if self._metrics_runner is not None:
            await self._metrics_runner.cleanup()
            self._metrics_runner = None

    async def cleanup(self, **_: Any) -> None:
        await self.store_checks.stop()
        await self.stop_metrics()
        await self.buckets.close()

    def index_spec(self, namespace: str, name: str, spec: Mapping[str, Any], **_: Any) -> dict[Any, Any]:
        return {(namespace, name): dict(spec)}

    # -- topics ----------------------------------------------------------------------------------

    def _policy(self, dlp_index: Index, namespace: str, name: str | None) -> DeadLetterPolicySpec | None:
        if name is None:
            return None
        found = _lookup(dlp_index, namespace, name)
        if found is None:
            raise Waiting(
                "DeadLetterPolicyNotFound",
                f"DeadLetterPolicy {name!r} does not exist in namespace {namespace!r}",
            )
        return _parse(DeadLetterPolicySpec, found, "DeadLetterPolicy")

    async def _topic(
        self, name: str, namespace: str, spec: Mapping[str, Any], dlp_index: Index, with_figures: bool
    ) -> dict[str, Any]:
        topic = _parse(TopicSpec, spec, "Topic")
        _name(name, "topic")
        config = topic_config(topic, self._policy(dlp_index, namespace, topic.dead_letter_policy))
        bq = await self.buckets.get(namespace)
        try:
            await apply_topic(bq, name, config)
        except StorageError:
            raise
        except BucketqError as exc:
            raise InvalidSpec(str(exc)) from None
        fields: dict[str, Any] = {
            "partitions": config.partitions,
            "deadLetterTopic": config.dead_letter_topic(name),
        }
        if with_figures:
            figures = await topic_figures(bq, name)
            self.metrics.set_topic(namespace, name, figures)
            fields.update(figures.status())
        return fields

    async def reconcile_topic(
        self,
        name: str,
        namespace: str,
        spec: Mapping[str, Any],
        body: Mapping[str, Any],
        patch: kopf.Patch,
        retry: int,
        dlp_index: Index,
        **_: Any,
    ) -> None:
        self.metrics.revive(namespace, name)
        async with self.reconciler.reconciling("Topic", namespace, body, patch, retry=retry) as out:
            out.set(**await self._topic(name, namespace, spec, dlp_index, with_figures=False))
            self._store_condition(out.conditions)

    async def finalize_topic(
        self,
        name: str,
        namespace: str,
        spec: Mapping[str, Any],
        body: Mapping[str, Any],
        patch: kopf.Patch,
        retry: int,
        logger: Any,
        **_: Any,
    ) -> None:
        self.metrics.forget_topic(namespace, name, f"{name}.dlq")
        policy = spec.get("deletionPolicy", DeletionPolicy.RETAIN)
        if policy != DeletionPolicy.DELETE:
            logger.info(f"deletionPolicy {policy}: topic {name!r} is left in the bucket")
            return
        try:
            bq = await self.buckets.get(namespace)
            deleted = await delete_topic(bq, name, await current_config(bq, name))
        except StorageError as exc:
            message = self.buckets.redact(str(exc))
            patch.status["phase"] = str(Phase.DELETING)
            self.metrics.reconcile_errors.labels("Topic", "StorageUnavailable").inc()
            raise kopf.TemporaryError(
                f"cannot purge topic {name!r}: {message}", delay=self.reconciler.backoff(retry)
            ) from None
        logger.info(f"deletionPolicy Delete: purged topic {name!r} ({deleted} objects)")

    async def collect_garbage(
        self, name: str, namespace: str, patch: kopf.Patch, logger: Any, stopped: Any, **_: Any
    ) -> None:
        """Retention and garbage collection of one topic and its default dead-letter topic (docs/design.md 2.5)."""
        await _until_stopped(
            stopped, self._collect_garbage(name, namespace, patch, logger), lambda: self.buckets.stopping
        )

    async def _collect_garbage(self, name: str, namespace: str, patch: kopf.Patch, logger: Any) -> None:
        try:
            bq = await self.buckets.get(namespace)
            config = await current_config(bq, name)
            if config is None:
                return
            topics = [name]
            if config.dead_letter.enabled and config.dead_letter.topic is None:
                topics.append(f"{name}.dlq")
            report = await bq.collect_garbage(
                topics=topics,
                member_ttl_s=self.settings.member_ttl_s,
                dedup_window_s=self.settings.dedup_window_s,
                segment_grace_s=self.settings.gc_segment_grace_s,
                delta_grace_s=self.settings.gc_delta_grace_s,
            )
        except StorageError as exc:
            self.metrics.storage_reachable.labels(namespace).set(0)
            logger.warning(f"garbage collection of {name!r} failed: {self.buckets.redact(str(exc))}")
            return
        for kind in GC_KINDS:
            count = getattr(report, kind)
            if count:
                self.metrics.gc_deleted.labels(namespace, name, kind).inc(count)
        for topic, stored in report.stored.items():
            self.metrics.set_storage(namespace, topic, stored)
        for passed in report.abandoned_subscriptions:
            logger.warning(
                f"garbage collection of {name!r}: subscription {passed} is inactive past the topic's "
                "subscriptionTimeoutSeconds and no longer holds its data"
            )
        patch.status["lastGarbageCollection"] = now_iso()
        patch.status["garbageCollectedObjects"] = report.total
        if report.total:
            logger.info(f"garbage collection of {name!r}: deleted {report.total} objects")

    def _store_condition(self, conditions: list[Cond]) -> None:
        """``StoreChecked`` on a Topic: what the store checks at operator start found."""
        if self.settings.store_checks:
            conditions.append(self.store_checks.condition())

    # -- consumers -------------------------------------------------------------------------------

    async def _consumer(
        self,
        name: str,
        namespace: str,
        spec: Mapping[str, Any],
        indexes: Mapping[str, Index],
        out_conditions: list[Cond],
        with_figures: bool,
    ) -> dict[str, Any]:
        consumer = _parse(ConsumerSpec, spec, "Consumer")
        _name(name, "consumer")
        bq = await self.buckets.get(namespace)
        try:
            reg = await apply_consumer(bq, name, consumer)
        except MissingTopics as exc:
            raise Waiting("TopicNotFound", str(exc)) from None
        out_conditions.append(self._policy_match(consumer, namespace, indexes["topic_index"]))
        fields: dict[str, Any] = {"consumerId": reg.id}
        if with_figures:
            figures = await consumer_figures(bq, name, list(consumer.topics))
            fields.update(figures.status())
            fields["scaling"] = figures.scaling(time.time())
            out_conditions.append(figures.stalled())
        return fields

    @staticmethod
    def _policy_match(consumer: ConsumerSpec, namespace: str, topic_index: Index) -> Cond:
        """Dead-letter settings live on topics (the engine applies them per topic, to all consumers).

        ``spec.deadLetterPolicy`` of a Consumer is deprecated and ignored: it can only repeat its
        topics' policy or contradict it. Both are reported, neither stops the consumer.
        """
        if consumer.dead_letter_policy is None:
            return Cond(
                DEAD_LETTER_POLICY, True, "TopicPolicies", "dead-lettering follows each topic's policy"
            )
        other = []
        for topic in consumer.topics:
            found = _lookup(topic_index, namespace, topic)
            if found is not None and found.get("deadLetterPolicy") != consumer.dead_letter_policy:
                other.append(f"{topic} uses {found.get('deadLetterPolicy') or 'the default policy'}")
        if other:
            return Cond(
                DEAD_LETTER_POLICY,
                False,
                "PolicyMismatch",
                f"{DEPRECATED_POLICY}; it differs from the topics' policies, which apply: "
                + ", ".join(other),
            )
        return Cond(
            DEAD_LETTER_POLICY,
            True,
            "Deprecated",
            f"{DEPRECATED_POLICY}; it repeats the policy of its topics ({consumer.dead_letter_policy!r})",
        )

    async def reconcile_consumer(
        self,
        name: str,
        namespace: str,
        spec: Mapping[str, Any],
        body: kopf.Body,
        patch: kopf.Patch,
        retry: int,
        dlp_index: Index,
        topic_index: Index,
        old: Any = None,
        **_: Any,
    ) -> None:
        if spec.get("deadLetterPolicy"):
            # once per change (create, update, operator restart), not on every status refresh
            kopf.warn(body, reason="DeprecatedField", message=DEPRECATED_POLICY)
        async with self.reconciler.reconciling("Consumer", namespace, body, patch, retry=retry) as out:
            indexes = {"dlp_index": dlp_index, "topic_index": topic_index}
            out.set(
                **await self._consumer(name, namespace, spec, indexes, out.conditions, with_figures=False)
            )
            dropped = sorted(
                set((old or {}).get("spec", {}).get("topics") or ()) - set(spec.get("topics") or ())
            )
            if dropped and spec.get("deletionPolicy") == DeletionPolicy.DELETE:
                await unsubscribe(await self.buckets.get(namespace), name, dropped)

    async def finalize_consumer(
        self,
        name: str,
        namespace: str,
        spec: Mapping[str, Any],
        patch: kopf.Patch,
        retry: int,
        logger: Any,
        **_: Any,
    ) -> None:
        self.metrics.forget_consumer(namespace, name)
        if spec.get("deletionPolicy", DeletionPolicy.RETAIN) != DeletionPolicy.DELETE:
            logger.info(f"deletionPolicy Retain: the cursors of consumer {name!r} are kept")
            return
        try:
            bq = await self.buckets.get(namespace)
            deleted = await delete_consumer(bq, name, list(spec.get("topics") or []))
        except StorageError as exc:
            patch.status["phase"] = str(Phase.DELETING)
            self.metrics.reconcile_errors.labels("Consumer", "StorageUnavailable").inc()
            raise kopf.TemporaryError(
                f"cannot remove consumer {name!r}: {self.buckets.redact(str(exc))}",
                delay=self.reconciler.backoff(retry),
            ) from None
        logger.info(f"deletionPolicy Delete: removed consumer {name!r} ({deleted} objects)")

    # -- dead-letter policies --------------------------------------------------------------------

    async def _apply_policy(
        self,
        name: str,
        namespace: str,
        spec: Mapping[str, Any],
        topic_index: Index,
        out_conditions: list[Cond],
    ) -> dict[str, Any]:
        policy = _parse(DeadLetterPolicySpec, spec, "DeadLetterPolicy")
        bq = await self.buckets.get(namespace)
        applied, failed = [], []
        for (ns, topic), store in list(topic_index.items()):
            for raw in store or ():
                if ns != namespace or dict(raw).get("deadLetterPolicy") != name:
                    continue
                try:
                    await apply_topic(bq, topic, topic_config(_parse(TopicSpec, raw, "Topic"), policy))
                    applied.append(topic)
                except StorageError:
                    raise
                except (BucketqError, InvalidSpec) as exc:
                    failed.append(f"{topic}: {exc}")
        if failed:
            out_conditions.append(Cond("Applied", False, "TopicRejected", "; ".join(failed)))
        else:
            out_conditions.append(Cond("Applied", True, "Applied", f"applied to {len(applied)} topic(s)"))
        return {"appliedTo": sorted(applied)}

    async def reconcile_policy(
        self,
        name: str,
        namespace: str,
        spec: Mapping[str, Any],
        body: Mapping[str, Any],
        patch: kopf.Patch,
        retry: int,
        topic_index: Index,
        **_: Any,
    ) -> None:
        async with self.reconciler.reconciling(
            "DeadLetterPolicy", namespace, body, patch, retry=retry
        ) as out:
            out.set(**await self._apply_policy(name, namespace, spec, topic_index, out.conditions))

    # -- periodic refresh ------------------------------------------------------------------------

    async def refresh(
        self,
        name: str,
        namespace: str,
        spec: Mapping[str, Any],
        body: Mapping[str, Any],
        patch: kopf.Patch,
        resource: Any,
        dlp_index: Index,
        topic_index: Index,
        stopped: Any,
        **_: Any,
    ) -> None:
        """Re-apply the spec (drift after restarts or outages) and refresh the status figures."""
        await _until_stopped(
            stopped,
            self._refresh(name, namespace, spec, body, patch, resource, dlp_index, topic_index),
            lambda: self.buckets.stopping,
        )

    async def _refresh(
        self,
        name: str,
        namespace: str,
        spec: Mapping[str, Any],
        body: Mapping[str, Any],
        patch: kopf.Patch,
        resource: Any,
        dlp_index: Index,
        topic_index: Index,
    ) -> None:
        kind = str(body.get("kind") or resource.kind)
        if (body.get("status") or {}).get("phase") == Phase.FAILED and (body.get("status") or {}).get(
            "observedGeneration"
        ) == body["metadata"].get("generation"):
            return  # an invalid spec stays failed until it changes
        async with self.reconciler.reconciling(kind, namespace, body, patch, raise_errors=False) as out:
            if kind == "Topic":
                out.set(**await self._topic(name, namespace, spec, dlp_index, with_figures=True))
                self._store_condition(out.conditions)
            elif kind == "Consumer":
                indexes = {"dlp_index": dlp_index, "topic_index": topic_index}
                out.set(
                    **await self._consumer(name, namespace, spec, indexes, out.conditions, with_figures=True)
                )
            else:
                out.set(**await self._apply_policy(name, namespace, spec, topic_index, out.conditions))
