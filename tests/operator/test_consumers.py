"""Consumer reconciliation, status figures and queue metrics."""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any

import pytest

from bucketq.config import Settings
from bucketq.core.app import Bucketq
from bucketq.core.keys import namespace_root
from tests.operator.harness import Kube, RunningOperator, condition, wait_for
from tests.operator.test_topics import policy, ready, topic

pytestmark = pytest.mark.s3  # the operator reconciles against the moto server


def consumer(ns: str, name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "bucketq.io/v1alpha1",
        "kind": "Consumer",
        "metadata": {"name": name, "namespace": ns},
        "spec": spec,
    }


def publish(engine: Settings, ns: str, topic_name: str, count: int) -> None:
    async def main() -> None:
        settings = engine.model_copy(update={"root": namespace_root(engine.root, ns)})
        async with Bucketq(settings) as bq:
            for i in range(count):
                await bq.publish(topic_name, {"n": i}, key=f"k{i}")

    asyncio.run(main())


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return str(resp.read().decode())


def test_consumer_registers_and_reports_backlog(
    kube: Kube,
    shared_ns: str,
    shared_engine: Settings,
    s3_keys: Any,
    shared_ports: dict[str, int],
    shared_operator: RunningOperator,
) -> None:
    kube.create(topic(shared_ns, "events", partitions=2))
    kube.create(consumer(shared_ns, "worker", topics=["events"], visibilityTimeoutSeconds=45))
    obj = wait_for(lambda: ready(kube, "consumers", shared_ns, "worker"), "Consumer worker to be Ready")
    consumer_id = obj["status"]["consumerId"]
    prefix = f"{shared_engine.root}/{shared_ns}/"
    keys = s3_keys(shared_engine, prefix)
    assert f"{prefix}_registry/consumers/{consumer_id}.json" in keys
    for partition in ("p0000", "p0001"):
        assert any(k.startswith(f"{prefix}events/subs/worker/{partition}/log/") for k in keys), keys
    assert obj["spec"]["delivery"] == {"mode": "pull"}, "the schema defaults the delivery"

    publish(shared_engine, shared_ns, "events", 7)
    wait_for(
        lambda: (o := kube.get("consumers", shared_ns, "worker")) and o["status"].get("backlog") == 7,
        "the consumer status to show a backlog of 7",
    )
    wait_for(
        lambda: (
            (o := kube.get("topics", shared_ns, "events"))
            and o["status"].get("messages") == 7
            and o["status"].get("backlog") == 7
            and o["status"].get("consumers") == ["worker"]
        ),
        "the topic status to show 7 messages, all in the backlog",
    )
    labels = f'consumer="worker",namespace="{shared_ns}",topic="events"'
    text = wait_for(
        lambda: (
            (t := metrics_text(shared_ports["metrics"]))
            and f"bucketq_subscription_backlog{{{labels}}} 7.0" in t
            and t
        ),
        "the backlog metric",
    )
    assert f'bucketq_topic_published_messages_total{{namespace="{shared_ns}",topic="events"}} 7.0' in text
    assert f"bucketq_subscription_in_flight{{{labels}}} 0.0" in text
    assert f"bucketq_subscription_dead_lettered_total{{{labels}}} 0.0" in text
    assert "bucketq_subscription_oldest_message_age_seconds{" in text
    assert 'bucketq_operator_reconciles_total{kind="Consumer",result="ok"}' in text


def test_consumer_waits_for_its_topic_and_latest_start(
    kube: Kube, shared_ns: str, shared_engine: Settings, shared_operator: RunningOperator
) -> None:
    kube.create(consumer(shared_ns, "early", topics=["later"], startPosition="latest"))
    pending = wait_for(
        lambda: (
            (o := kube.get("consumers", shared_ns, "early"))
            and condition(o, "Ready").get("reason") == "TopicNotFound"
            and o
        ),
        "Consumer early to wait for topic later",
    )
    assert pending["status"]["phase"] == "Pending"
    assert "later" in condition(pending, "Ready")["message"]
    kube.create(topic(shared_ns, "later"))
    wait_for(lambda: ready(kube, "consumers", shared_ns, "early"), "Consumer early to be Ready")


