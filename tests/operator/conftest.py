"""Fixtures of the operator tests: the Kubernetes emulator (with the CRDs) and a shared operator."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bucketq.config import Settings
from tests.operator.harness import (
    ApiFailure,
    Kube,
    RunningOperator,
    fast_settings,
    port_open,
    running_emulator,
    start_operator,
    wait_for,
)
from tests.operator.k8s_emulator import EmulatorThread
from tests.support.servers import S3Server, free_ports

SHARED = "shared-*"

logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


@pytest.fixture(scope="session")
def emulator() -> Iterator[EmulatorThread]:
    """The emulated API server, with the generated CRDs installed."""
    with running_emulator() as thread:
        yield thread


@pytest.fixture(scope="session")
def kube(emulator: EmulatorThread) -> Kube:
    return Kube(emulator.url)


@pytest.fixture(scope="session")
def shared_engine(moto_server: S3Server) -> Settings:
    return moto_server.settings(strategy="conditional_write", root="bq")


@pytest.fixture(scope="session")
def shared_ports() -> dict[str, int]:
    webhook, metrics = free_ports(2)
    return {"webhook": webhook, "metrics": metrics}


@pytest.fixture(scope="session")
def shared_operator(
    emulator: EmulatorThread, shared_engine: Settings, shared_ports: dict[str, int]
) -> Iterator[RunningOperator]:
    """One operator for the namespaces ``shared-*``, with the webhook (HTTP) and metrics served."""
    settings = fast_settings(
        [SHARED],
        webhook=True,
        webhook_insecure=True,
        webhook_managed=False,
        webhook_addr="127.0.0.1",
        webhook_port=shared_ports["webhook"],
        metrics_host="127.0.0.1",
        metrics_port=shared_ports["metrics"],
        sidecar_image="bucketq:test",
        # long enough for a Consumer created just after its pod to arrive through the watch, short
        # enough that a pod naming a missing one is refused quickly
        webhook_consumer_wait_s=2.0,
    )
    running = start_operator(emulator.url, shared_engine, settings)
    _shared_operators.append(running)
    wait_for(lambda: port_open(shared_ports["webhook"]), "the webhook server to listen")
    try:
        yield running
    finally:
        running.stop()


# The shared operator keeps refreshing the status of every topic the operator tests created. It is
# session-scoped (these tests are no package, so no narrower shared scope exists), so it is stopped
# after the last operator test instead of at the end of the session: left running, it loads the
# moto server every later test uses.
_shared_operators: list[RunningOperator] = []


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    here = Path(__file__).parent
    if nextitem is None or here not in Path(str(nextitem.path)).parents:
        while _shared_operators:
            _shared_operators.pop().stop()


@pytest.fixture
def shared_ns(kube: Kube, shared_operator: RunningOperator) -> Iterator[str]:
    """A fresh namespace served by the shared operator; its bucketq resources are deleted after
    the test. Left behind, every one keeps a status timer of the shared operator firing each
    `status_interval_s` (an S3 read and a status patch): by the last operator test that was well
    over a hundred timers a second, which made every later test's waits longer."""
    ns = kube.namespace("shared")
    yield ns
    for plural in ("consumers", "topics", "deadletterpolicies"):
        for obj in kube.list(plural, ns):
            with contextlib.suppress(ApiFailure):  # gone already (the test deleted it)
                kube.delete(plural, ns, obj["metadata"]["name"])


@pytest.fixture
def s3_keys(moto_server: S3Server) -> Any:
    """``s3_keys(settings, prefix)``: every key in the settings' bucket under the prefix."""

    def keys(settings: Settings, prefix: str = "") -> list[str]:
        client = moto_server.client()
        out: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=settings.s3_bucket, Prefix=prefix
        ):
            out += [o["Key"] for o in page.get("Contents", [])]
        return sorted(out)

    return keys
