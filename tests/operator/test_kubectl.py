"""The real kubectl against the emulator: apply the examples, read the printer columns, get rejected."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.operator.harness import Kube, RunningOperator, wait_for
from tests.operator.test_topics import ready
from tests.support import tools

pytestmark = pytest.mark.s3  # the operator reconciles against the moto server

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def kubectl(tmp_path: Path, kube: Kube, shared_ns: str):  # type: ignore[no-untyped-def]
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\n"
        f'clusters: [{{name: emulator, cluster: {{server: "{kube.url}"}}}}]\n'
        "users: [{name: tester, user: {}}]\n"
        f"contexts: [{{name: emulator, context: {{cluster: emulator, user: tester, namespace: {shared_ns}}}}}]\n"
        "current-context: emulator\n"
    )
    env = {**os.environ, "KUBECONFIG": str(config)}
    binary = tools.kubectl()

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([binary, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
        if check and done.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {done.stderr}")
        return done

    return run


def test_kubectl_applies_the_examples_and_shows_the_columns(
    kubectl,
    kube: Kube,
    shared_ns: str,
    shared_operator: RunningOperator,  # type: ignore[no-untyped-def]
) -> None:
    # The emulator serves no OpenAPI documents: the schema checks happen server side.
    kubectl("apply", "--validate=false", "-f", "crds/")
    out = kubectl(
        "apply",
        "--validate=false",
        "-f",
        "examples/deadletterpolicy.yaml",
        "-f",
        "examples/topic.yaml",
        "-f",
        "examples/consumer.yaml",
    ).stdout
    assert "topic.bucketq.io/orders created" in out and "consumer.bucketq.io/billing created" in out
    wait_for(lambda: ready(kube, "topics", shared_ns, "orders"), "the example Topic to be Ready")
    wait_for(lambda: ready(kube, "consumers", shared_ns, "billing"), "the example Consumer to be Ready")

    def table(kind: str, columns: int) -> list[list[str]]:
        lines = [line.split() for line in kubectl("get", kind).stdout.splitlines()]
        return lines if len(lines) == 2 and len(lines[1]) == columns else []

    header, row = wait_for(lambda: table("topics", 6), "kubectl get topics to show the backlog")
    assert header == ["NAME", "PARTITIONS", "BACKLOG", "READY", "PHASE", "AGE"]
    assert row[:5] == ["orders", "4", "0", "True", "Ready"], "READY is the Ready condition's status"
    wide = kubectl("get", "bqt", "-o", "wide").stdout
    assert "MESSAGES" in wide and "Retain" in wide
    header, row = wait_for(lambda: table("consumers", 8), "kubectl get consumers to show the figures")
    assert header == ["NAME", "TOPICS", "DELIVERY", "BACKLOG", "IN-FLIGHT", "READY", "PHASE", "AGE"]
    assert row[:3] == ["billing", '["orders"]', "push"] and row[5:7] == ["True", "Ready"]
    header, row = wait_for(lambda: table("deadletterpolicies", 6), "kubectl get deadletterpolicies")
    assert header == ["NAME", "MAX-DELIVERIES", "DROP", "READY", "PHASE", "AGE"]
    assert row[:5] == ["orders-dlp", "5", "DeadLetter", "True", "Ready"]
    assert "unchanged" in kubectl("apply", "--validate=false", "-f", "examples/topic.yaml").stdout


def test_kubectl_gets_schema_errors(
    kubectl,
    shared_ns: str,
    shared_operator: RunningOperator,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: bucketq.io/v1alpha1\nkind: Topic\nmetadata: {name: broken}\n"
        "spec: {partitions: 0, deletionPolicy: Sometimes}\n"
    )
    done = kubectl("apply", "--validate=false", "-f", str(bad), check=False)
    assert done.returncode != 0
    assert "spec.partitions" in done.stderr and "Sometimes" in done.stderr, done.stderr
    kubectl("apply", "--validate=false", "-f", "examples/topic.yaml")
    done = kubectl("patch", "topic", "orders", "--type=merge", "-p", '{"spec":{"partitions":1}}', check=False)
    assert done.returncode != 0 and "partitions may only grow" in done.stderr, done.stderr