def test_consumer_deletion_policy_delete_removes_cursors(
    kube: Kube, shared_ns: str, shared_engine: Settings, s3_keys: Any, shared_operator: RunningOperator
) -> None:
    kube.create(topic(shared_ns, "jobs"))
    kube.create(consumer(shared_ns, "gone", topics=["jobs"], deletionPolicy="Delete"))
    kube.create(consumer(shared_ns, "stays", topics=["jobs"]))
    for name in ("gone", "stays"):
        wait_for(lambda n=name: ready(kube, "consumers", shared_ns, n), f"Consumer {name} to be Ready")
    prefix = f"{shared_engine.root}/{shared_ns}/"
    kube.create(topic(shared_ns, "tasks"))
    kube.patch("consumers", shared_ns, "gone", {"spec": {"topics": ["jobs", "tasks"]}})
    wait_for(lambda: ready(kube, "consumers", shared_ns, "gone", generation=2), "gone to subscribe to tasks")
    assert [k for k in s3_keys(shared_engine, prefix) if k.startswith(f"{prefix}tasks/subs/gone/")]
    kube.patch("consumers", shared_ns, "gone", {"spec": {"topics": ["jobs"]}})
    wait_for(
        lambda: not [k for k in s3_keys(shared_engine, prefix) if k.startswith(f"{prefix}tasks/subs/gone/")],
        "the cursors of the dropped topic to go (deletionPolicy Delete)",
    )
    gone_id = kube.get("consumers", shared_ns, "gone")["status"]["consumerId"]  # type: ignore[index]
    kube.delete("consumers", shared_ns, "gone")
    kube.delete("consumers", shared_ns, "stays")
    for name in ("gone", "stays"):
        wait_for(lambda n=name: kube.get("consumers", shared_ns, n) is None, f"Consumer {name} to be gone")
    keys = s3_keys(shared_engine, prefix)
    assert not [k for k in keys if k.startswith(f"{prefix}jobs/subs/gone/")], keys
    assert f"{prefix}_registry/consumers/{gone_id}.json" not in keys
    assert [k for k in keys if k.startswith(f"{prefix}jobs/subs/stays/")], "Retain keeps the cursors"


def test_a_consumers_dead_letter_policy_is_deprecated_and_never_blocks(
    kube: Kube, shared_ns: str, shared_operator: RunningOperator
) -> None:
    """Dead-letter settings are the topic's: a Consumer's policy can only repeat or contradict it."""
    kube.create(policy(shared_ns, "strict", maxDeliveries=2))
    kube.create(topic(shared_ns, "bills", deadLetterPolicy="strict"))
    kube.create(consumer(shared_ns, "plain", topics=["bills"]))
    kube.create(consumer(shared_ns, "same", topics=["bills"], deadLetterPolicy="strict"))
    # naming a policy that does not even exist: the field is ignored, the Consumer does not wait
    kube.create(consumer(shared_ns, "other", topics=["bills"], deadLetterPolicy="missing"))
    found = {
        name: wait_for(lambda n=name: ready(kube, "consumers", shared_ns, n), f"Consumer {name} to be Ready")
        for name in ("plain", "same", "other")
    }
    plain = condition(found["plain"], "DeadLetterPolicyResolved")
    assert (plain["status"], plain["reason"]) == ("True", "TopicPolicies")
    same = condition(found["same"], "DeadLetterPolicyResolved")
    assert (same["status"], same["reason"]) == ("True", "Deprecated")
    assert "deprecated and ignored" in same["message"] and "'strict'" in same["message"]
    other = condition(found["other"], "DeadLetterPolicyResolved")
    assert (other["status"], other["reason"]) == ("False", "PolicyMismatch")
    assert "deprecated and ignored" in other["message"] and "bills uses strict" in other["message"]

    def warned() -> set[str]:
        return {
            e["involvedObject"]["name"]
            for e in kube.list("events", shared_ns)
            if e.get("reason") == "DeprecatedField" and e.get("type") == "Warning"
        }

    assert wait_for(lambda: warned() == {"same", "other"} and warned(), "deprecation warning events") == {
        "same",
        "other",
    }
