"""Running the operator: kopf settings, registry and the event loop entry point."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import kopf

from bucketq.config import Settings
from bucketq.operator.config import OperatorSettings
from bucketq.operator.handlers import Operator
from bucketq.operator.models import GROUP
from bucketq.operator.namespace_resync import NamespaceResync
from bucketq.operator.webhook import webhook_server

Flag = Any  # asyncio.Event, threading.Event or a future: what kopf accepts as stop/ready flags
LoginFn = Callable[..., Any]


def kopf_settings(settings: OperatorSettings) -> kopf.OperatorSettings:
    """kopf's settings for this operator (persistence in ``bucketq.io`` annotations, webhook server)."""
    s = kopf.OperatorSettings()
    s.persistence.finalizer = f"{GROUP}/finalizer"
    if settings.webhook_only:
        # kopf removes its finalizer from every object none of its handlers needs it for: a webhook
        # replica (an index, no deletion handler) would strip the operator's from every Consumer,
        # and deleting one would then skip its clean-up. Its own name is one it never sets.
        s.persistence.finalizer = f"webhook.{GROUP}/unused-finalizer"
    s.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    s.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP,
        key="last-handled-configuration",
    )
    s.posting.level = logging.WARNING  # events for failures, not for every success
    s.peering.standalone = settings.peering is None
    if settings.peering is not None:
        s.peering.name = settings.peering
    if settings.webhook:
        s.admission.server = webhook_server(settings)
        if settings.webhook_managed:
            s.admission.managed = GROUP
    return s


def registry_for(operator: Operator, *, login: LoginFn | None = None) -> kopf.OperatorRegistry:
    """A registry with the operator's handlers and a login handler (default: :func:`default_login`)."""
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(login or default_login)
    return operator.register(registry)


def default_login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """The pod's service account in a cluster, else the kubeconfig (what kubectl uses)."""
    info: kopf.ConnectionInfo | None = kopf.login_with_service_account(**kwargs)
    return info or kopf.login_with_kubeconfig(**kwargs)


async def serve(
    operator: Operator,
    *,
    login: LoginFn | None = None,
    stop_flag: Flag | None = None,
    ready_flag: Flag | None = None,
) -> None:
    """Run ``operator`` until ``stop_flag`` is set (or SIGTERM/SIGINT in the main thread)."""
    settings = operator.settings
    scope: dict[str, Any] = (
        {"namespaces": settings.namespaces} if settings.namespaces else {"clusterwide": True}
    )
    liveness = f"http://0.0.0.0:{settings.liveness_port}/healthz" if settings.liveness_port else None
    registry = registry_for(operator, login=login)
    insights = None  # kopf's own when it serves every namespace
    if settings.namespaces:
        # kopf's namespace watch can miss a namespace; the resync revises kopf's insights itself
        resync = NamespaceResync(settings.namespaces, settings.namespace_resync_s)
        resync.register(registry)
        insights = resync.insights
    await kopf.operator(
        registry=registry,
        settings=kopf_settings(settings),
        standalone=settings.peering is None,
        liveness_endpoint=liveness,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
        insights=insights,
        **scope,
    )


async def run(engine: Settings, settings: OperatorSettings, **kwargs: Any) -> None:
    """Run a new :class:`Operator` (see :func:`serve` for the keyword arguments)."""
    await serve(Operator(engine, settings), **kwargs)
