"""The scaling endpoint right after an operator (re)starts (issue 23): it answers from the figures
the last operator persisted in the Consumer's ``status.scaling``, not 404, until its own refresh
has figures, even when it cannot reach the bucket at all; a deleted Consumer is 404 again.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import pytest

from bucketq.operator.scaling import persisted_loads
from tests.operator.harness import Kube, fast_settings, start_operator, wait_for
from tests.operator.k8s_emulator import EmulatorThread
from tests.operator.test_consumers import consumer, publish
from tests.operator.test_topics import ready, topic
from tests.support.lying_s3 import LyingS3
from tests.support.servers import S3Server, free_ports

pytestmark = pytest.mark.s3  # the first operator reconciles against the moto server


def scaling(port: int, ns: str, name: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/scaling/{ns}/{name}", timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_a_restarted_operator_answers_from_the_persisted_figures(
    emulator: EmulatorThread, kube: Kube, moto_server: S3Server
) -> None:
    ns = kube.namespace("restart")
    engine = moto_server.settings(strategy="conditional_write")
    (port,) = free_ports(1)
    first = start_operator(
        emulator.url, engine, fast_settings([ns], metrics_host="127.0.0.1", metrics_port=port)
    )
    try:
        kube.create(topic(ns, "orders", partitions=2))
        kube.create(consumer(ns, "billing", topics=["orders"]))
        wait_for(lambda: ready(kube, "consumers", ns, "billing"), "Consumer billing to be Ready")
        publish(engine, ns, "orders", 7)

        wait_for(lambda: persisted_pending(kube, ns, "billing") == 7, "status.scaling with 7 pending")
        wait_for(
            lambda: (
                (r := scaling(port, ns, "billing"))[0] == 200
                and (r[1]["source"], r[1]["pending"]) == ("refresh", 7)
            ),
            "the operator's own figures",
        )
    finally:
        first.stop()
    assert scaling_refused(port), "the first operator's port is closed"
    saved = (kube.get("consumers", ns, "billing") or {})["status"]["scaling"]  # its last refresh
    assert [t["topic"] for t in saved["topics"]] == ["orders"]

    # the second operator cannot reach the bucket at all: it never refreshes anything
    with LyingS3(moto_server.endpoint_url) as proxy:
        unreachable = proxy.url
    down = moto_server.settings(strategy="conditional_write", s3_endpoint_url=unreachable, s3_max_attempts=1)
    second = start_operator(
        emulator.url, down, fast_settings([ns], metrics_host="127.0.0.1", metrics_port=port)
    )
    try:
        status, body = wait_for(
            lambda: (r := scaling(port, ns, "billing"))[0] == 200 and r, "the endpoint to answer", 30
        )
        assert body["source"] == "status"
        assert (body["pending"], body["replicas"]) == (7, 1)
        assert body["refreshedAt"] == saved["refreshedAt"]
        assert body["ageSeconds"] >= time.time() - saved["refreshedAt"] - 1
        status, body = scaling(port, ns, "billing?messagesPerReplica=3")
        assert (status, body["replicas"]) == (200, 3)

        kube.delete("consumers", ns, "billing")  # deletionPolicy Retain: the finalizer needs no bucket
        wait_for(lambda: kube.get("consumers", ns, "billing") is None, "Consumer billing to be deleted")
        # the endpoint learns of the deletion from the watch, a moment after the API server
        status, body = wait_for(
            lambda: (r := scaling(port, ns, "billing"))[0] != 200 and r, "the endpoint to forget billing", 10
        )
        assert (status, body["error"]) == (404, "consumer_not_found")
    finally:
        second.stop()


def persisted_pending(kube: Kube, ns: str, name: str) -> int | None:
    found = ((kube.get("consumers", ns, name) or {}).get("status") or {}).get("scaling")
    return sum(t["pending"] for t in found["topics"]) if found else None


def scaling_refused(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)
    except (urllib.error.URLError, ConnectionError):
        return True
    return False


@pytest.mark.parametrize(
    "scaling_status",
    [
        None,
        "text",
        {"topics": []},  # no refreshedAt
        {"refreshedAt": "soon", "topics": []},
        {"refreshedAt": 1.0, "topics": [{"topic": "t", "pending": "many"}]},
    ],
)
def test_an_unreadable_persisted_status_is_no_figure(scaling_status: Any) -> None:
    assert persisted_loads(scaling_status) is None


def test_a_standby_replica_answers_from_the_persisted_figures_and_writes_nothing(
    emulator: EmulatorThread, kube: Kube, moto_server: S3Server
) -> None:
    """A replica standing by (another holds the Lease) serves /scaling from the Consumers' status,
    and makes no write to the custom resources: no finalizer, no annotation, no status."""
    ns = kube.namespace("standby")
    engine = moto_server.settings(strategy="conditional_write")
    (port,) = free_ports(1)
    first = start_operator(emulator.url, engine, fast_settings([ns]))
    try:
        kube.create(topic(ns, "orders"))
        kube.create(consumer(ns, "billing", topics=["orders"]))
        wait_for(lambda: ready(kube, "consumers", ns, "billing"), "Consumer billing to be Ready")
        publish(engine, ns, "orders", 3)
        wait_for(lambda: persisted_pending(kube, ns, "billing") == 3, "status.scaling with 3 pending")
    finally:
        first.stop()
    before = kube.get("consumers", ns, "billing")
    # someone else holds the Lease, freshly: the new replica stands by for its whole duration
    kube.request(
        "POST",
        kube.path("leases", ns),
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "bucketq-operator", "namespace": ns},
            "spec": {"holderIdentity": "the-leader", "leaseDurationSeconds": 60},
        },
    )
    assert emulator.emulator is not None
    seen = len(emulator.emulator._requests)
    standby = start_operator(
        emulator.url,
        engine,
        fast_settings(
            [ns],
            metrics_host="127.0.0.1",
            metrics_port=port,
            leader_election=True,
            leader_lease_namespace=ns,
            leader_lease_duration_s=60.0,
            leader_renew_deadline_s=40.0,
            leader_retry_period_s=0.5,
        ),
    )
    try:
        _, body = wait_for(
            lambda: (r := scaling(port, ns, "billing"))[0] == 200 and r, "the standby to answer", 30
        )
        assert body["source"] == "status" and body["pending"] == 3
        time.sleep(2.0)  # several status and GC intervals of a leader: the standby runs none
        writes = [
            r
            for r in list(emulator.emulator._requests)[seen:]
            if str(getattr(r.method, "value", r.method)).upper() in ("POST", "PUT", "PATCH", "DELETE")
            and r.resource is not None
            and r.resource.group == "bucketq.io"
            and r.namespace == ns  # other tests' operators may be serving their own namespaces
        ]
        assert writes == [], [f"{r.method} {r.url}" for r in writes]
        after = kube.get("consumers", ns, "billing")
        assert after is not None and before is not None
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        assert kube.get("leases", ns, "bucketq-operator")["spec"]["holderIdentity"] == "the-leader"
    finally:
        standby.stop()
