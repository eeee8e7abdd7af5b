"""Running the operator: kopf settings, registry and the event loop entry point."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

import kopf

from bucketq.config import Settings
from bucketq.operator.config import OperatorSettings
from bucketq.operator.handlers import Operator
from bucketq.operator.leader import (
    ElectionThread,
    LeadershipLost,
    LeaseApi,
    LeaseConfig,
    default_identity,
    in_cluster_namespace,
)
from bucketq.operator.models import GROUP
from bucketq.operator.namespace_resync import NamespaceResync
from bucketq.operator.webhook import webhook_server

log = logging.getLogger("bucketq.operator")
EXIT_FENCED = 70  # the process ended itself: its work did not stop before the Lease could pass

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


def standby_registry(operator: Operator, *, login: LoginFn | None = None) -> kopf.OperatorRegistry:
    """What a standby replica runs: the login and the watch of Consumers' persisted scaling
    figures. Nothing is written: no handler changes an object, none needs a finalizer."""
    registry = kopf.OperatorRegistry()
    kopf.on.login(registry=registry)(login or default_login)
    operator.register_scaling_watch(registry)
    return registry


def _standby_settings(settings: OperatorSettings) -> kopf.OperatorSettings:
    s = kopf_settings(settings)
    # kopf strips its finalizer from objects none of its handlers needs it for: a standby would
    # remove the leader's from every Consumer (see kopf_settings, webhook_only)
    s.persistence.finalizer = f"standby.{GROUP}/unused-finalizer"
    return s


async def _run_kopf(
    operator: Operator,
    registry: kopf.OperatorRegistry,
    settings: kopf.OperatorSettings,
    *,
    stop_flag: Flag | None,
    ready_flag: Flag | None,
) -> None:
    s = operator.settings
    scope: dict[str, Any] = {"namespaces": s.namespaces} if s.namespaces else {"clusterwide": True}
    liveness = f"http://0.0.0.0:{s.liveness_port}/healthz" if s.liveness_port else None
    insights = None  # kopf's own when it serves every namespace
    if s.namespaces:
        # kopf's namespace watch can miss a namespace; the resync revises kopf's insights itself
        resync = NamespaceResync(s.namespaces, s.namespace_resync_s)
        resync.register(registry)
        insights = resync.insights
    await kopf.operator(
        registry=registry,
        settings=settings,
        standalone=s.peering is None,
        liveness_endpoint=liveness,
        stop_flag=stop_flag,
        ready_flag=ready_flag,
        insights=insights,
        **scope,
    )


async def serve(
    operator: Operator,
    *,
    login: LoginFn | None = None,
    stop_flag: Flag | None = None,
    ready_flag: Flag | None = None,
    on_fence_breach: Callable[[], None] | None = None,
) -> None:
    """Run ``operator`` until ``stop_flag`` is set (or SIGTERM/SIGINT in the main thread).

    With ``leader_election`` it first stands by, and works only while it holds the Lease
    (:func:`serve_elected`); raises :class:`LeadershipLost` when it had to stop for losing it.
    """
    if operator.settings.leader_election:
        await serve_elected(
            operator, login=login, stop_flag=stop_flag, ready_flag=ready_flag, on_fence_breach=on_fence_breach
        )
        return
    registry = registry_for(operator, login=login)
    await _run_kopf(
        operator, registry, kopf_settings(operator.settings), stop_flag=stop_flag, ready_flag=ready_flag
    )


def exit_at_once() -> None:
    """The leader could not stop its work before a standby may take over: end the process now
    (its pod restarts as a standby). Nothing it would still do is worth two operators at once."""
    log.critical("work did not stop before the Lease could pass to another replica: exiting at once")
    logging.shutdown()
    os._exit(EXIT_FENCED)


async def serve_elected(
    operator: Operator,
    *,
    login: LoginFn | None = None,
    stop_flag: Flag | None = None,
    ready_flag: Flag | None = None,
    on_fence_breach: Callable[[], None] | None = None,
) -> None:
    """Stand by until this replica holds the Lease, then run every handler until it stops or
    loses the Lease (docs/operator.md, "High availability").

    Standing by, it runs kopf with :func:`standby_registry` (the scaling endpoint answers from the
    Consumers' persisted figures) and serves metrics. Leading, it runs the full operator. When the
    Lease is lost it stops kopf and raises :class:`LeadershipLost`; when kopf has not stopped by
    :meth:`LeaderElector.fence_at`, ``on_fence_breach`` (default: :func:`exit_at_once`) runs.
    Stopped while leading, it stops kopf first (still renewing meanwhile), then releases the
    Lease so that a standby takes over at once.
    """
    s = operator.settings
    login = login or default_login
    config = LeaseConfig(
        name=s.leader_lease_name,
        namespace=s.leader_lease_namespace or in_cluster_namespace() or "default",
        identity=s.leader_identity or default_identity(),
        lease_duration_s=s.leader_lease_duration_s,
        renew_deadline_s=s.leader_renew_deadline_s,
        retry_period_s=s.leader_retry_period_s,
    )
    api = LeaseApi(login, config.namespace, config.name, timeout_s=config.renew_deadline_s)
    election = ElectionThread(api, config).start()
    log.info("%s stands by for Lease %s/%s", config.identity, config.namespace, config.name)
    stopped = asyncio.create_task(_flag_set(stop_flag), name="stop flag")
    lost = False
    try:
        await operator.serve_metrics()
        standby, standby_stop = _start_kopf(
            operator, standby_registry(operator, login=login), _standby_settings(s), ready_flag, "standby"
        )
        await _until(election.leading, stopped, standby)
        standby_stop.set()
        await standby
        if stopped.done() or not election.leading.is_set():
            return
        log.info("%s leads: reconciliation and garbage collection start", config.identity)
        leader, leader_stop = _start_kopf(
            operator, registry_for(operator, login=login), kopf_settings(s), None, "leader"
        )
        await _until(election.lost, stopped, leader)
        leader_stop.set()
        if not await _stop_before_fence(leader, election):
            (on_fence_breach or exit_at_once)()
        lost = election.lost.is_set()
        if lost:
            raise LeadershipLost(f"{config.identity} lost the Lease and stopped working")
        leader.result()  # kopf ending by itself is an error: raised after the Lease is released
    finally:
        await election.stop(release=not lost)
        stopped.cancel()
        await operator.stop_metrics()


def _start_kopf(
    operator: Operator,
    registry: kopf.OperatorRegistry,
    settings: kopf.OperatorSettings,
    ready_flag: Flag | None,
    name: str,
) -> tuple[asyncio.Task[None], asyncio.Event]:
    """kopf running ``registry`` in a task, and the event that stops it."""
    stop = asyncio.Event()
    task = asyncio.create_task(
        _run_kopf(operator, registry, settings, stop_flag=stop, ready_flag=ready_flag), name=name
    )
    return task, stop


async def _until(event: threading.Event, *tasks: asyncio.Task[None]) -> None:
    """Wait until ``event`` (set by the election thread) is set or one of ``tasks`` ends."""
    while not event.is_set():
        done, _ = await asyncio.wait(tasks, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
        if done:
            return


async def _stop_before_fence(leader: asyncio.Task[None], elector: ElectionThread) -> bool:
    """Wait for the leader's kopf to stop; False when the fence passed first. While the Lease is
    still renewed (a stop, not a loss) the fence moves on with each renewal."""
    while not leader.done():
        left = elector.fence_at() - elector.clock()
        if left <= 0:
            return False
        await asyncio.wait({leader}, timeout=min(left, 0.2))
    return True


async def _flag_set(flag: Flag | None) -> None:
    """Wait until ``flag`` (an asyncio or threading Event, or a future) is set."""
    if flag is None:
        await asyncio.Event().wait()
    elif isinstance(flag, asyncio.Event):
        await flag.wait()
    elif isinstance(flag, threading.Event):
        while not flag.is_set():
            await asyncio.sleep(0.05)
    else:
        await asyncio.wrap_future(flag) if isinstance(flag, concurrent.futures.Future) else await flag


async def run(engine: Settings, settings: OperatorSettings, **kwargs: Any) -> None:
    """Run a new :class:`Operator` (see :func:`serve` for the keyword arguments)."""
    await serve(Operator(engine, settings), **kwargs)
