"""A namespace created while the operator starts is served (kopf's namespace watch misses it).

kopf lists the namespaces once, then starts a watch that lists them again and ignores what that
second LIST holds. The emulator creates namespaces right after the first LIST is taken, so the
second one holds them: without ``NamespaceResync`` the namespace is never served (its Consumer
stays without a status for as long as one waits; checked by hand with a one-hour resync).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from bucketq.operator.namespace_resync import NamespaceResync
from tests.operator.harness import Kube, fast_settings, running_emulator, start_operator, wait_for
from tests.operator.k8s_emulator import EmulatorThread
from tests.operator.test_consumers import consumer
from tests.operator.test_topics import ready, topic
from tests.support.servers import S3Server

pytestmark = pytest.mark.s3  # the operator reconciles against the moto server


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


@pytest.fixture
def own_emulator() -> Iterator[EmulatorThread]:
    """An API server of this test's own: the session's has operators whose namespace resync LISTs
    namespaces too, and would take the LIST the race is staged on."""
    with running_emulator() as thread:
        yield thread


def test_a_namespace_created_between_the_operators_two_namespace_lists_is_served(
    own_emulator: EmulatorThread, moto_server: S3Server, caplog: pytest.LogCaptureFixture
) -> None:
    run = uuid.uuid4().hex[:6]
    late, unrelated = f"race-{run}-late", f"other-{run}"
    assert own_emulator.emulator is not None
    own_emulator.emulator.create_after_next_list("namespaces", namespace(late), namespace(unrelated))
    kube = Kube(own_emulator.url)
    engine = moto_server.settings(strategy="conditional_write")
    settings = fast_settings([f"race-{run}-*"], namespace_resync_s=1.0)
    with caplog.at_level(logging.WARNING, logger="bucketq.operator"):
        running = start_operator(own_emulator.url, engine, settings)
        try:
            wait_for(lambda: kube.get("namespaces", None, late), "the namespace created after a LIST")
            kube.create(topic(late, "events"))
            kube.create(consumer(late, "worker", topics=["events"]))
            wait_for(lambda: ready(kube, "consumers", late, "worker"), "the Consumer to be Ready", timeout=30)
        finally:
            running.stop()
    served = [
        r.getMessage()
        for r in caplog.records
        if "missed by the namespace watch" in r.getMessage() and run in r.getMessage()
    ]
    assert served == [f"namespace {late!r} was missed by the namespace watch; serving it now"], (
        "the resync served it, once, and not the namespace outside the pattern"
    )


async def test_a_namespace_list_that_fails_is_logged_and_tried_again_next_round(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The API server does not answer one round: a warning, and the next round lists again."""

    class Unanswered(NamespaceResync):
        rounds = 0

        async def resync(self) -> list[str]:
            self.rounds += 1
            if self.rounds == 1:
                raise ConnectionRefusedError("the API server is unreachable")
            return []

    resync = Unanswered(["race-*"], interval_s=0.01)
    resync.insights.ready_namespaces.set()
    with caplog.at_level(logging.WARNING, logger="bucketq.operator"):
        await resync._start()
        for _ in range(500):
            if resync.rounds >= 3:
                break
            await asyncio.sleep(0.01)
        await resync._stop()
    assert resync.rounds >= 3, "the loop kept listing after the failure"
    assert [r.getMessage() for r in caplog.records] == [
        "could not list the namespaces to serve: ConnectionRefusedError('the API server is unreachable')"
    ]
