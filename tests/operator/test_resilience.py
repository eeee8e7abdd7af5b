"""Restart convergence, idempotence and S3 outages (conditions, retries, no crash)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from bucketq.config import Settings
from tests.operator.harness import Kube, RunningOperator, condition, fast_settings, start_operator, wait_for
from tests.operator.test_consumers import consumer
from tests.operator.test_topics import ready, topic
from tests.support.servers import S3Server
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.s3  # the operator reconciles against the moto server


def objects(moto_server: S3Server, settings: Settings, prefix: str) -> dict[str, tuple[str, Any]]:
    """key -> (ETag, LastModified) of every object under ``prefix``."""
    client = moto_server.client()
    out = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=settings.s3_bucket, Prefix=prefix):
        for o in page.get("Contents", []):
            out[o["Key"]] = (o["ETag"], o["LastModified"])
    return out


def reconciles(running: RunningOperator, kind: str) -> float:
    for line in running.operator.metrics.render().decode().splitlines():
        if line.startswith(f'bucketq_operator_reconciles_total{{kind="{kind}",result="ok"}}'):
            return float(line.split()[-1])
    return 0.0


def test_restart_converges_and_reconciling_again_changes_nothing(
    emulator: Any, kube: Kube, moto_server: S3Server
) -> None:
    ns = kube.namespace("restart")
    engine = moto_server.settings(strategy="conditional_write")
    first = start_operator(emulator.url, engine, fast_settings([ns]))
    try:
        kube.create(topic(ns, "orders", partitions=1))
        kube.create(topic(ns, "doomed", deletionPolicy="Delete"))
        kube.create(consumer(ns, "billing", topics=["orders"]))
        for plural, name in (("topics", "orders"), ("topics", "doomed"), ("consumers", "billing")):
            wait_for(lambda p=plural, n=name: ready(kube, p, ns, n), f"{plural}/{name} to be Ready")
        consumer_id = kube.get("consumers", ns, "billing")["status"]["consumerId"]  # type: ignore[index]
    finally:
        first.stop()

    # While no operator runs: spec changes, new and deleted resources, and lost bucket state.
    kube.patch("topics", ns, "orders", {"spec": {"partitions": 3}})
    kube.create(topic(ns, "fresh"))
    kube.create(consumer(ns, "audit", topics=["fresh", "orders"]))
    kube.delete("topics", ns, "doomed")
    moto_server.client().delete_object(
        Bucket=engine.s3_bucket, Key=f"{ns}/_registry/consumers/{consumer_id}.json"
    )

    second = start_operator(emulator.url, engine, fast_settings([ns]))
    try:
        wait_for(lambda: ready(kube, "topics", ns, "orders", generation=2), "orders to reach generation 2")
        wait_for(lambda: ready(kube, "consumers", ns, "audit"), "the new consumer to be Ready")
        wait_for(lambda: kube.get("topics", ns, "doomed") is None, "the deleted topic to be finalized")
        prefix = f"{ns}/"
        keys = wait_for(
            lambda: (
                (k := objects(moto_server, engine, prefix))
                and f"{prefix}_registry/consumers/{consumer_id}.json" in k
                and k
            ),
            "the lost registration to be restored",
        )
        for partition in ("p0000", "p0001", "p0002"):
            assert any(k.startswith(f"{prefix}orders/subs/billing/{partition}/log/") for k in keys), partition
            assert any(k.startswith(f"{prefix}orders/subs/audit/{partition}/log/") for k in keys), partition
        # purged: only the partitions' floor tombstones stay (a re-created topic continues their numbers)
        left = [k for k in keys if k.startswith(f"{prefix}doomed")]
        assert left and all(k.endswith("/floor.json") for k in left), (
            f"deletionPolicy Delete purged it: {left}"
        )

        before = objects(moto_server, engine, prefix)
        done = reconciles(second, "Topic")
        wait_for(lambda: reconciles(second, "Topic") >= done + 4, "two more refreshes of both topics")
        assert objects(moto_server, engine, prefix) == before, "reconciling again must write nothing"
    finally:
        second.stop()


@pytest.fixture
def switch(moto_server: S3Server) -> Iterator[TcpProxy]:
    proxy = TcpProxy.to(moto_server.endpoint_url).start()
    try:
        yield proxy
    finally:
        proxy.close()


def test_s3_outage_sets_conditions_and_recovers(
    emulator: Any, kube: Kube, moto_server: S3Server, switch: TcpProxy
) -> None:
    ns = kube.namespace("outage")
    engine = moto_server.settings(
        strategy="conditional_write",
        s3_endpoint_url=switch.url,
        s3_max_attempts=1,
        s3_connect_timeout_s=1.0,
        s3_read_timeout_s=2.0,
    )
    switch.down()
    running = start_operator(emulator.url, engine, fast_settings([ns]))
    try:
        kube.create(topic(ns, "orders"))
        obj = wait_for(
            lambda: (
                (o := kube.get("topics", ns, "orders"))
                and condition(o, "StorageReachable").get("status") == "False"
                and o
            ),
            "StorageReachable to turn False",
        )
        assert obj["status"]["phase"] == "Pending"
        assert (condition(obj, "Ready")["status"], condition(obj, "Ready")["reason"]) == (
            "False",
            "StorageUnavailable",
        )
        message = condition(obj, "StorageReachable")["message"]
        assert switch.url.split("//")[1] in message, message
        for secret in (engine.s3_access_key_id, engine.s3_secret_access_key):
            assert secret is not None and secret.get_secret_value() not in str(obj)
        wait_for(
            lambda: 'reason="StorageUnavailable"' in running.operator.metrics.render().decode(),
            "the reconcile error metric",
        )
        assert running.thread.is_alive(), "an outage must not stop the operator"

        switch.up()
        wait_for(lambda: ready(kube, "topics", ns, "orders"), "Topic orders to recover", timeout=90)

        switch.down()
        degraded = wait_for(
            lambda: (o := kube.get("topics", ns, "orders")) and o["status"].get("phase") == "Degraded" and o,
            "the refresh to notice the outage",
        )
        assert condition(degraded, "StorageReachable")["status"] == "False"
        switch.up()
        wait_for(
            lambda: (
                ready(kube, "topics", ns, "orders")
                and kube.get("topics", ns, "orders")["status"]["phase"] == "Ready"
            ),  # type: ignore[index]
            "Topic orders to be Ready again",
            timeout=90,
        )
        assert running.thread.is_alive()
    finally:
        running.stop()
