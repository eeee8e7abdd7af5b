"""Topic and DeadLetterPolicy reconciliation against the emulator and a moto S3 bucket."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bucketq.config import Settings
from tests.operator.harness import ApiFailure, Kube, RunningOperator, condition, wait_for
from tests.support.servers import S3Server

pytestmark = pytest.mark.s3  # the operator reconciles against the moto server


def topic(ns: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "bucketq.io/v1alpha1",
        "kind": "Topic",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def marker(moto_server: S3Server, engine: Settings, ns: str, name: str) -> dict[str, Any] | None:
    client = moto_server.client()
    try:
        obj = client.get_object(Bucket=engine.s3_bucket, Key=f"{engine.root}/{ns}/{name}/.topic")
    except client.exceptions.NoSuchKey:
        return None
    return dict(json.loads(obj["Body"].read()))


def ready(
    kube: Kube, plural: str, ns: str, name: str, generation: int | None = None
) -> dict[str, Any] | None:
    obj = kube.get(plural, ns, name)
    if obj is None or condition(obj, "Ready").get("status") != "True":
        return None
    if generation is not None and obj["status"].get("observedGeneration") != generation:
        return None
    return obj


def test_topic_create_update_and_status(
    kube: Kube,
    shared_ns: str,
    shared_engine: Settings,
    moto_server: S3Server,
    shared_operator: RunningOperator,
) -> None:
    kube.create(topic(shared_ns, "orders", partitions=2, retentionSeconds=3600))
    obj = wait_for(lambda: ready(kube, "topics", shared_ns, "orders"), "Topic orders to be Ready")
    assert obj["status"]["phase"] == "Ready"
    assert condition(obj, "StorageReachable")["status"] == "True"
    assert obj["status"]["observedGeneration"] == 1
    found = marker(moto_server, shared_engine, shared_ns, "orders")
    assert found is not None and found["config"]["partitions"] == 2
    assert found["config"]["retention_seconds"] == 3600
    assert marker(moto_server, shared_engine, shared_ns, "orders.dlq") is not None

    kube.patch("topics", shared_ns, "orders", {"spec": {"partitions": 5}})
    wait_for(
        lambda: ready(kube, "topics", shared_ns, "orders", generation=2), "generation 2 to be reconciled"
    )
    found = marker(moto_server, shared_engine, shared_ns, "orders")
    assert found is not None and found["config"]["partitions"] == 5


def policy(ns: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "bucketq.io/v1alpha1",
        "kind": "DeadLetterPolicy",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def test_shrinking_partitions_is_rejected_by_the_schema(
    kube: Kube, shared_ns: str, shared_operator: RunningOperator
) -> None:
    kube.create(topic(shared_ns, "grow", partitions=3))
    wait_for(lambda: ready(kube, "topics", shared_ns, "grow"), "Topic grow to be Ready")
    with pytest.raises(ApiFailure) as failure:
        kube.patch("topics", shared_ns, "grow", {"spec": {"partitions": 2}})
    assert failure.value.status == 422
    assert "partitions may only grow" in failure.value.body["message"]


def test_deletion_policies(
    kube: Kube, shared_ns: str, shared_engine: Settings, s3_keys: Any, shared_operator: RunningOperator
) -> None:
    kube.create(topic(shared_ns, "kept", deletionPolicy="Retain"))
    kube.create(topic(shared_ns, "purged", deletionPolicy="Delete"))
    for name in ("kept", "purged"):
        obj = wait_for(lambda n=name: ready(kube, "topics", shared_ns, n), f"Topic {name} to be Ready")
        assert "bucketq.io/finalizer" in obj["metadata"]["finalizers"]
    prefix = f"{shared_engine.root}/{shared_ns}/"
    assert f"{prefix}purged/.topic" in s3_keys(shared_engine, prefix)
    kube.delete("topics", shared_ns, "kept")
    kube.delete("topics", shared_ns, "purged")
    for name in ("kept", "purged"):
        wait_for(lambda n=name: kube.get("topics", shared_ns, n) is None, f"Topic {name} to be gone")
    keys = s3_keys(shared_engine, prefix)
    assert f"{prefix}kept/.topic" in keys, "Retain must leave the topic in the bucket"
    # purged: only the partitions' floor tombstones stay (a re-created topic continues their numbers)
    left = [k for k in keys if k.startswith((f"{prefix}purged/", f"{prefix}purged.dlq/"))]
    assert left and all(k.endswith("/floor.json") for k in left), keys


def test_dead_letter_policy_is_applied_to_its_topics(
    kube: Kube,
    shared_ns: str,
    shared_engine: Settings,
    moto_server: S3Server,
    shared_operator: RunningOperator,
) -> None:
    kube.create(topic(shared_ns, "payments", deadLetterPolicy="strict"))
    pending = wait_for(
        lambda: (
            (o := kube.get("topics", shared_ns, "payments"))
            and condition(o, "Ready").get("reason") == "DeadLetterPolicyNotFound"
            and o
        ),
        "Topic payments to wait for its DeadLetterPolicy",
    )
    assert pending["status"]["phase"] == "Pending"
    assert "strict" in condition(pending, "Ready")["message"]

    kube.create(policy(shared_ns, "strict", maxDeliveries=2, deadLetterTopic="payments-failed"))
    wait_for(lambda: ready(kube, "topics", shared_ns, "payments"), "Topic payments to be Ready")
    dlp = wait_for(
        lambda: ready(kube, "deadletterpolicies", shared_ns, "strict"), "policy strict to be Ready"
    )
    assert dlp["status"]["appliedTo"] == ["payments"]
    found = marker(moto_server, shared_engine, shared_ns, "payments")
    assert found is not None
    assert found["config"]["dead_letter"] == {
        "enabled": True,
        "max_deliveries": 2,
        "topic": "payments-failed",
    }
    dlq = marker(moto_server, shared_engine, shared_ns, "payments-failed")
    assert dlq is not None and dlq["config"]["dead_letter"]["enabled"] is False

    kube.patch("deadletterpolicies", shared_ns, "strict", {"spec": {"maxDeliveries": 7}})
    wait_for(
        lambda: (
            (m := marker(moto_server, shared_engine, shared_ns, "payments"))
            and m["config"]["dead_letter"]["max_deliveries"] == 7
        ),
        "the policy change to reach the topic marker",
    )

    kube.patch(
        "deadletterpolicies",
        shared_ns,
        "strict",
        {"spec": {"dropAction": "Discard", "deadLetterTopic": None}},
    )
    wait_for(
        lambda: (
            (m := marker(moto_server, shared_engine, shared_ns, "payments"))
            and m["config"]["dead_letter"]["enabled"] is False
        ),
        "Discard to disable dead-lettering",
    )
    obj = wait_for(
        lambda: (
            (o := kube.get("topics", shared_ns, "payments")) and "deadLetterTopic" not in o["status"] and o
        ),
        "the topic status to show no dead-letter topic",
    )
    assert obj["status"]["phase"] == "Ready"
